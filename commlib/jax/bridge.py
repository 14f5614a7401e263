"""Crossing from JAX into commlib's numpy API: directly for concrete arrays, through an ordered
``io_callback`` inside a trace (``jit``, ``scan``, ``grad``...), with a batching rule for ``vmap``.

Why an ordered ``io_callback``. Every rank must submit its collectives in the same order (or name them);
XLA may reorder, duplicate or drop an unordered callback whose result looks pure, so each crossing is an
ordered IO effect: it runs exactly once per execution, in program order, also in loop and cond bodies.
The callback runs commlib's numpy collective, which waits for the coordinator with the GIL released.

``vmap``. An ordered callback cannot be batched by JAX, so every crossing is a ``custom_vmap`` whose rule
(given by the caller) runs the collective once on the whole batch: the batch is one more axis of the
tensor that every rank contributes (all ranks must map over the same batch size).
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.experimental import io_callback
from jax._src import core as _core  # trace_state_clean: no public equivalent


def concrete(*arrays) -> bool:
    """True when no array is traced and no trace is under way (a constant or a barrier inside ``jit`` must
    still cross at run time, not once while tracing): the call can go straight to commlib."""
    return not any(isinstance(a, jax.core.Tracer) for a in arrays) and _core.trace_state_clean()


def host_arrays(arrays) -> list[np.ndarray]:
    return [np.asarray(a) for a in arrays]


def call(host: Callable[..., Sequence[np.ndarray]], results: Sequence[jax.ShapeDtypeStruct], arrays: Sequence,
         batched: Callable | None = None) -> list:
    """Run ``host(*numpy arrays) -> numpy arrays`` (one per entry of ``results``) on ``arrays``.

    Concrete arrays go straight to ``host``. Traced ones go through one ordered ``io_callback``.
    ``batched(arrays, in_batched) -> (outputs, out_batched)`` is the ``vmap`` rule (arrays that are
    batched have the batch on axis 0); None: this crossing cannot be mapped."""
    arrays = list(arrays)
    if concrete(*arrays):
        outs = host(*host_arrays(arrays))
        return [jnp.asarray(o) for o in outs]
    return list(_traced(host, tuple(results), batched)(*arrays))


def callback(host: Callable, results: Sequence[jax.ShapeDtypeStruct], arrays: Sequence) -> list:
    """One ordered crossing (no vmap rule): for use inside a batching rule."""
    if _crossing_p is not None:
        return list(_crossing_p.bind(*arrays, host=host, results=tuple(results)))

    def run(*xs):
        return tuple(host(*host_arrays(xs)))
    if not results:
        io_callback(lambda *xs: run(*xs) and None, None, *arrays, ordered=True)
        return []
    return list(io_callback(run, tuple(results), *arrays, ordered=True))


def _crossing_primitive():
    """A primitive with io_callback's ordered IO effect whose lowering hands ``host`` the numpy views XLA
    gives a Python callback. ``io_callback`` first copies each operand into a new ``jax.Array`` (its
    ``device_put``), which for a model's gradients costs as much as the allreduce on a fast link. Built
    on JAX internals (``emit_python_callback``, the ordered IO effect); where they differ, None, and the
    crossings use ``io_callback``."""
    try:
        from jax._src import callback as _callback
        from jax._src.interpreters import mlir

        effect, emit = _callback._OrderedIOEffect, _callback.emit_python_callback
    except (ImportError, AttributeError):
        return None
    p = _core.Primitive("commlib_collective")
    p.multiple_results = True

    @p.def_effectful_abstract_eval
    def _abstract(*avals, host, results):
        return [_core.ShapedArray(r.shape, r.dtype) for r in results], {effect}

    @p.def_impl
    def _impl(*arrays, host, results):
        return [jnp.asarray(o) for o in host(*host_arrays(arrays))]

    def _lower(ctx, *args, host, results):
        token = ctx.tokens_in.get(effect)
        outs, token, _ = emit(ctx, lambda *xs: tuple(host(*xs)), token, list(args), ctx.avals_in, ctx.avals_out,
                              has_side_effect=True, returns_token=True)
        ctx.set_tokens_out(ctx.tokens_in.update_tokens(mlir.TokenSet({effect: token})))
        return outs

    mlir.register_lowering(p, _lower, cacheable=False)
    return p


_crossing_p = _crossing_primitive()


def _traced(host, results, batched):
    @custom_vmap
    def crossing(*arrays):
        return tuple(callback(host, results, arrays))

    @crossing.def_vmap
    def rule(axis_size, in_batched, *arrays):
        if batched is None:
            raise NotImplementedError(f"{getattr(host, '__qualname__', host)} cannot run under jax.vmap")
        outs, out_batched = batched(list(arrays), list(in_batched))
        return tuple(outs), tuple(out_batched)

    return crossing
