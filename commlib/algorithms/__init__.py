"""Allreduce algorithms: pure schedules over a :class:`~commlib.transport.base.Transport`.

The registry (:mod:`.spec`) describes each algorithm once: its entry point (one signature for all), its
many-buffer entry point, whether it folds scaling, what it requires and its cost formula (:mod:`.cost`).
``run_allreduce(ctx, buf, op, algorithm, codec)`` is the entry point for one buffer; ``auto`` asks
:mod:`.select`, which minimises the predicted time. No module here imports MPI.
"""

from __future__ import annotations

import numpy as np

from ..compression import WireCodec
from ..errors import CommlibError, ConfigError
from ..ops import ReduceOp, as_op
from ..validation import check_options
from . import select, spec
from .context import AlgorithmContext, TorusGrid
from .scaling import with_scaling_passes
from .select import Choice
from .spec import SPECS, AlgorithmSpec

#: Every concrete algorithm of host buffers, by name (the registry's view for callers that only run them;
#: the device-only ones, nccl, run on the coordinator's device path).
ALGORITHMS = {s.name: s.run for s in SPECS if not s.device}

__all__ = ["ALGORITHMS", "AlgorithmContext", "AlgorithmSpec", "Choice", "SPECS", "TorusGrid", "execute",
           "prepare", "resolve", "run_allreduce"]


def resolve(ctx: AlgorithmContext, algorithm: str, nbytes: int, codec: WireCodec | None = None,
            dtype: np.dtype | None = None) -> Choice:
    """The concrete algorithm (and segment size) ``algorithm`` stands for on a message of ``nbytes`` bytes
    of ``dtype`` travelling through ``codec``."""
    if algorithm == spec.AUTO:
        return select.choose(ctx, nbytes, codec, dtype)
    spec.get(algorithm)  # an unknown name is an error naming the choices
    return Choice(algorithm, ctx.config.ring_segment_bytes)


def prepare(ctx: AlgorithmContext, dtype: np.dtype, nbytes: int, algorithm: str = "auto",
            codec: WireCodec | None = None) -> Choice:
    """Check everything ``run_allreduce`` would reject for a buffer of ``dtype`` and ``nbytes`` bytes,
    without communicating; return the concrete algorithm that will run. Callers that scale a buffer
    first call this first."""
    check_options(dtype, codec, 1.0, 1.0, "buffer")
    choice = resolve(ctx, algorithm, nbytes, codec, dtype)
    reason = spec.get(choice.algorithm).requires(ctx, codec)
    if reason:
        raise ConfigError(reason)
    return choice


def run_allreduce(ctx: AlgorithmContext, buf: np.ndarray, op, algorithm: str = "auto",
                  codec: WireCodec | None = None) -> int:
    """Allreduce the 1-D C-contiguous ``buf`` in place on every rank; return how many values this rank
    overflowed to inf while encoding for the wire (always 0 without a codec).

    ``op`` Average reduces as Sum (the caller divides). With ``codec`` (float32 buffers only) the data
    travels as ``codec.wire_dtype`` and accumulates in float32; every rank ends with identical values,
    each exactly representable in the wire format. On one rank nothing happens, with or without a codec.
    """
    if buf.ndim != 1 or not buf.flags.c_contiguous:
        raise CommlibError(
            f"allreduce buffer must be 1-D and C-contiguous (shape: {buf.shape}, strides: {buf.strides})"
        )
    return execute(ctx, buf, as_op(op).kernel_op, prepare(ctx, buf.dtype, buf.nbytes, algorithm, codec), codec)


def execute(ctx: AlgorithmContext, buf: np.ndarray, op: ReduceOp, choice: Choice, codec: WireCodec | None,
            prescale: float = 1.0, postscale: float = 1.0) -> int:
    """Run ``choice`` (from :func:`prepare`) on ``buf`` without checking again:
    ``buf = postscale * reduce(prescale * buf)`` (the Engine's path: it validates, then executes)."""
    if ctx.size == 1 or buf.size == 0:
        return with_scaling_passes(buf, prescale, postscale, lambda: 0)
    ctx.segment_bytes = choice.segment_bytes
    return spec.BY_NAME[choice.algorithm].run(ctx, buf, op, codec, prescale=prescale, postscale=postscale)
