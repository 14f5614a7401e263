"""Ring allreduce: reduce-scatter then allgather around a ring, 2(p-1) steps.

Cost (alpha-beta, n bytes, p ranks): 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma; bandwidth-optimal.

Rank r owns chunk r (``partition.offsets``). Reduce-scatter step k (0 <= k < p-1): send chunk r-k-1 to
the right neighbour, receive chunk r-k-2 from the left and reduce it into place; after p-1 steps chunk r
is fully reduced on rank r. Allgather step k: send chunk r-k, receive chunk r-k-1 straight into place.

Large chunks travel in segments of ``config.ring_segment_bytes`` (:func:`send_reduce_`): a step posts all
its sends and two receives into two segment-sized slots; segment i is reduced as soon as it has arrived
(while it is still in cache, and while segment i+1 is in flight), then its slot receives segment i+2.

With a codec the chunks travel encoded; received partial sums accumulate in float32; the owner encodes
its finished chunk once and keeps the decoded value, so every rank ends with identical, wire-exact values.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .. import kernels
from ..compression import WireCodec
from ..ops import ReduceOp
from ..transport.base import Transport
from . import partition

_SLOTS = 2  # receive slots per ring step: one being reduced while the next arrives


def send_reduce_(ctx, transport: Transport, outgoing: np.ndarray, dest: int, target: np.ndarray, source: int,
                 op: ReduceOp, codec: WireCodec | None = None) -> int:
    """One pipelined exchange: send ``outgoing`` to ``dest`` while receiving ``target.size`` elements from
    ``source`` and reducing them into ``target`` (``target = target op received``). ``outgoing`` and
    ``target`` must not overlap. Returns encode overflows.

    Both sides cut their messages into segments of ``config.ring_segment_bytes``; all sends are posted at
    once, receives go to ``_SLOTS`` segment-sized slots, and each segment is reduced as soon as it has
    arrived - still in cache, while the next one is in flight."""
    seg = max(1, ctx.config.ring_segment_bytes // target.itemsize)
    seg = min(seg, max(target.size, outgoing.size, 1))
    wire_dtype = target.dtype if codec is None else codec.wire_dtype
    slots = ctx.scratch.get("exchange.slots", _SLOTS * seg, wire_dtype)
    if codec is not None:
        wire_out = ctx.scratch.get("exchange.wire_out", outgoing.size, wire_dtype)
    send_segs = partition.segments(0, outgoing.size, seg)
    recv_segs = partition.segments(0, target.size, seg)

    def post_recv(i):
        a, b = recv_segs[i]
        slot = (i % _SLOTS) * seg
        return transport.irecv(slots[slot:slot + b - a], source)

    recvs = [post_recv(i) for i in range(min(_SLOTS, len(recv_segs)))]
    sends = []
    overflow = 0
    for i in range(max(len(send_segs), len(recv_segs))):
        if i < len(send_segs):
            a, b = send_segs[i]
            if codec is None:
                sends.append(transport.isend(outgoing[a:b], dest))
            else:
                overflow += codec.encode(outgoing[a:b], wire_out[a:b])
                sends.append(transport.isend(wire_out[a:b], dest))
        if i < len(recv_segs):
            a, b = recv_segs[i]
            transport.waitall([recvs[i]])
            slot = (i % _SLOTS) * seg
            if codec is None:
                kernels.reduce_(target[a:b], slots[slot:slot + b - a], op)
            else:
                codec.accumulate(target[a:b], slots[slot:slot + b - a], op)
            if i + _SLOTS < len(recv_segs):
                recvs.append(post_recv(i + _SLOTS))
    transport.waitall(sends)
    return overflow


def reduce_scatter_(ctx, transport: Transport, buf: np.ndarray, op: ReduceOp, offs: Sequence[int],
                    codec: WireCodec | None = None) -> int:
    """Reduce ``buf`` so that chunk ``[offs[r], offs[r+1])`` holds the group's reduction on rank r
    (``len(offs) == transport.size + 1``). Other chunks hold partial results. Returns encode overflows."""
    p, r = transport.size, transport.rank
    if p == 1:
        return 0
    right, left = (r + 1) % p, (r - 1) % p
    overflow = 0
    for step in range(p - 1):
        send_chunk, recv_chunk = (r - step - 1) % p, (r - step - 2) % p
        overflow += send_reduce_(ctx, transport, buf[offs[send_chunk]:offs[send_chunk + 1]], right,
                                 buf[offs[recv_chunk]:offs[recv_chunk + 1]], left, op, codec)
    return overflow


def allgather_(ctx, transport: Transport, buf: np.ndarray, offs: Sequence[int],
               codec: WireCodec | None = None) -> int:
    """Given the final chunk ``[offs[r], offs[r+1])`` on each rank r, fill in every chunk on every rank.
    With a codec the own chunk is replaced by its wire round trip (as every other rank will see it)."""
    p, r = transport.size, transport.rank
    overflow = 0
    if codec is not None:
        wire = ctx.scratch.get("ring.wire_full", offs[p] - offs[0], codec.wire_dtype)
        base = offs[0]
        own = slice(offs[r] - base, offs[r + 1] - base)
        overflow += codec.encode(buf[offs[r]:offs[r + 1]], wire[own])
        codec.decode(wire[own], buf[offs[r]:offs[r + 1]])
    if p == 1:
        return overflow
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        send_chunk, recv_chunk = (r - step) % p, (r - step - 1) % p
        s, e = offs[send_chunk], offs[send_chunk + 1]
        rs, re = offs[recv_chunk], offs[recv_chunk + 1]
        if codec is None:
            transport.sendrecv(buf[s:e], right, buf[rs:re], left)
        else:
            transport.sendrecv(wire[s - base:e - base], right, wire[rs - base:re - base], left)
            codec.decode(wire[rs - base:re - base], buf[rs:re])
    return overflow


def allreduce(ctx, buf: np.ndarray, op: ReduceOp, codec: WireCodec | None = None,
              transport: Transport | None = None) -> int:
    """Ring allreduce of ``buf`` in place over ``transport`` (default: the context's)."""
    transport = transport or ctx.transport
    if transport.size == 1 or buf.size == 0:
        return 0
    offs = partition.offsets(buf.size, transport.size)
    overflow = reduce_scatter_(ctx, transport, buf, op, offs, codec)
    return overflow + allgather_(ctx, transport, buf, offs, codec)
