"""The transport's own allreduce (MPI_Allreduce). Cost: whatever the MPI library does; here (MPICH,
shared memory) it is latency-competitive for small messages but reallocates scratch on every call."""

from __future__ import annotations

import numpy as np

from ..compression import WireCodec
from ..errors import ConfigError
from ..ops import ReduceOp


def requires(ctx, codec: WireCodec | None) -> str | None:
    """Why native cannot run with ``codec`` (None: it can)."""
    if codec is None:
        return None
    return (f"algorithm 'native' cannot use {codec!r}: MPI reduces the data itself, so it cannot accumulate "
            "a half-precision wire format in float32; use algorithm 'ring', 'recursive_doubling', "
            "'rabenseifner', 'hierarchical', 'torus2d' or 'auto'")


def allreduce(ctx, buf: np.ndarray, op: ReduceOp, codec: WireCodec | None = None, transport=None) -> int:
    reason = requires(ctx, codec)
    if reason:
        raise ConfigError(reason)
    transport = transport or ctx.transport
    if transport.size > 1 and buf.size:
        transport.allreduce_native_(buf, op)
    return 0
