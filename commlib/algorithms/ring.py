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
In :func:`allreduce` the last reduce-scatter step and the first allgather step run as one loop over
segments (:func:`_finish_and_share`): each segment of the own chunk is accumulated, encoded for the
allgather and replaced by its decoded value in one pass (``accumulate_round_trip``) and sent on at once.
All ranks do the same work per segment and exchange with one ``Sendrecv`` per stream, so they stay in
lockstep and MPI copies slot to slot in cache. Codec segments are ``ring_segment_bytes / 16`` elements
(the loop's working set is 20 bytes per element). Elsewhere encoded segments go to two segment-sized send
slots, reused as soon as their send has completed.

Scaling with a codec (``prescale``/``postscale`` of :func:`allreduce`, the Engine's fp16 pre-divide) costs
no pass of its own: in the reduce-scatter every element of this rank's data is either sent raw exactly
once (at step 0, encoded with ``scale=prescale``) or received-into exactly once while still raw (every step
accumulates with ``dst_scale=prescale``); in the allgather the owner's wire round trip and every decode
multiply by ``postscale``. The results are bit for bit those of separate scaling passes.

Per rank on 2 ranks (N float32 elements, chunk N/2), memory passes with fp16: encode the outgoing chunk
(read 2N bytes), finish the own chunk (read and write 2N), decode the received chunk (write 2N), plus MPI's
copies of N bytes of wire data each way, which stay in cache. Without a codec: MPI's copies of 2N bytes
each way through shared memory (from and to the buffers), one reduce pass (read and write 2N).
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
_SEND_SLOTS = 2  # encoded outgoing segments in flight; a slot is reused once its send has completed


# With a codec a segment has ring_segment_bytes / 16 elements: one step of _finish_and_share touches three
# float32 segments and four wire slots, 20 bytes per element, so at the default 1 MiB this working set
# (1.25 MiB) stays in a 2 MiB L2. Measured on the 2-core VM, 64 MiB fp16 on 2 ranks: 64K elements per
# segment was 10% faster than 256K (the float32 path's 1 MiB), and not slower than 16K-32K.
_CODEC_SEGMENT_DIVISOR = 16


def segment_elements(ctx, count: int, itemsize: int) -> int:
    """Elements per segment: ``ctx.segment_bytes`` of data (``config.ring_segment_bytes`` unless ``auto``
    chose another; ``itemsize`` 0: a codec's segment), at
    most ``count``. Sender and receiver must cut a message alike: ``count`` must be at least the size of
    every message of the exchange (then a message is either one segment or cut at the configured size)."""
    per = ctx.segment_bytes // (itemsize or _CODEC_SEGMENT_DIVISOR)
    return min(max(1, per), max(count, 1))


def exchange_segments(ctx, transport: Transport, nsend: int, dest: int, nrecv: int, source: int, seg: int,
              dtype: np.dtype, fill, drain, recv_into: np.ndarray | None = None,
              send_slots: bool = False, send_segs=None, recv_segs=None) -> None:
    """Send ``nsend`` elements to ``dest`` while receiving ``nrecv`` from ``source``, in segments of ``seg``.

    ``fill(a, b, slot)`` returns what to send for elements ``[a, b)``: a view of existing data, or ``slot``
    (``send_slots=True``: a segment-sized scratch array it wrote into; otherwise None). ``drain(a, b,
    received)`` consumes elements ``[a, b)`` once they have arrived. Receives go to ``recv_into[a:b]``, or
    else to ``_SLOTS`` rotating segment-sized slots. Sends are posted as segments are filled; receives
    ``_SLOTS`` ahead; each segment is drained as soon as it has arrived, still in cache, while the next
    one is in flight. ``send_segs``/``recv_segs`` replace the even cut by explicit ranges of at most
    ``seg`` elements (both sides must cut alike)."""
    send_segs = send_segs or partition.segments(0, nsend, seg)
    recv_segs = recv_segs or partition.segments(0, nrecv, seg)
    slots = ctx.scratch.get("exchange.slots", _SLOTS * seg, dtype) if recv_into is None else None
    out_slots = ctx.scratch.get("exchange.send_slots", _SEND_SLOTS * seg, dtype) if send_slots else None

    def post_recv(i):
        a, b = recv_segs[i]
        if recv_into is not None:
            return transport.irecv(recv_into[a:b], source)
        slot = (i % _SLOTS) * seg
        return transport.irecv(slots[slot:slot + b - a], source)

    recvs = [post_recv(i) for i in range(min(_SLOTS, len(recv_segs)))]
    sends = []
    for i in range(max(len(send_segs), len(recv_segs))):
        if i < len(send_segs):
            a, b = send_segs[i]
            slot = None
            if out_slots is not None:
                if i >= _SEND_SLOTS:
                    transport.waitall([sends[i - _SEND_SLOTS]])
                start = (i % _SEND_SLOTS) * seg
                slot = out_slots[start:start + b - a]
            sends.append(transport.isend(fill(a, b, slot), dest))
        if i < len(recv_segs):
            a, b = recv_segs[i]
            transport.waitall([recvs[i]])
            if recv_into is not None:
                drain(a, b, recv_into[a:b])
            else:
                slot = (i % _SLOTS) * seg
                drain(a, b, slots[slot:slot + b - a])
            if i + _SLOTS < len(recv_segs):
                recvs.append(post_recv(i + _SLOTS))
    transport.waitall(sends)


def sendrecv_(ctx, transport: Transport, outgoing: np.ndarray, dest: int, incoming: np.ndarray,
              source: int) -> None:
    """Send ``outgoing`` to ``dest`` while receiving ``incoming`` from ``source``, in segments of
    ``config.ring_segment_bytes`` where a message is longer (straight into ``incoming``, no copy; both
    sides must call it with equal sizes crosswise). Across emulated hosts one message each way of tens of
    MB took twice its time in about 1 call of 13 (rabenseifner's 84 MB allgather phase: 700 ms against
    350); cut as the reduce-scatter's messages are, the slow calls were fewer and about half as slow
    (docs/results/design_choices.md)."""
    seg = segment_elements(ctx, max(outgoing.size, incoming.size), incoming.itemsize)
    if max(outgoing.size, incoming.size) <= seg:
        transport.sendrecv(outgoing, dest, incoming, source)
        return
    exchange_segments(ctx, transport, outgoing.size, dest, incoming.size, source, seg, incoming.dtype,
                      lambda a, b, slot: outgoing[a:b], _arrived, recv_into=incoming)


def _arrived(a: int, b: int, received: np.ndarray) -> None:
    """A segment received straight into place: nothing left to do."""


def send_reduce_(ctx, transport: Transport, outgoing: np.ndarray, dest: int, target: np.ndarray, source: int,
                 op: ReduceOp, codec: WireCodec | None = None, scale: float = 1.0,
                 dst_scale: float = 1.0, then_scale: float = 1.0) -> int:
    """One pipelined exchange: send ``outgoing`` to ``dest`` while receiving ``target.size`` elements from
    ``source`` and reducing them into ``target`` (``target = target op received``). ``outgoing`` and
    ``target`` must not overlap. Returns encode overflows.

    With a codec ``outgoing`` travels as ``wire(outgoing * scale)`` and ``target`` becomes ``(target *
    dst_scale) op received`` (without a codec both scales must be 1). Without a codec, ``then_scale``
    multiplies each reduced segment of ``target`` while it is still in cache (the ring's Average: no pass
    over the buffer of its own).

    Both sides cut their messages into segments (``config.ring_segment_bytes`` of data; with a codec see
    ``_CODEC_SEGMENT_DIVISOR``); all sends are posted at once (with a codec: as soon as one of the
    ``_SEND_SLOTS`` encoded-segment slots is free), receives go to ``_SLOTS`` segment-sized slots, and each
    segment is reduced as soon as it has arrived - still in cache, while the next one is in flight."""
    seg = segment_elements(ctx, max(target.size, outgoing.size), target.itemsize if codec is None else 0)
    if codec is None:
        if scale != 1.0 or dst_scale != 1.0:
            raise ValueError("send_reduce_: scale and dst_scale need a codec; scale the buffer first")
        def reduce_then_scale(a, b, got):
            kernels.reduce_(target[a:b], got, op)
            kernels.scale_(target[a:b], then_scale)

        exchange_segments(ctx, transport, outgoing.size, dest, target.size, source, seg, target.dtype,
                  lambda a, b, slot: outgoing[a:b],
                  reduce_then_scale if then_scale != 1.0 else lambda a, b, got: kernels.reduce_(target[a:b], got, op))
        return 0
    overflow = 0

    def encode(a, b, slot):
        nonlocal overflow
        overflow += codec.encode(outgoing[a:b], slot, scale)
        return slot

    exchange_segments(ctx, transport, outgoing.size, dest, target.size, source, seg, codec.wire_dtype, encode,
              lambda a, b, got: codec.accumulate(target[a:b], got, op, dst_scale), send_slots=True)
    return overflow


def reduce_scatter_(ctx, transport: Transport, buf: np.ndarray, op: ReduceOp, offs: Sequence[int],
                    codec: WireCodec | None = None, prescale: float = 1.0, finish_scale: float = 1.0) -> int:
    """Reduce ``buf`` so that chunk ``[offs[r], offs[r+1])`` holds the group's reduction on rank r
    (``len(offs) == transport.size + 1``). Other chunks hold partial results. Returns encode overflows.

    ``prescale`` multiplies every rank's data before it is reduced: with a codec inside the encode and
    accumulate passes (see the module docstring), without one by a pass of its own. ``finish_scale``
    (no codec) multiplies the own finished chunk, segment by segment as the last step reduces it."""
    p, r = transport.size, transport.rank
    if prescale != 1.0 and (codec is None or p == 1):
        kernels.scale_(buf[offs[0]:offs[p]], prescale)
        prescale = 1.0
    if codec is not None and finish_scale != 1.0:
        raise ValueError("reduce_scatter_: finish_scale is for uncompressed data; a codec scales as it decodes")
    if p == 1:
        if finish_scale != 1.0:
            kernels.scale_(buf[offs[0]:offs[1]], finish_scale)
        return 0
    right, left = (r + 1) % p, (r - 1) % p
    overflow = 0
    for step in range(p - 1):
        send_chunk, recv_chunk = (r - step - 1) % p, (r - step - 2) % p
        # step 0 sends raw data; later steps send what the previous step accumulated (already scaled)
        overflow += send_reduce_(ctx, transport, buf[offs[send_chunk]:offs[send_chunk + 1]], right,
                                 buf[offs[recv_chunk]:offs[recv_chunk + 1]], left, op, codec,
                                 scale=prescale if step == 0 else 1.0, dst_scale=prescale,
                                 then_scale=finish_scale if step == p - 2 else 1.0)
    return overflow


def allgather_(ctx, transport: Transport, buf: np.ndarray, offs: Sequence[int],
               codec: WireCodec | None = None, postscale: float = 1.0) -> int:
    """Given the final chunk ``[offs[r], offs[r+1])`` on each rank r, fill in every chunk on every rank,
    multiplied by ``postscale``. With a codec the own chunk is replaced by its wire round trip (as every
    other rank will see it), and chunks that are forwarded to the next rank are kept in wire form."""
    p, r = transport.size, transport.rank
    if codec is None:
        if p > 1:
            right, left = (r + 1) % p, (r - 1) % p
            for step in range(p - 1):
                send_chunk, recv_chunk = (r - step) % p, (r - step - 1) % p
                s, e = offs[send_chunk], offs[send_chunk + 1]
                rs, re = offs[recv_chunk], offs[recv_chunk + 1]
                sendrecv_(ctx, transport, buf[s:e], right, buf[rs:re], left)
        if postscale != 1.0:
            kernels.scale_(buf[offs[0]:offs[p]], postscale)
        return 0
    own = buf[offs[r]:offs[r + 1]]
    if p == 1:
        return codec.round_trip(own, ctx.scratch.get("ring.wire_own", own.size, codec.wire_dtype), 1.0, postscale)
    overflow = 0

    def round_trip(a, b, slot):
        nonlocal overflow
        overflow += codec.round_trip(own[a:b], slot, 1.0, postscale)
        return slot

    kept = _kept(ctx, offs, codec)
    recv_chunk = (r - 1) % p
    rs, re = offs[recv_chunk], offs[recv_chunk + 1]
    exchange_segments(ctx, transport, own.size, (r + 1) % p, re - rs, (r - 1) % p, segment_elements(ctx, max(own.size, re - rs), 0),
              codec.wire_dtype, round_trip, _decoder(codec, buf[rs:re], postscale),
              recv_into=None if kept is None else kept[rs - offs[0]:re - offs[0]], send_slots=True)
    _forward(ctx, transport, buf, offs, codec, postscale, kept)
    return overflow


def _kept(ctx, offs: Sequence[int], codec: WireCodec) -> np.ndarray | None:
    """Wire-form copy of the chunks an allgather forwards (received at step k, sent on at step k+1);
    None on 2 ranks, where nothing is forwarded."""
    p = len(offs) - 1
    return ctx.scratch.get("ring.wire_full", offs[p] - offs[0], codec.wire_dtype) if p > 2 else None


def _decoder(codec: WireCodec, target: np.ndarray, postscale: float):
    return lambda a, b, got: codec.decode(got, target[a:b], postscale)


def _forward(ctx, transport: Transport, buf: np.ndarray, offs: Sequence[int], codec: WireCodec,
             postscale: float, kept: np.ndarray | None) -> None:
    """Allgather steps 1 .. p-2 with a codec: send on (from ``kept``) the chunk received at the previous
    step, receive and decode the next one (into ``kept`` unless it is the last)."""
    p, r = transport.size, transport.rank
    base = offs[0]
    for step in range(1, p - 1):
        send_chunk, recv_chunk = (r - step) % p, (r - step - 1) % p
        s, e = offs[send_chunk], offs[send_chunk + 1]
        rs, re = offs[recv_chunk], offs[recv_chunk + 1]
        forward = kept[s - base:e - base]
        exchange_segments(ctx, transport, e - s, (r + 1) % p, re - rs, (r - 1) % p, segment_elements(ctx, max(e - s, re - rs), 0),
                  codec.wire_dtype, lambda a, b, slot, fwd=forward: fwd[a:b],
                  _decoder(codec, buf[rs:re], postscale),
                  recv_into=None if step == p - 2 else kept[rs - base:re - base])


_REDUCE_TAG, _GATHER_TAG = 0, 1  # the two message streams of _finish_and_share


def _finish_and_share(ctx, transport: Transport, buf: np.ndarray, offs: Sequence[int], op: ReduceOp,
                      codec: WireCodec, scale: float, dst_scale: float, postscale: float,
                      kept: np.ndarray | None) -> int:
    """The last reduce-scatter step and the first allgather step as one loop over segments. For segment i:
    send the partial sums of chunk r+1 (encoded with ``scale``) while receiving the left neighbour's
    partial sums of the own chunk r; finish the own segment with one ``accumulate_round_trip``
    (``dst_scale``, ``postscale``), whose wire output is this rank's allgather data; send it while
    receiving the left neighbour's finished segment of chunk r-1, and decode that (keeping it in wire
    form in ``kept`` when it is forwarded later).

    Every rank does the same work per segment, so the ranks run in lockstep and each exchange finds its
    partner inside MPI: the transfers go slot to slot, in cache, instead of stalling while one side
    computes. Each own segment is read and written once instead of by an accumulate, an encode and a
    decode pass. The two message streams use separate tags."""
    p, r = transport.size, transport.rank
    right, left = (r + 1) % p, (r - 1) % p
    outgoing = buf[offs[right]:offs[right + 1]]
    own = buf[offs[r]:offs[r + 1]]
    rg, eg = offs[left], offs[left + 1]
    gathered = buf[rg:eg]
    keep = None if kept is None else kept[rg - offs[0]:eg - offs[0]]
    seg = segment_elements(ctx, max(outgoing.size, own.size, gathered.size), 0)
    slots = ctx.scratch.get("exchange.finish_slots", 4 * seg, codec.wire_dtype)
    reduce_out, reduce_in, gather_out, gather_in = (slots[k * seg:(k + 1) * seg] for k in range(4))
    out_segs = partition.segments(0, outgoing.size, seg)
    own_segs = partition.segments(0, own.size, seg)
    in_segs = partition.segments(0, gathered.size, seg)
    overflow = 0
    for i in range(max(len(out_segs), len(own_segs), len(in_segs))):
        sending = receiving = None
        if i < len(out_segs):
            a, b = out_segs[i]
            sending = reduce_out[:b - a]
            overflow += codec.encode(outgoing[a:b], sending, scale)
        if i < len(own_segs):
            a, b = own_segs[i]
            receiving = reduce_in[:b - a]
        _swap(transport, sending, right, receiving, left, _REDUCE_TAG)
        sending = receiving = None
        if i < len(own_segs):
            a, b = own_segs[i]
            sending = gather_out[:b - a]
            overflow += codec.accumulate_round_trip(own[a:b], reduce_in[:b - a], sending, op, dst_scale,
                                                    postscale)
        if i < len(in_segs):
            a, b = in_segs[i]
            receiving = gather_in[:b - a] if keep is None else keep[a:b]
        _swap(transport, sending, right, receiving, left, _GATHER_TAG)
        if receiving is not None:
            codec.decode(receiving, gathered[in_segs[i][0]:in_segs[i][1]], postscale)
    return overflow


def _swap(transport: Transport, sending: np.ndarray | None, dest: int, receiving: np.ndarray | None,
          source: int, tag: int) -> None:
    """Send and receive at once; either may be None (uneven chunks can differ by one segment)."""
    if sending is not None and receiving is not None:
        transport.sendrecv(sending, dest, receiving, source, tag)  # one call: the common case
    elif sending is not None:
        transport.send(sending, dest, tag)
    elif receiving is not None:
        transport.recv(receiving, source, tag)


def allreduce(ctx, buf: np.ndarray, op: ReduceOp, codec: WireCodec | None = None,
              transport: Transport | None = None, *, prescale: float = 1.0, postscale: float = 1.0) -> int:
    """Ring allreduce of ``buf`` in place over ``transport`` (default: the context's):
    ``buf = postscale * reduce(prescale * buf)``. With a codec the scaling is folded into the passes the
    ring makes anyway, and the last reduce-scatter step runs together with the first allgather step
    (module docstring); without a codec ``prescale`` is a pass over ``buf`` and ``postscale`` is applied to
    each segment of the own chunk as the last reduce-scatter step finishes it, so an Average costs no pass.
    On one rank scaling is a pass over ``buf``."""
    transport = transport or ctx.transport
    p, r = transport.size, transport.rank
    if p == 1 or buf.size == 0:
        for factor in (prescale, postscale):
            if factor != 1.0:
                kernels.scale_(buf, factor)
        return 0
    offs = partition.offsets(buf.size, p)
    if codec is None:  # the last step scales the own chunk as it finishes it; the allgather copies it
        reduce_scatter_(ctx, transport, buf, op, offs, None, prescale, finish_scale=postscale)
        return allgather_(ctx, transport, buf, offs, None)
    overflow = 0
    for step in range(p - 2):  # the reduce-scatter steps before the last, as in reduce_scatter_
        send_chunk, recv_chunk = (r - step - 1) % p, (r - step - 2) % p
        overflow += send_reduce_(ctx, transport, buf[offs[send_chunk]:offs[send_chunk + 1]], (r + 1) % p,
                                 buf[offs[recv_chunk]:offs[recv_chunk + 1]], (r - 1) % p, op, codec,
                                 scale=prescale if step == 0 else 1.0, dst_scale=prescale)
    kept = _kept(ctx, offs, codec)
    overflow += _finish_and_share(ctx, transport, buf, offs, op, codec, prescale if p == 2 else 1.0, prescale,
                                  postscale, kept)
    _forward(ctx, transport, buf, offs, codec, postscale, kept)
    return overflow
