"""Allreduce on one node by cross-memory attach: each rank reduces its share straight out of its peers'
buffers and writes the result straight into them (see :mod:`commlib.transport.peer_memory`).

Rank r owns elements ``partition.offsets(n, p)[r:r + 2]`` of the buffers' concatenation. Per segment of
that share (``config.cma_segment_bytes``, small enough to stay in cache) it copies each peer's bytes into
scratch once, applies the prescale to every contribution, reduces them into its own buffer, applies the
postscale, and writes the finished segment into every peer, so scaling costs no pass of its own. A byte
crosses between processes twice in all (there and back), against four copies for a message through MPI's
shared memory; several buffers are handled in one pass without packing them.

Synchronisation: one allgather of buffer addresses before (every rank's input is then in place), one
allgather of (error flag, seconds spent) after (no rank returns while a peer may still write into it; a
failure anywhere becomes an error everywhere). Needs ``ctx.peer_memory``: every rank on one node, probed.

With a codec (float32 only), nothing is encoded for a wire - there is none - but the numbers are those of
compressed traffic: each contribution is rounded to the wire format (after the prescale, e.g. fp16's
division by the number of ranks) and the result is too, accumulating in float32; values that overflow
are counted for the caller's warning (on the rank that owns them, which may not be the rank that sent
them). The roundings happen on the segment while it is in cache: compression costs less here than
through the ring's codec, but it gains nothing, because on one node there is no wire to save
(docs/coordinator.md, "Compression").

Balanced shares: equal byte shares do not take equal time when the memory differs - a share of many
separately allocated tensors is slower than one of a few large ones (docs/results/design_choices.md).
For a layout seen before (same dtype, codec and buffer sizes) the
shares are moved towards equal time, from the times every rank reported for the last call
(:class:`ShareSplit`). Every rank computes the same split from the same gathered numbers. Which rank
owns a byte does not change its value: two values combine the same either way round, and with more than
two ranks the owner combines them in rank order.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from .. import kernels
from ..cache import BoundedCache
from ..errors import CommlibError, ConfigError
from ..ops import ReduceOp
from . import partition

_U64 = np.dtype(np.uint64)
_F64 = np.dtype(np.float64)

#: Layouts below this many bytes keep equal shares: their times are too short to measure reliably.
_BALANCE_MIN_BYTES = 1 << 20
#: How far each call moves the shares towards the measured equal-time split.
_BALANCE_STEP = 0.5


class ShareSplit:
    """Per layout (dtype, buffer sizes): the element offsets of the ranks' shares, moved after every call
    towards equal time. Bounded: forgets everything when it holds too many layouts."""

    def __init__(self, capacity: int = 64):
        self._offsets = BoundedCache(capacity)  # layout -> element offsets

    def offsets(self, key: tuple, total: int, ranks: int) -> list[int]:
        known = self._offsets.get(key)
        return known if known is not None else partition.offsets(total, ranks)

    def update(self, key: tuple, offsets: list[int], seconds: Sequence[float], itemsize: int) -> None:
        """Record the next split for ``key`` from this call's ``offsets`` and per-rank ``seconds``."""
        total = offsets[-1]
        if total * itemsize < _BALANCE_MIN_BYTES or min(seconds) <= 0:
            return
        sizes = [b - a for a, b in zip(offsets, offsets[1:])]
        rates = [size / sec for size, sec in zip(sizes, seconds)]
        mean_rate = sum(rates) / len(rates)
        rates = [rate if rate > 0 else mean_rate for rate in rates]  # an empty share says nothing
        target = [total * rate / sum(rates) for rate in rates]
        blended = [(1 - _BALANCE_STEP) * size + _BALANCE_STEP * want for size, want in zip(sizes, target)]
        new = [0]
        for size in blended[:-1]:
            new.append(min(total, new[-1] + int(round(size))))
        new.append(total)
        self._offsets.put(key, new)


def requires_reason(ctx, codec=None) -> str | None:
    """Why cma cannot run on this context (None: it can; on one rank it always can)."""
    if ctx.peer_memory is None and ctx.size > 1:
        return (f"the cma algorithm needs cross-memory attach between the ranks of one node: "
                f"{ctx.peer_memory_reason}; choose another algorithm")
    return None


def require(ctx) -> None:
    """Raise, saying why, when this context has no cross-memory attach to its peers."""
    if ctx.peer_memory is None:
        raise ConfigError(requires_reason(ctx) or "the cma algorithm needs cross-memory attach")


def allreduce(ctx, buf: np.ndarray, op: ReduceOp, codec=None, prescale: float = 1.0,
              postscale: float = 1.0) -> int:
    """Reduce ``buf`` in place; the ALGORITHMS entry point. Returns the codec's overflow count."""
    return allreduce_many(ctx, [buf], op, codec=codec, prescale=prescale, postscale=postscale)


def allreduce_many(ctx, bufs: Sequence[np.ndarray], op: ReduceOp, codec=None, prescale: float = 1.0,
                   postscale: float = 1.0) -> int:
    """Reduce every 1-D C-contiguous buffer of ``bufs`` (one dtype, same lengths on every rank) in place
    across the group in one pass: ``postscale * sum(prescale * x)`` for Sum, through the codec's
    rounding if there is one. Returns how many values this rank's rounding overflowed to inf."""
    require(ctx)
    peers = ctx.peer_memory
    transport = ctx.transport
    p, r = transport.size, transport.rank
    total = sum(buf.size for buf in bufs)
    if total == 0:
        return 0
    if p == 1:  # as every algorithm: one rank does not round through a codec
        if prescale * postscale != 1.0:
            for buf in bufs:
                kernels.scale_(buf, prescale * postscale)
        return 0
    dtype = bufs[0].dtype
    n = len(bufs)
    mine = np.fromiter((buf.ctypes.data for buf in bufs), _U64, n)
    every = ctx.scratch.get("cma.addresses", n * p, _U64)
    transport.allgatherv(mine, every, [n] * p)
    peer_addresses = np.delete(every.reshape(p, n), r, axis=0)
    split = ctx.cma_shares
    if split is None:
        split = ctx.cma_shares = ShareSplit()
    layout = (dtype.str, codec.name if codec is not None else "", tuple(buf.size for buf in bufs))
    offs = split.offsets(layout, total, p)
    item = dtype.itemsize
    segment = max(ctx.config.cma_segment_bytes // 64 * 64, 64)
    scratch = ctx.scratch.get("cma.segment", peers.scratch_bytes(segment, codec), np.uint8)
    failure, overflow = None, 0
    start = time.perf_counter()
    try:
        overflow = peers.allreduce_share_(bufs, peer_addresses, offs[r] * item, offs[r + 1] * item, op,
                                          prescale=prescale, postscale=postscale, codec=codec,
                                          scratch=scratch, segment=segment)
    except Exception as exc:  # noqa: BLE001 - whatever it is, every rank must hear of it, not hang
        failure = exc
    report = np.array([1.0 if failure else 0.0, time.perf_counter() - start], _F64)
    reports = ctx.scratch.get("cma.reports", 2 * p, _F64)
    transport.allgatherv(report, reports, [2] * p)
    failed = [q for q in range(p) if reports[2 * q]]
    if failed:
        where = f"on this rank: {failure}" if failure else f"on rank {failed[-1]}"
        raise CommlibError(f"cma allreduce failed {where}; the buffers hold partial results. "
                           "Set COMMLIB_CMA=0 to use MPI instead") from failure
    split.update(layout, offs, reports[1::2].tolist(), item)
    return overflow
