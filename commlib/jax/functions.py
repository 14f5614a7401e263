"""Bringing every rank to the same starting point: parameter pytrees and Python objects."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import api as _cl
from .collectives import set_kwargs


def broadcast_object(obj=None, root_rank: int = 0, name: str | None = None, process_set=None):
    """Return ``root_rank``'s picklable ``obj`` on every rank (eagerly; not inside ``jit``)."""
    return _cl.broadcast_object(obj, root_rank=root_rank, name=name, **set_kwargs(process_set))


def allgather_object(obj, name: str | None = None, process_set=None) -> list:
    """Return the list of every rank's picklable ``obj``, in rank order (eagerly; not inside ``jit``)."""
    return _cl.allgather_object(obj, name=name, **set_kwargs(process_set))


def broadcast_parameters(params, root_rank: int = 0, name: str = "broadcast_parameters", process_set=None):
    """Return the pytree ``params`` (Flax variables, an optax state, any arrays) with ``root_rank``'s
    values on every rank. The tree structure, shapes and dtypes must agree between ranks; a rank whose
    differ fails on every rank, naming the leaf. Leaves that are not arrays (Python numbers) come back as
    the root's too. Eagerly, the leaves travel as concurrent broadcasts (the coordinator batches them).

    Example::

        params = cj.broadcast_parameters(model.init(key, x), root_rank=0)
    """
    leaves, treedef = jax.tree_util.tree_flatten(params)
    handles = []
    for i, leaf in enumerate(leaves):
        array = np.array(leaf, copy=True, order="C")
        handles.append((array, _cl.broadcast_async_(array, root_rank, name=f"{name}.{i}",
                                                    **set_kwargs(process_set))))
    out = []
    for leaf, (array, handle) in zip(leaves, handles):
        _cl.synchronize(handle)
        if isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
            out.append(jnp.asarray(array, dtype=getattr(leaf, "dtype", None)))
        else:  # a Python scalar stays a Python scalar
            out.append(type(leaf)(array.item()) if array.ndim == 0 else array)
    return jax.tree_util.tree_unflatten(treedef, out)
