"""``ps``: the allreduce through the summation servers (push_pull, :mod:`commlib.server`).

Not a schedule among the ranks: each rank pushes its buffer's partitions to the servers and receives the
sums. It runs where the context has a server lane (``ctx.servers``, set by the runtime when the job has
servers; this module does not import MPI). ``auto`` chooses it where :func:`cost` predicts it faster than
every allreduce: where the servers add link bandwidth (hosts of their own), not where they share the
workers' links (docs/servers.md).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..ops import ReduceOp
from . import cost as _cost
from . import partition, ring
from .cost import INF



def no_servers(what: str) -> str:
    """The error for ``what`` (a call, an algorithm) in a job without summation servers: how to start them."""
    return (f"{what} needs summation servers, and this job has none: launch them as extra ranks of the job, "
            "e.g. mpiexec -n 4 python train.py : -n 2 python -m commlib.server (docs/servers.md)")


NO_SERVERS = no_servers("algorithm 'ps'")


def requires(ctx, codec) -> str | None:
    return None if getattr(ctx, "servers", None) is not None else NO_SERVERS


def allreduce(ctx, buf: np.ndarray, op: ReduceOp, codec=None, *, prescale: float = 1.0,
              postscale: float = 1.0) -> int:
    """``buf = postscale * reduce(prescale * buf)`` through the servers; the same bits on every rank.
    With several ranks on a node, reduced inside the node first where :func:`reduces_in_hosts` says so."""
    if buf.size and reduces_in_hosts(ctx.cost_model, buf.nbytes, shape_of(ctx), codec):
        return host_allreduce(ctx, buf, op, codec, prescale, postscale)
    ctx.servers.reduce_(buf, op, codec, prescale, postscale)
    return 0  # the client warns about fp16 overflow itself, naming the key


def shape_of(ctx) -> _cost.Shape:
    """What :func:`reduces_in_hosts` reads of ``ctx`` (a lane with servers): the nodes of the ranks and of
    the servers, the partition size and COMMLIB_SERVER_HOST_REDUCE; equal on every rank of the set."""
    cached = ctx.server_shape
    if cached is None:
        config = ctx.config
        cached = ctx.server_shape = _cost.Shape(
            node_of_rank=tuple(ctx.topology.node_of_rank), servers=tuple(ctx.servers.server_nodes),
            server_partition_bytes=config.server_partition_bytes, server_depth=ctx.servers.depth,
            server_host_reduce=config.server_host_reduce)
    return cached


def host_allreduce(ctx, buf: np.ndarray, op: ReduceOp, codec=None, prescale: float = 1.0,
                   postscale: float = 1.0) -> int:
    """Reduce inside each node first, so that the servers receive one push per node (BytePS's rule):
    a ring reduce-scatter inside the node (over shared memory, hierarchical's phase) leaves local rank r
    the node's sum of its shards; it push_pulls them, the servers counting one contributor per node;
    a ring allgather inside the node hands every rank the whole result. The node's link then carries
    each partition once each way, however many ranks the node has; the node's ranks share the pushing.
    The phases inside the node move the tensor's own dtype (a codec applies to what goes to the servers,
    after the node's sum); the allgather copies the servers' answer, so every rank ends with the same
    bits."""
    topo, n = ctx.topology, buf.size
    width = topo.max_local_size
    shard = partition.offsets(n, width)
    held = partition.offsets(width, topo.local_size)
    chunks = [shard[g] for g in held]  # element boundaries of each local rank's shards
    intra = ctx.intra()  # collective over every rank on first use, even where a node has one rank
    overflow = 0
    if intra.size > 1:
        overflow += ring.reduce_scatter_(ctx, intra, buf, op, chunks, None)
    mine = range(held[topo.local_rank], held[topo.local_rank + 1])
    ctx.servers.reduce_shards_([(j, buf[shard[j]:shard[j + 1]]) for j in mine], op, codec, prescale,
                               postscale, topo.cross_size)
    if intra.size > 1:
        overflow += ring.allgather_(ctx, intra, buf, chunks, None)
    return overflow


def host_cost(model, nbytes: float, shape, codec=None, seg: int = 0) -> float:
    """:func:`host_allreduce`'s time: the reduce-scatter and the allgather inside the nodes, and the
    push_pull of ``nbytes`` per node (one worker per node, as the servers see it)."""
    if nbytes <= 0:
        return 0.0
    nodes = shape.node_groups()
    seg = seg or (1 << 20)
    inside = _cost.rings(model, shape, nodes, nbytes, None, seg)
    per_node = dataclasses.replace(shape, node_of_rank=tuple(sorted(set(shape.node_of_rank))))
    return inside + cost(model, nbytes, per_node, codec, seg)


def reduces_in_hosts(model, nbytes: float, shape, codec=None) -> bool:
    """Whether ``ps`` reduces inside each node first (``shape.server_host_reduce``, COMMLIB_SERVER_HOST_REDUCE):
    never with one rank per node (nothing to reduce) or without servers; ``on``: always else; ``auto``:
    where pushes cross a link (servers elsewhere: the node's link carries every local rank's push) and
    :func:`host_cost` is below :func:`cost`. The inputs are equal on every rank, so every rank decides
    alike (the servers count one push per node or one per rank by it)."""
    mode = shape.server_host_reduce
    if mode == "off" or nbytes <= 0 or not shape.servers or shape.nodes == shape.ranks:
        return False
    if mode == "on":
        return True
    if not link_bytes(nbytes, shape)[1]:
        return False
    return host_cost(model, nbytes, shape, codec) < cost(model, nbytes, shape, codec)


def chosen_cost(model, nbytes: float, shape, codec=None, seg: int = 0) -> float:
    """The time of what ``ps`` runs for ``nbytes`` on ``shape``: :func:`host_cost` where
    :func:`reduces_in_hosts`, else :func:`cost` (the registry's formula for ``auto``)."""
    if reduces_in_hosts(model, nbytes, shape, codec):
        return host_cost(model, nbytes, shape, codec, seg)
    return cost(model, nbytes, shape, codec, seg)


def link_bytes(nbytes: float, shape) -> tuple[float, bool]:
    """``(bytes, crosses)``: what the busiest node's link carries each way when every worker pushes
    ``nbytes`` and receives the sum (partitions spread evenly over the servers), and whether any of it
    leaves a node. A worker's node sends what its workers push to servers elsewhere and what its
    servers answer to workers elsewhere: on hosts of their own, ``nbytes`` per worker link and
    ``workers / servers x nbytes`` per server link; beside the workers (one server per worker host),
    ``2 (n-1)/n x nbytes``, what a ring allreduce moves."""
    servers = len(shape.servers)
    workers_on: dict[int, int] = {}
    for node in shape.node_of_rank:
        workers_on[node] = workers_on.get(node, 0) + 1
    servers_on: dict[int, int] = {}
    for node in shape.servers:
        servers_on[node] = servers_on.get(node, 0) + 1
    busiest = 0.0
    for node in set(workers_on) | set(servers_on):
        k, m = workers_on.get(node, 0), servers_on.get(node, 0)
        busiest = max(busiest, k * nbytes * (servers - m) / servers + m * nbytes / servers * (shape.ranks - k))
    if busiest > 0:
        return busiest, True
    return 2 * nbytes * max(1.0, shape.ranks / servers), False  # all on one node: copies through memory


def cost(model, nbytes: float, shape, codec=None, seg: int = 0) -> float:
    """The busiest link's bytes (:func:`link_bytes`) at the server link's rate, one partition's round
    trip (the first partition gathered from every worker, the last one's answers to every worker: the
    smallest partitions of :func:`commlib.server.protocol.bounds`), the sum of the last partition, a
    message cost per partition, encoding and decoding; infinite without servers."""
    if nbytes <= 0:
        return 0.0
    if not shape.servers:
        return INF
    wire = nbytes * (0.5 if codec is not None else 1.0)
    busiest, crosses = link_bytes(wire, shape)
    link = model.server if crosses else model.intra
    servers = len(shape.servers)
    parts = max(1, -(-int(wire) // max(1, shape.server_partition_bytes)))
    if parts > 1:
        parts = max(parts, min(shape.server_depth * servers, int(wire) // (256 << 10)))
    end = wire / parts
    if parts >= 4 * servers:  # the layout's tapered ends (commlib.server.protocol.bounds; that layer is above)
        parts += 6 * servers
        end /= 8
    return (model.call_s + 2 * link.alpha_s + busiest * link.beta_s_per_byte
            + 2 * shape.ranks * end * link.beta_s_per_byte + parts * model.message_s
            + (shape.ranks - 1) * end * model.reduce_s_per_byte + 2 * nbytes * model.codec_rate(codec))
