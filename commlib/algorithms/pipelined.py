"""Hierarchical allreduce in blocks, so that the link between nodes never waits for the work inside a node.

:mod:`.hierarchical` runs its three phases one after the other: while a node reduce-scatters and
allgathers over shared memory, its network link is idle (at 1 Gbit/s and 64 MiB on 2 nodes of 2 ranks,
those phases cost 10-15% on top of the link bound). Here the buffer is cut into blocks of 8 segments
(``auto`` chooses the segment), at most 2 MiB (:func:`.partition.pipeline_block_bytes`), and the phases of
consecutive blocks overlap:

    block b:   intra reduce-scatter | cross allreduce (posted, non-blocking) ........ | intra allgather
    block b+1:                        intra reduce-scatter | cross allreduce ...

While block b's shard crosses the network, this rank reduce-scatters block b+1 and allgathers block b-1
inside its node; those MPI calls also progress the pending network transfers. The cross-node allreduce of
a shard is a ring over its shard group (as hierarchical's, :func:`_cross_ring`), written as a generator
that yields the requests of each step, so that the driver can do other work before waiting for them.

Same shards, groups and codec rule as :mod:`.hierarchical` (nodes of any size; a rank holding several
shards runs their rings side by side, each on its own communicator): a codec applies to what crosses
nodes, and every rank ends with identical, wire-exact values.

Cost (B blocks): the slower of the intra phases and the cross phase per block, B times, plus one block's
other phases at the start and end of the pipeline.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from .. import kernels
from ..compression import WireCodec
from ..ops import ReduceOp
from ..transport.base import Transport
from . import hierarchical, partition, ring
from .scaling import with_scaling_passes

def _cross_ring(ctx, transport: Transport, buf: np.ndarray, op: ReduceOp, codec: WireCodec | None,
                key: str) -> Iterator[list]:
    """Ring allreduce of ``buf`` over ``transport``, yielding each step's requests before waiting for them.
    Returns encode overflows (as the generator's value)."""
    p, r = transport.size, transport.rank
    overflow = 0
    if p == 1 or buf.size == 0:
        return overflow
    right, left = (r + 1) % p, (r - 1) % p
    offs = partition.offsets(buf.size, p)
    widest = max(offs[i + 1] - offs[i] for i in range(p))
    if codec is None:
        incoming = ctx.scratch.get(key + ".in", widest, buf.dtype)
        for step in range(p - 1):  # reduce-scatter: the received partial sums go into place
            s, rc = (r - step - 1) % p, (r - step - 2) % p
            target = buf[offs[rc]:offs[rc + 1]]
            got = incoming[:target.size]
            yield [transport.isend(buf[offs[s]:offs[s + 1]], right), transport.irecv(got, left)]
            kernels.reduce_(target, got, op)
        for step in range(p - 1):  # allgather: straight from and into place
            s, rc = (r - step) % p, (r - step - 1) % p
            yield [transport.isend(buf[offs[s]:offs[s + 1]], right),
                   transport.irecv(buf[offs[rc]:offs[rc + 1]], left)]
        return overflow
    wire = ctx.scratch.get(key + ".wire", buf.size, codec.wire_dtype)  # every chunk in wire form
    out = ctx.scratch.get(key + ".out", widest, codec.wire_dtype)
    incoming = ctx.scratch.get(key + ".in", widest, codec.wire_dtype)
    for step in range(p - 1):
        s, rc = (r - step - 1) % p, (r - step - 2) % p
        sending = out[:offs[s + 1] - offs[s]]
        overflow += codec.encode(buf[offs[s]:offs[s + 1]], sending)
        target = buf[offs[rc]:offs[rc + 1]]
        got = incoming[:target.size]
        yield [transport.isend(sending, right), transport.irecv(got, left)]
        codec.accumulate(target, got, op)
    own = slice(offs[r], offs[r + 1])
    overflow += codec.round_trip(buf[own], wire[own])  # the owner keeps what the others will decode
    for step in range(p - 1):
        s, rc = (r - step) % p, (r - step - 1) % p
        yield [transport.isend(wire[offs[s]:offs[s + 1]], right),
               transport.irecv(wire[offs[rc]:offs[rc + 1]], left)]
        codec.decode(wire[offs[rc]:offs[rc + 1]], buf[offs[rc]:offs[rc + 1]])
    return overflow


class _Crossing:
    """The cross-node rings of one block in flight: one generator per shard this rank holds, driven in
    lockstep (post every ring's step, then wait for all of them)."""

    def __init__(self, rings: list):
        self.rings = rings
        self.pending: list = []
        self.overflow = 0
        self._advance()

    def _advance(self) -> None:
        self.pending = []
        alive = []
        for gen in self.rings:
            try:
                self.pending.append(next(gen))
                alive.append(gen)
            except StopIteration as stop:
                self.overflow += stop.value or 0
        self.rings = alive

    def finish(self, transport: Transport) -> int:
        while self.rings:
            transport.waitall([req for step in self.pending for req in step])
            self._advance()
        return self.overflow


def allreduce(ctx, buf: np.ndarray, op: ReduceOp, codec: WireCodec | None = None, *, prescale: float = 1.0,
              postscale: float = 1.0) -> int:
    """``buf = postscale * allreduce(prescale * buf)`` in place; returns encode overflows. The factors are
    applied per block inside the pipeline, not by passes over the whole buffer before and after it: with
    fp16 on the wire a Sum always has both (divide by the ranks, multiply back), and such passes keep the
    link idle (docs/results/design_choices.md). A block is
    prescaled as its reduce-scatter starts; a rank postscales the shards it holds once they have crossed
    the network, before the node allgathers them. Every element is scaled as by the passes."""
    topo, n = ctx.topology, buf.size
    if topo.size == 1 or n == 0:
        return with_scaling_passes(buf, prescale, postscale, lambda: 0)
    intra = ctx.intra()
    inside = hierarchical.intra_codec(ctx, codec)
    groups = ctx.shard_groups()  # collective on first use: every rank creates them here
    width = topo.max_local_size
    held = partition.offsets(width, topo.local_size)
    mine = range(held[topo.local_rank], held[topo.local_rank + 1])
    block = max(1, partition.pipeline_block_bytes(ctx.segment_bytes) // buf.itemsize)
    blocks = partition.segments(0, n, block)
    overflow = 0
    crossing: _Crossing | None = None
    previous = None  # (view, chunks, shards) of the block whose cross phase is in flight

    def gather(view, chunks, shards) -> int:
        """Postscale this rank's shards of a block that has crossed, then allgather it in the node."""
        if inside is not None:
            return ring.allgather_(ctx, intra, view, chunks, inside, postscale)
        if postscale != 1.0:
            for shard in shards:
                kernels.scale_(shard, postscale)
        return ring.allgather_(ctx, intra, view, chunks)

    for a, b in blocks:
        view = buf[a:b]
        shard = partition.offsets(view.size, width)
        chunks = [shard[g] for g in held]
        # progresses `crossing` too
        overflow += ring.reduce_scatter_(ctx, intra, view, op, chunks, inside, prescale=prescale)
        if crossing is not None:
            overflow += crossing.finish(ctx.transport)
        # block b's shards start across the network before block b-1 is allgathered inside the node
        shards = [view[shard[j]:shard[j + 1]] for j in mine]
        crossing = _Crossing([_cross_ring(ctx, groups[j], piece, op, codec, f"pipelined.{j}")
                              for j, piece in zip(mine, shards)])
        if previous is not None:
            overflow += gather(*previous)
        previous = (view, chunks, shards)
    if crossing is not None:
        overflow += crossing.finish(ctx.transport)
    if previous is not None:
        overflow += gather(*previous)
    return overflow
