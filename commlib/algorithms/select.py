"""The ``auto`` rule: which algorithm runs when the caller did not name one.

1. One rank: nothing to do (``run_allreduce`` returns before choosing).
2. Messages of at most ``config.small_message_bytes`` (COMMLIB_SMALL_MESSAGE, default 128 KiB): MPI's own
   allreduce (``native``), whose latency no Python schedule matches; with a codec, which MPI cannot carry,
   ``recursive_doubling`` - log2(p) latency terms, and the whole buffer per step costs little.
3. Every rank on one node and cross-memory attach available (``ctx.peer_memory``): ``cma`` - each byte
   is copied between processes once each way, not through MPI's shared-memory cells. With a codec too:
   cma rounds the values as the wire format would (the numbers compression promises) but moves float32,
   because on one node there is no wire to save and the ring's encode/decode passes cost more.
4. More than one node and more than one rank on some node: ``hierarchical`` - only n/k bytes per rank
   cross the slower inter-node link.
5. Otherwise (one rank per node): ``ring`` - bandwidth-optimal and pipelined.

Measured on 2 ranks of the reference machine (docs/algorithms.md): MPI's allreduce beats recursive
doubling and cma up to 128 KiB, cma beats it from 256 KiB (5.5 against 4.4 GB/s busbw) and reaches
2-3x at 8-64 MiB, where MPICH page-faults on fresh scratch memory every call. The rule depends only on
values that are equal on every rank (size, topology, config, the collective cma probe), so every rank
picks the same algorithm.
"""

from __future__ import annotations


def choose(ctx, nbytes: int, compressed: bool = False) -> str:
    """The algorithm ``auto`` runs for a message of ``nbytes`` bytes (the float32 size with a codec)."""
    if nbytes <= ctx.config.small_message_bytes:
        return "recursive_doubling" if compressed else "native"
    if ctx.peer_memory is not None:
        return "cma"
    topo = ctx.topology
    if topo.cross_size > 1 and topo.max_local_size > 1:
        return "hierarchical"
    return "ring"
