"""Allreduce on one node by cross-memory attach: each rank reduces its share straight out of its peers'
buffers and writes the result straight into them (see :mod:`commlib.transport.peer_memory`).

Rank r owns elements ``partition.offsets(n, p)[r:r + 2]`` of the buffers' concatenation. Per segment of
that share (``config.cma_segment_bytes``, small enough to stay in cache) it copies each peer's bytes into scratch
once, reduces them into its own buffer, applies the postscale, and writes the finished segment into
every peer. A byte crosses between processes twice in all (there and back), against four copies for a
message through MPI's shared memory; several buffers are handled in one pass without packing them.

Synchronisation: one allgather of buffer addresses before (every rank's input is then in place), one
allreduce of an error flag after (no rank returns while a peer may still write into it; a failure
anywhere becomes an error everywhere). Needs ``ctx.peer_memory``: every rank on one node, probed.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .. import kernels
from ..errors import CommlibError, ConfigError
from ..ops import ReduceOp
from . import partition

_U64 = np.dtype(np.uint64)
_I32 = np.dtype(np.int32)


def available(ctx) -> bool:
    return ctx.peer_memory is not None


def allreduce(ctx, buf: np.ndarray, op: ReduceOp, codec=None, prescale: float = 1.0,
              postscale: float = 1.0) -> int:
    """Reduce ``buf`` in place; the ALGORITHMS entry point (no codec: nothing travels on a wire)."""
    if codec is not None:
        raise ConfigError("the cma algorithm moves memory between processes and has no wire to compress; "
                           "use compression=none with it, or another algorithm")
    if prescale != 1.0:
        kernels.scale_(buf, prescale)
    allreduce_many(ctx, [buf], op, postscale)
    return 0


def allreduce_many(ctx, bufs: Sequence[np.ndarray], op: ReduceOp, postscale: float = 1.0) -> None:
    """Reduce every 1-D C-contiguous buffer of ``bufs`` (one dtype, same lengths on every rank) in place
    across the group in one pass, then multiply by ``postscale``."""
    peers = ctx.peer_memory
    if peers is None:
        raise ConfigError(f"the cma algorithm needs cross-memory attach between the ranks of one node: "
                           f"{ctx.peer_memory_reason}; choose another algorithm")
    transport = ctx.transport
    p, r = transport.size, transport.rank
    total = sum(buf.size for buf in bufs)
    if total == 0:
        return
    if p == 1:
        if postscale != 1.0:
            for buf in bufs:
                kernels.scale_(buf, postscale)
        return
    dtype = bufs[0].dtype
    n = len(bufs)
    mine = np.fromiter((buf.ctypes.data for buf in bufs), _U64, n)
    every = ctx.scratch.get("cma.addresses", n * p, _U64)
    transport.allgatherv(mine, every, [n] * p)
    peer_addresses = np.delete(every.reshape(p, n), r, axis=0)
    offs = partition.offsets(total, p)
    item = dtype.itemsize
    scratch = ctx.scratch.get("cma.segment", max(ctx.config.cma_segment_bytes // item, 1), dtype)
    failure = None
    try:
        peers.allreduce_share_(bufs, peer_addresses, offs[r] * item, offs[r + 1] * item, op, postscale,
                               scratch)
    except Exception as exc:  # noqa: BLE001 - whatever it is, every rank must hear of it, not hang
        failure = exc
    failed = np.array([r + 1 if failure else 0], _I32)  # the highest failing rank, plus one
    transport.allreduce_native_(failed, ReduceOp.MAX)
    if failed[0]:
        where = f"on this rank: {failure}" if failure else f"on rank {failed[0] - 1}"
        raise CommlibError(f"cma allreduce failed {where}; the buffers hold partial results. "
                           "Set COMMLIB_CMA=0 to use MPI instead") from failure
