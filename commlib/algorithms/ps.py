"""``ps``: the allreduce through the summation servers (push_pull, :mod:`commlib.server`).

Not a schedule among the ranks: each rank pushes its buffer's partitions to the servers and receives the
sums. It runs where the context has a server lane (``ctx.servers``, set by the runtime when the job has
servers; this module does not import MPI). ``auto`` chooses it where :func:`cost` predicts it faster than
every allreduce: where the servers add link bandwidth (hosts of their own), not where they share the
workers' links (docs/servers.md).
"""

from __future__ import annotations

import numpy as np

from ..ops import ReduceOp
from .cost import INF

NO_SERVERS = ("algorithm 'ps' needs summation servers, and this job has none: launch them as extra ranks "
              "of the job, e.g. mpiexec -n 4 python train.py : -n 2 python -m commlib.server "
              "(docs/servers.md)")


def requires(ctx, codec) -> str | None:
    return None if getattr(ctx, "servers", None) is not None else NO_SERVERS


def allreduce(ctx, buf: np.ndarray, op: ReduceOp, codec=None, *, prescale: float = 1.0,
              postscale: float = 1.0) -> int:
    """``buf = postscale * reduce(prescale * buf)`` through the servers; the same bits on every rank."""
    ctx.servers.reduce_(buf, op, codec, prescale, postscale)
    return 0  # the client warns about fp16 overflow itself, naming the key


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
        parts = max(parts, min(16 * servers, int(wire) // (256 << 10)))
    end = wire / parts
    if parts >= 4 * servers:  # the layout's tapered ends (commlib.server.protocol.bounds; that layer is above)
        parts += 6 * servers
        end /= 8
    return (model.call_s + 2 * link.alpha_s + busiest * link.beta_s_per_byte
            + 2 * shape.ranks * end * link.beta_s_per_byte + parts * model.message_s
            + (shape.ranks - 1) * end * model.reduce_s_per_byte + 2 * nbytes * model.codec_rate(codec))
