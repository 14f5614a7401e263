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
              key: str) -> int:
        """Even ranks below 2*rem send their buffer to rank+1, which reduces it in."""
        if self.rank >= 2 * self.rem:
            return 0
        overflow = 0
        if self.newrank < 0:
            if codec is None:
                transport.send(buf, self.rank + 1)
            else:
                wire = ctx.scratch.get(key + ".wire", buf.size, codec.wire_dtype)
                overflow += codec.encode(buf, wire)
                transport.send(wire, self.rank + 1)
        elif codec is None:
            tmp = ctx.scratch.get(key + ".recv", buf.size, buf.dtype)
            transport.recv(tmp, self.rank - 1)
            kernels.reduce_(buf, tmp, op)
        else:
            wire = ctx.scratch.get(key + ".wire", buf.size, codec.wire_dtype)
            transport.recv(wire, self.rank - 1)
            codec.accumulate(buf, wire, op)
        return overflow

    def unfold_(self, transport: Transport, buf: np.ndarray, wire: np.ndarray | None,
                codec: WireCodec | None) -> None:
        """Odd ranks below 2*rem return the result to rank-1. With a codec the result travels as
        ``wire`` (which must hold the wire form of ``buf``) and is decoded on arrival."""
        if self.rank >= 2 * self.rem:
            return
        outgoing = buf if codec is None else wire
        if self.newrank >= 0:
            transport.send(outgoing, self.rank - 1)
        else:
            transport.recv(outgoing, self.rank + 1)
            if codec is not None:
                codec.decode(wire, buf)


def allreduce(ctx, buf: np.ndarray, op: ReduceOp, codec: WireCodec | None = None,
              transport: Transport | None = None) -> int:
    """Recursive-doubling allreduce of ``buf`` in place over ``transport`` (default: the context's)."""
    transport = transport or ctx.transport
    p = transport.size
    if p == 1 or buf.size == 0:
        return 0
    fold = Fold(p, transport.rank)
    overflow = fold.fold_(ctx, transport, buf, op, codec, "rd")
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
                transport.sendrecv(buf, partner, incoming, partner)
                kernels.reduce_(buf, incoming, op)
            else:
                overflow += codec.encode(buf, wire)
                codec.decode(wire, buf)  # reduce what the partner sees of us: identical on both sides
                transport.sendrecv(wire, partner, incoming, partner)
                codec.accumulate(buf, incoming, op)
            mask <<= 1
        if codec is not None:
            overflow += codec.encode(buf, wire)
            codec.decode(wire, buf)
    fold.unfold_(transport, buf, wire, codec)
    return overflow
