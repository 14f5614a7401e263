"""Rabenseifner: recursive-halving reduce-scatter, then recursive-doubling allgather.

Cost: 2 log2(p') alpha + 2 (p'-1)/p' n beta + (p'-1)/p' n gamma (+ one alpha and n beta each way for the
fold when p is not a power of two, p' = 2^floor(log2 p)). Bandwidth-optimal with logarithmic latency.

Any p and any count: the fold/unfold of :mod:`recursive_doubling` reduces p to p', the buffer is cut into
p' blocks (``partition.offsets``, uneven allowed). At distance p'/2, p'/4, ..., 1 each rank keeps the half
of its current block window that contains its own block, sends the other half to its partner and reduces
the partner's copy of the kept half; it ends with its own block reduced. The allgather reverses the
pattern, doubling the window each step. With a codec the reduce-scatter sends encoded halves, the owner
encodes its finished block once (keeping the decoded value), and the allgather moves wire data only.
"""

from __future__ import annotations

import numpy as np

from ..compression import WireCodec
from ..ops import ReduceOp
from ..transport.base import Transport
from . import partition, ring
from .recursive_doubling import Fold
from .scaling import with_scaling_passes


def allreduce(ctx, buf: np.ndarray, op: ReduceOp, codec: WireCodec | None = None,
              transport: Transport | None = None, *, prescale: float = 1.0, postscale: float = 1.0) -> int:
    """Rabenseifner allreduce of ``buf`` in place over ``transport`` (default: the context's):
    ``buf = postscale * reduce(prescale * buf)``. With a codec the scaling rides on the passes made anyway
    (the fold and the first halving step encode and accumulate with ``prescale``, the owner's round trip
    and every decode multiply by ``postscale``); without one, or on one rank, it is a pass over ``buf``."""
    transport = transport or ctx.transport
    p, n = transport.size, buf.size
    if p == 1 or n == 0 or codec is None:
        return with_scaling_passes(buf, prescale, postscale, lambda: 0 if p == 1 or n == 0 else
                                   _allreduce(ctx, transport, buf, op, None, 1.0, 1.0))
    return _allreduce(ctx, transport, buf, op, codec, prescale, postscale)


def _allreduce(ctx, transport: Transport, buf: np.ndarray, op: ReduceOp, codec: WireCodec | None,
               prescale: float, postscale: float) -> int:
    n = buf.size
    fold = Fold(transport.size, transport.rank)
    overflow = fold.fold_(ctx, transport, buf, op, codec, "rab", prescale)
    pending = fold.pending_scale(prescale)  # after the first halving step all data kept is scaled
    wire = None if codec is None else ctx.scratch.get("rab.wire_full", n, codec.wire_dtype)
    me = fold.newrank
    if me >= 0:
        offs = partition.offsets(n, fold.pof2)
        lo, hi = 0, fold.pof2  # window of blocks this rank is still responsible for
        mask = fold.pof2 >> 1
        while mask:
            partner = fold.real(me ^ mask)
            mid = lo + mask
            keep, give = ((mid, hi), (lo, mid)) if me & mask else ((lo, mid), (mid, hi))
            ks, ke = offs[keep[0]], offs[keep[1]]
            gs, ge = offs[give[0]], offs[give[1]]
            overflow += ring.send_reduce_(ctx, transport, buf[gs:ge], partner, buf[ks:ke], partner, op, codec,
                                          scale=pending, dst_scale=pending)
            pending = 1.0
            lo, hi = keep
            mask >>= 1
        if codec is not None:
            own = slice(offs[me], offs[me + 1])
            overflow += codec.round_trip(buf[own], wire[own], 1.0, postscale)
        target = buf if codec is None else wire
        mask = 1
        while mask < fold.pof2:
            peer = me ^ mask
            mine, theirs = (me // mask) * mask, (peer // mask) * mask
            ms, me_ = offs[mine], offs[mine + mask]
            ts, te = offs[theirs], offs[theirs + mask]
            ring.sendrecv_(ctx, transport, target[ms:me_], fold.real(peer), target[ts:te], fold.real(peer))
            if codec is not None:
                codec.decode(wire[ts:te], buf[ts:te], postscale)
            mask <<= 1
    fold.unfold_(transport, buf, wire, codec, postscale)
    return overflow
