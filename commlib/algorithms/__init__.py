"""Allreduce algorithms: pure schedules over a :class:`~commlib.transport.base.Transport`.

``run_allreduce(ctx, buf, op, algorithm, codec)`` is the entry point; ``ALGORITHMS`` maps each public name
(``config.ALGORITHMS`` minus ``auto``) to a function ``allreduce(ctx, buf, op, codec) -> overflow count``.
No module here imports MPI.
"""

from __future__ import annotations

import numpy as np

from .. import validation
from ..compression import WireCodec
from ..config import ALGORITHMS as ALGORITHM_NAMES
from ..errors import CommlibError, ConfigError
from ..ops import ReduceOp, as_op
from ..validation import check_options
from . import cma, hierarchical, native, rabenseifner, recursive_doubling, ring, ring_many, select, torus2d
from .context import AlgorithmContext, TorusGrid

ALGORITHMS = {
    "native": native.allreduce,
    "ring": ring.allreduce,
    "recursive_doubling": recursive_doubling.allreduce,
    "rabenseifner": rabenseifner.allreduce,
    "hierarchical": hierarchical.allreduce,
    "torus2d": torus2d.allreduce,
    "cma": cma.allreduce,
}
assert set(ALGORITHMS) | {"auto"} == set(ALGORITHM_NAMES)

__all__ = ["ALGORITHMS", "AlgorithmContext", "TorusGrid", "execute", "prepare", "resolve", "run_allreduce"]


def resolve(ctx: AlgorithmContext, algorithm: str, nbytes: int, compressed: bool = False) -> str:
    """The concrete algorithm ``algorithm`` stands for on a message of ``nbytes`` bytes (``compressed``:
    it will travel through a codec)."""
    if algorithm not in ALGORITHM_NAMES:
        raise ConfigError(validation.algorithm(algorithm))
    return select.choose(ctx, nbytes, compressed) if algorithm == "auto" else algorithm


def prepare(ctx: AlgorithmContext, dtype: np.dtype, nbytes: int, algorithm: str = "auto",
            codec: WireCodec | None = None) -> str:
    """Check everything ``run_allreduce`` would reject for a buffer of ``dtype`` and ``nbytes`` bytes,
    without communicating; return the concrete algorithm that will run. Callers that scale a buffer
    first call this first."""
    check_options(dtype, codec, 1.0, 1.0, "buffer")
    name = resolve(ctx, algorithm, nbytes, codec is not None)
    if name == "native" and codec is not None:
        native.allreduce(ctx, np.empty(0, dtype), ReduceOp.SUM, codec)  # raises the explanation
    if name == "cma" and ctx.size > 1:
        cma.require(ctx)
    if name == "torus2d":
        ctx.torus()  # a bad COMMLIB_TORUS_SHAPE is an error on any number of ranks
    return name


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


def execute(ctx: AlgorithmContext, buf: np.ndarray, op: ReduceOp, name: str, codec: WireCodec | None) -> int:
    """Run the concrete algorithm ``name`` returned by :func:`prepare` for ``buf``, without checking again
    (the Engine's path: it validates, scales, then executes)."""
    if ctx.size == 1 or buf.size == 0:
        return 0
    return ALGORITHMS[name](ctx, buf, op, codec)
