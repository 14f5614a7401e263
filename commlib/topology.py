"""Which ranks share a node: the shape the hierarchical and torus2d algorithms follow.

Nodes come from MPI's shared-memory split (``MPI_COMM_TYPE_SHARED``) or, to emulate multi-node shapes on
one machine, from ``COMMLIB_LOCAL_SIZE=k``: consecutive blocks of k ranks form one node each; when k does
not divide the number of ranks the last node is smaller (e.g. 5 ranks, k=2: nodes of 2, 2 and 1). Real
shared-memory splits can be uneven too, so every algorithm accepts nodes of different sizes.

Nodes are numbered by their lowest rank; inside a node, local ranks follow the global rank order.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from .errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Topology:
    """This rank's place in the node grouping of a communicator of ``size`` ranks."""

    rank: int
    size: int
    node_of_rank: tuple[int, ...]  # node index of every rank

    @classmethod
    def from_node_ids(cls, rank: int, node_ids: Sequence[object]) -> "Topology":
        """Build from any per-rank node label (equal labels = same node); nodes are renumbered 0..n-1 in
        the order of their lowest rank."""
        index: dict[object, int] = {}
        for label in node_ids:
            index.setdefault(label, len(index))
        return cls(rank=rank, size=len(node_ids), node_of_rank=tuple(index[label] for label in node_ids))

    @classmethod
    def blocks(cls, rank: int, size: int, local_size: int) -> "Topology":
        """Consecutive blocks of ``local_size`` ranks per node (the last node may be smaller)."""
        if local_size < 1:
            raise ConfigError(f"COMMLIB_LOCAL_SIZE must be a positive integer, got {local_size}")
        return cls.from_node_ids(rank, [r // local_size for r in range(size)])

    @classmethod
    def detect(cls, comm, local_size_override: int | None = None) -> "Topology":
        """Collective over the mpi4py communicator ``comm``: the node grouping of its ranks.

        With ``local_size_override`` (``Config.local_size``) no MPI query is made."""
        if local_size_override is not None:
            return cls.blocks(comm.Get_rank(), comm.Get_size(), local_size_override)
        from mpi4py import MPI

        shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        try:
            leader = shared.allreduce(comm.Get_rank(), op=MPI.MIN)  # the node's lowest rank labels it
        finally:
            shared.Free()
        return cls.from_node_ids(comm.Get_rank(), comm.allgather(leader))

    # -- derived views ----------------------------------------------------------------------------------
    @property
    def cross_rank(self) -> int:
        """Index of this rank's node."""
        return self.node_of_rank[self.rank]

    @property
    def cross_size(self) -> int:
        """Number of nodes."""
        return max(self.node_of_rank) + 1 if self.node_of_rank else 0

    @property
    def node_sizes(self) -> tuple[int, ...]:
        """Ranks on each node, by node index."""
        sizes = [0] * self.cross_size
        for node in self.node_of_rank:
            sizes[node] += 1
        return tuple(sizes)

    @property
    def local_size(self) -> int:
        """Ranks on this rank's node."""
        return self.node_sizes[self.cross_rank]

    @property
    def local_rank(self) -> int:
        """Index of this rank among the ranks of its node (in rank order)."""
        return sum(1 for r in range(self.rank) if self.node_of_rank[r] == self.cross_rank)

    @property
    def max_local_size(self) -> int:
        """Ranks on the largest node."""
        return max(self.node_sizes)

    @property
    def uniform(self) -> bool:
        """True when every node has the same number of ranks."""
        return len(set(self.node_sizes)) == 1

    def __str__(self) -> str:
        return (f"Topology(rank={self.rank}/{self.size}, node {self.cross_rank}/{self.cross_size}, "
                f"local {self.local_rank}/{self.local_size}, node sizes {list(self.node_sizes)})")
