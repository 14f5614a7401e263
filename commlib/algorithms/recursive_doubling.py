"""Recursive doubling: log2(p) exchanges of the whole buffer; latency-optimal for small messages.

Cost: (log2 p' + 2 [p not a power of two]) alpha + (log2 p') n beta + (log2 p') n gamma, p' = 2^floor(log2 p).

Any p (MPICH's scheme): with p' the largest power of two <= p and rem = p - p', the first 2*rem ranks pair
up; each even one hands its buffer to the odd one next to it and sits out ("fold"). The p' remaining ranks
exchange and reduce with the partner at distance 1, 2, 4, ...; then each odd rank returns the result to its
even neighbour ("unfold"). Both partners of an exchange compute ``a op b`` on identical operands, so every
rank ends with bitwise identical values.

With a codec every rank quantizes its own buffer to the wire format before each exchange (exactly what
its partner receives), so both sides still reduce identical operands; the result is wire-exact.
"""

from __future__ import annotations

import numpy as np

from .. import kernels
from ..compression import WireCodec
from ..ops import ReduceOp
from ..transport.base import Transport
from . import ring
from .scaling import with_scaling_passes


class Fold:
    """The non-power-of-two fold: which ranks sit out and how ranks map to the power-of-two group."""

    def __init__(self, size: int, rank: int):
        self.pof2 = 1 << (size.bit_length() - 1)
        self.rem = size - self.pof2
        if rank < 2 * self.rem:
            self.newrank = -1 if rank % 2 == 0 else rank // 2
        else:
            self.newrank = rank - self.rem
        self.rank = rank

    def real(self, newrank: int) -> int:
        """The rank of the group member ``newrank`` of the power-of-two group."""
        return newrank * 2 + 1 if newrank < self.rem else newrank + self.rem

    def fold_(self, ctx, transport: Transport, buf: np.ndarray, op: ReduceOp, codec: WireCodec | None,
              key: str, prescale: float = 1.0) -> int:
        """Even ranks below 2*rem send their buffer to rank+1, which reduces it in. With a codec
        ``prescale`` multiplies this rank's data in the same passes (encode, accumulate): a rank that folded
        holds scaled data afterwards (see :meth:`pending_scale`)."""
        if self.rank >= 2 * self.rem:
            return 0
        overflow = 0
        if self.newrank < 0:
            if codec is None:
                transport.send(buf, self.rank + 1)
            else:
                wire = ctx.scratch.get(key + ".wire", buf.size, codec.wire_dtype)
                overflow += codec.encode(buf, wire, prescale)
                transport.send(wire, self.rank + 1)
        elif codec is None:
            tmp = ctx.scratch.get(key + ".recv", buf.size, buf.dtype)
            transport.recv(tmp, self.rank - 1)
            kernels.reduce_(buf, tmp, op)
        else:
            wire = ctx.scratch.get(key + ".wire", buf.size, codec.wire_dtype)
            transport.recv(wire, self.rank - 1)
            codec.accumulate(buf, wire, op, prescale)
        return overflow

    def pending_scale(self, prescale: float) -> float:
        """The prescale still to apply to this rank's buffer after :meth:`fold_` applied it or not."""
        return 1.0 if self.rank < 2 * self.rem else prescale

    def unfold_(self, transport: Transport, buf: np.ndarray, wire: np.ndarray | None,
                codec: WireCodec | None, postscale: float = 1.0) -> None:
        """Odd ranks below 2*rem return the result to rank-1. With a codec the result travels as
        ``wire`` (which must hold the wire form of ``buf``) and is decoded on arrival, times ``postscale``
        (the sender's ``buf`` must already hold ``float32(wire) * postscale``)."""
        if self.rank >= 2 * self.rem:
            return
        outgoing = buf if codec is None else wire
        if self.newrank >= 0:
            transport.send(outgoing, self.rank - 1)
        else:
            transport.recv(outgoing, self.rank + 1)
            if codec is not None:
                codec.decode(wire, buf, postscale)


def allreduce(ctx, buf: np.ndarray, op: ReduceOp, codec: WireCodec | None = None,
              transport: Transport | None = None, *, prescale: float = 1.0, postscale: float = 1.0) -> int:
    """Recursive-doubling allreduce of ``buf`` in place over ``transport`` (default: the context's):
    ``buf = postscale * reduce(prescale * buf)``. With a codec the scaling rides on the wire round trips
    (the first one multiplies by ``prescale``, the last one and the unfold's decode by ``postscale``);
    without one, or on one rank, it is a pass over ``buf``."""
    transport = transport or ctx.transport
    p = transport.size
    if p == 1 or buf.size == 0 or codec is None:
        return with_scaling_passes(buf, prescale, postscale, lambda: 0 if p == 1 or buf.size == 0 else
                                   _allreduce(ctx, transport, buf, op, None, 1.0, 1.0))
    return _allreduce(ctx, transport, buf, op, codec, prescale, postscale)


def _allreduce(ctx, transport: Transport, buf: np.ndarray, op: ReduceOp, codec: WireCodec | None,
               prescale: float, postscale: float) -> int:
    fold = Fold(transport.size, transport.rank)
    overflow = fold.fold_(ctx, transport, buf, op, codec, "rd", prescale)
    pending = fold.pending_scale(prescale)
    wire = None
    if codec is not None:
        wire = ctx.scratch.get("rd.wire", buf.size, codec.wire_dtype)
        incoming = ctx.scratch.get("rd.wire_in", buf.size, codec.wire_dtype)
    else:
        incoming = ctx.scratch.get("rd.recv", buf.size, buf.dtype)
    if fold.newrank >= 0:
        mask = 1
        while mask < fold.pof2:
            partner = fold.real(fold.newrank ^ mask)
            if codec is None:
                ring.sendrecv_(ctx, transport, buf, partner, incoming, partner)
                kernels.reduce_(buf, incoming, op)
            else:
                # reduce what the partner sees of us: identical on both sides
                overflow += codec.round_trip(buf, wire, pending)
                pending = 1.0
                ring.sendrecv_(ctx, transport, wire, partner, incoming, partner)
                codec.accumulate(buf, incoming, op)
            mask <<= 1
        if codec is not None:
            overflow += codec.round_trip(buf, wire, 1.0, postscale)
    fold.unfold_(transport, buf, wire, codec, postscale)
    return overflow
