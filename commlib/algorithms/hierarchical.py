"""Hierarchical allreduce: reduce-scatter inside each node, allreduce each shard across nodes, allgather
inside each node. Cross-node traffic is n/k per rank instead of n, and all shards cross in parallel.

Cost (N nodes of k ranks): 2(k-1) alpha + 2(k-1)/k n beta_intra + [cross allreduce of n/k bytes on N
ranks: ring 2(N-1) alpha + 2(N-1)/N (n/k) beta_inter, recursive doubling below the small-message size].

Nodes may have different numbers of ranks. The buffer is cut into L shards, L = ranks on the largest node
(``partition.offsets(count, L)``). On a node of k ranks local rank r holds the contiguous group of shards
``partition.offsets(L, k)[r:r+2]``, so the intra-node reduce-scatter is a ring over uneven chunks. Shard j
is then allreduced by the group of ranks holding it, one per node (``AlgorithmContext.shard_groups``); a
rank holding several shards handles them in increasing j, which every group agrees on, so no cycle of
waits can form.

A codec applies to what crosses nodes (:func:`intra_codec`): the phases inside a node move float32 over
shared memory, where encoding would cost time and precision and save nothing that matters. The
cross-node allreduce leaves the ranks of each shard group with identical wire-exact values (ring.py),
which the intra-node allgather copies: every rank ends with the same values. On a single node, where
nothing crosses, the phases inside it carry the codec, as every algorithm there rounds as the wire would.
"""

from __future__ import annotations

import numpy as np

from ..compression import WireCodec
from ..ops import ReduceOp
from . import cost, partition, recursive_doubling, ring


def intra_codec(ctx, codec: WireCodec | None) -> WireCodec | None:
    """The codec of the phases inside a node: none when there are nodes to cross (see the docstring;
    the rule is :func:`.cost.codec_inside_nodes`, which the formulas read too)."""
    return cost.codec_inside_nodes(ctx.topology.cross_size, codec)


def flat_here(ctx, codec=None) -> str | None:
    """Why ``auto`` leaves hierarchical and its pipelined form out on ``ctx`` though they can run (None: it
    does not): where every node holds one rank nothing happens inside a node, and what crosses is the ring
    (or recursive doubling) over all ranks, which ``auto`` measures as itself; the pipelined form runs that
    ring per block, with a wait per step. Each is one more exploring call of a training step's size
    (docs/results/auto_learn_rules.md)."""
    topo = ctx.topology
    if topo.cross_size > 1 and topo.max_local_size == 1:
        return "every node holds one rank: its phases are the flat algorithms' exchanges"
    return None


def cross_allreduce(ctx, transport, buf: np.ndarray, op: ReduceOp, codec: WireCodec | None) -> int:
    """Allreduce over a cross-node group: recursive doubling for small shards, ring otherwise."""
    if buf.nbytes <= ctx.config.small_message_bytes:
        return recursive_doubling.allreduce(ctx, buf, op, codec, transport=transport)
    return ring.allreduce(ctx, buf, op, codec, transport=transport)


def allreduce(ctx, buf: np.ndarray, op: ReduceOp, codec: WireCodec | None = None, transport=None) -> int:
    if transport is not None and transport is not ctx.transport:
        raise ValueError("hierarchical runs on the context's own transport and topology")
    topo, n = ctx.topology, buf.size
    if topo.size == 1 or n == 0:
        return 0
    width = topo.max_local_size
    shard = partition.offsets(n, width)
    held = partition.offsets(width, topo.local_size)
    chunks = [shard[g] for g in held]  # element boundaries of each local rank's shard group
    intra = ctx.intra()
    groups = ctx.shard_groups()  # collective on first use: every rank creates them here
    inside = intra_codec(ctx, codec)
    overflow = ring.reduce_scatter_(ctx, intra, buf, op, chunks, inside)
    for j in range(held[topo.local_rank], held[topo.local_rank + 1]):
        overflow += cross_allreduce(ctx, groups[j], buf[shard[j]:shard[j + 1]], op, codec)
    return overflow + ring.allgather_(ctx, intra, buf, chunks, inside)
