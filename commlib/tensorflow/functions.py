"""Bringing every rank to the same starting point: variables and Python objects."""

from __future__ import annotations

import tensorflow as tf

import commlib as _cl

from ..frameworks import set_kwargs
from . import mpi_ops as M


def broadcast_variables(variables, root_rank: int, process_set=_cl.global_process_set, inplace=False):
    """Overwrite ``variables`` on every rank with ``root_rank``'s values (one collective for all).

    Eagerly it returns None; in a graph it returns the op that assigns them."""
    variables = list(variables)
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    values = M.grouped_broadcast_op([v.read_value() if hasattr(v, "read_value") else v for v in variables],
                                  int(root_rank), None, process_set)
    assigns = [v.assign(x) for v, x in zip(variables, values)]
    return None if tf.executing_eagerly() else tf.group(*assigns)


def broadcast_global_variables(root_rank: int):
    """TF1 graphs: the op that broadcasts every global variable from ``root_rank``. Eagerly there are no
    global variables: a RuntimeError says to call :func:`broadcast_variables` with the model's."""
    if tf.executing_eagerly():
        raise RuntimeError("broadcast_global_variables() does not support eager execution; use "
                           "broadcast_variables(model.variables + optimizer.variables, root_rank)")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_object(obj=None, root_rank: int = 0, session=None, name=None, process_set=_cl.global_process_set):
    """Return ``root_rank``'s picklable ``obj`` on every rank (eagerly or not: it is not a graph op)."""
    return _cl.broadcast_object(obj, root_rank=root_rank, name=name, **set_kwargs(process_set))


def broadcast_object_fn(root_rank: int = 0, session=None, name=None, process_set=_cl.global_process_set):
    """A function ``fn(obj)`` that broadcasts ``obj`` from ``root_rank`` (Horovod's graph-mode helper)."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj, session=None, name=None, process_set=_cl.global_process_set) -> list:
    """Every rank's picklable ``obj``, in rank order."""
    return _cl.allgather_object(obj, name=name, **set_kwargs(process_set))
