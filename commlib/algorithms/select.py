"""The ``auto`` rule: which algorithm runs when the caller did not name one.

1. One rank: nothing to do (``run_allreduce`` returns before choosing).
2. Messages of at most ``config.small_message_bytes`` (COMMLIB_SMALL_MESSAGE, default 64 KiB):
   ``recursive_doubling`` - log2(p) latency terms, and the whole buffer per step costs little.
3. More than one node and more than one rank on some node: ``hierarchical`` - only n/k bytes per rank
   cross the slower inter-node link.
4. Otherwise (one node, or one rank per node): ``ring`` - bandwidth-optimal and pipelined.

``native`` is never chosen: MPICH's allreduce is slower than ring for large messages here and cannot carry
a codec. The rule depends only on values that are equal on every rank (size, topology, config), so every
rank picks the same algorithm.
"""

from __future__ import annotations


def choose(ctx, nbytes: int, compressed: bool = False) -> str:
    """The algorithm ``auto`` runs for a message of ``nbytes`` bytes (the float32 size with a codec)."""
    if nbytes <= ctx.config.small_message_bytes:
        return "recursive_doubling"
    if ctx.peer_memory is not None and not compressed:
        return "cma"
    topo = ctx.topology
    if topo.cross_size > 1 and topo.max_local_size > 1:
        return "hierarchical"
    return "ring"
