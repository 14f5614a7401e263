"""optax wrappers: average the gradient pytree over ranks (``DistributedOptimizer``,
``distributed_gradients``) or average the parameters every few steps (``LocalSGD``).

Each is an ``optax.GradientTransformation`` and runs inside the user's jitted step: the whole gradient
pytree crosses into commlib as one grouped allreduce (fused by the coordinator), in program order.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ..compression import Compression
from ..ops import Average
from .collectives import reduce_op, set_size, grouped_allreduce, overlapped_allreduce

try:
    import optax
except ImportError as _exc:
    raise ImportError("commlib.jax's optimizers need optax: pip install 'commlib[jax]' or pip install optax "
                      f"({_exc})") from _exc


def distributed_gradients(op=Average, compression=Compression.none, gradient_predivide_factor: float = 1.0,
                          name: str = "DistributedOptimizer", process_set=None,
                          overlap: bool = True) -> optax.GradientTransformation:
    """An optax transformation that replaces the updates (the gradients, when first in a chain) with their
    reduction over ranks (``op``: Average by default), as one grouped allreduce named ``name.0``,
    ``name.1``, ... in leaf order. Put it first in an ``optax.chain``.

    ``compression``: ``Compression.fp16``/``.bf16`` on the wire, or a lossy compressor
    (``Compression.topk(0.01)``, ``.powersgd(...)``...; its per-tensor state lives in the compressor object
    on the host, keyed by the names above: create one per model and keep it). ``gradient_predivide_factor``
    f (Average only): scale by 1/f before the sum and by f/size after it.

    ``overlap`` (default True; with no compression or ``Compression.fp16``/``.bf16``): inside ``jit`` each
    gradient's allreduce starts as soon as XLA has computed it and the step waits for all of them once,
    so communication overlaps the rest of the backward pass (:func:`commlib.jax.overlapped_allreduce`).
    False, or a lossy compressor: the pytree crosses as one grouped allreduce after the backward pass."""
    op = reduce_op(op)
    f = float(gradient_predivide_factor)
    if f != 1.0 and op is not Average:
        raise ValueError(f"gradient_predivide_factor={f} needs op=Average (got op={op.name}); it splits the "
                         "averaging before and after the sum")
    if f != 1.0:
        from ..ops import Sum
        kwargs = dict(op=Sum, prescale_factor=1.0 / f, postscale_factor=f / set_size(process_set))
    else:
        kwargs = dict(op=op)

    def init(params):
        del params
        return optax.EmptyState()

    def update(updates, state, params=None):
        del params
        reduce = overlapped_allreduce if overlap else grouped_allreduce
        return reduce(updates, name=name, compression=compression, process_set=process_set, **kwargs), state

    return optax.GradientTransformation(init, update)


def DistributedOptimizer(optimizer: optax.GradientTransformation, op=Average, compression=Compression.none,
                         backward_passes_per_step: int = 1, gradient_predivide_factor: float = 1.0,
                         name: str = "DistributedOptimizer", process_set=None,
                         overlap: bool = True) -> optax.GradientTransformation:
    """Wrap ``optimizer`` (an optax ``GradientTransformation``) so that it sees gradients averaged over ranks.

    ``backward_passes_per_step`` k > 1: gradients are accumulated locally (their mean over the k calls,
    as ``optax.MultiSteps``) and communicated and applied every k-th ``update``; the other calls return
    zero updates. Other arguments as :func:`distributed_gradients`.

    Example::

        tx = cj.DistributedOptimizer(optax.adam(1e-3))
        params = cj.broadcast_parameters(params, root_rank=0)
        opt_state = tx.init(params)

        @jax.jit
        def step(params, opt_state, batch):
            grads = jax.grad(loss)(params, batch)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state
    """
    k = backward_passes_per_step
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"backward_passes_per_step must be a positive integer, got {k!r}")
    chain = optax.chain(distributed_gradients(op, compression, gradient_predivide_factor, name, process_set, overlap),
                        optimizer)
    if int(k) == 1:
        return chain
    return optax.MultiSteps(chain, every_k_schedule=int(k)).gradient_transformation()


class LocalSGDState(NamedTuple):
    inner: optax.OptState
    count: jax.Array  # updates since the start


def LocalSGD(optimizer: optax.GradientTransformation, period: int, warmup_steps: int = 0,
             name: str = "LocalSGD", process_set=None) -> optax.GradientTransformation:
    """Local SGD (post-local SGD): step ``optimizer`` on local gradients, and every ``period``-th update
    (after ``warmup_steps`` updates, during which parameters are averaged at every step) return the update
    that takes the parameters to their average over ranks. Needs ``params`` in ``update``.

    The update on an averaging step is ``mean(params + u) - params`` (u: the local update), so after
    ``optax.apply_updates`` ranks agree up to one rounding of that sum."""
    if int(period) != period or period < 1:
        raise ValueError(f"period must be a positive integer, got {period!r}")
    if int(warmup_steps) != warmup_steps or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be a non-negative integer, got {warmup_steps!r}")
    period, warmup = int(period), int(warmup_steps)

    def init(params):
        return LocalSGDState(optimizer.init(params), jnp.zeros([], jnp.int32))

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("LocalSGD averages parameters: pass params to update(grads, state, params)")
        local, inner = optimizer.update(updates, state.inner, params)
        count = state.count + 1

        def average(local):
            moved = jax.tree_util.tree_map(lambda p, u: (p + u).astype(p.dtype), params, local)
            mean = grouped_allreduce(moved, op=Average, name=name, process_set=process_set)
            return jax.tree_util.tree_map(lambda m, p: (m - p).astype(p.dtype), mean, params)

        due = (count <= warmup) | ((count - warmup) % period == 0)
        return jax.lax.cond(due, average, lambda local: local, local), LocalSGDState(inner, count)

    return optax.GradientTransformation(init, update)
