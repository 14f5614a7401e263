"""Process sets: subsets of the ranks that run collectives among themselves, as in Horovod.

``ProcessSet(ranks)`` describes a set; ``add_process_set`` registers it (collective: every rank calls it,
with the same ranks, in the same order of calls) and gives it an id; ``process_set=`` on a collective
runs it among the set's ranks only. Each registered set that includes this rank has a :class:`Member`:
its own communicators, its node layout (taken from the world's, so algorithm choice follows the set's
own shape), and its own coordinator (negotiation, fusion, lanes, stall checks). The world is the first
set (id 0, :data:`global_process_set`). Ranks in ``process_set=`` calls, e.g. a broadcast's root, are
world ranks, as in Horovod; ``ProcessSet.rank()`` is the rank within the set.

Dynamic process sets (Horovod's ``HOROVOD_DYNAMIC_PROCESS_SETS``) are always on: sets may be added and
removed at any time after ``init()``; ``init(process_sets=[...])`` registers some at once. Ids are the
smallest ids not in use, the same on every rank because every rank adds and removes in the same order.

Members-only sets (``add_process_set(ranks, members_only=True)``) are registered by their own ranks alone,
while the other ranks do something else (torch's ``new_group(..., use_local_synchronization=True)`` and
``new_subgroups(group=...)``). The members exchange their ranks and next free id point to point on the world
communicator, under the runtime's deadline (a member that never calls is a PeerLostError naming it), then
make the set's communicator with ``MPI_Comm_create_group``, collective over the members only. Their ids come
from a separate space, from :data:`MEMBERS_ONLY_IDS` up, so they never collide with the world's: the id is
the largest of the members' next free ids (each member's is above every members-only id it has used), the
same on every member; no one else knows it. Removing such a set, and shutting down, involve its members
only; shutdown closes the sets in decreasing id order, which cannot wait in a cycle (two sets that share
a rank have different ids).
"""

from __future__ import annotations

import itertools
from typing import Callable, Sequence

import numpy as np

from .coordinator.requests import AUTO_NAME_MARK
from .errors import CommlibError, ProcessSetError

#: the first id of members-only sets: world-agreed ids are the smallest free ones, far below
MEMBERS_ONLY_IDS = 1 << 20
#: the tag of the members' agreement messages on the world communicator (nothing else sends on it), and the
#: tag of their MPI_Comm_create_group (another: it must not match an agreement message still to come)
_AGREE_TAG = 31_415
_CREATE_TAG = 31_416


class ProcessSet:
    """A set of world ranks. Create it with a list of ranks (or an mpi4py communicator whose ranks are
    all in the world); register it with ``commlib.add_process_set``.

    Example::

        evens = cl.add_process_set(range(0, cl.size(), 2))
        if evens.included():
            total = cl.allreduce(x, op=cl.Sum, process_set=evens)
    """

    members_only = False  # registered by its members alone (add_process_set(..., members_only=True))

    def __init__(self, ranks_or_comm):
        self.process_set_id: int | None = None
        self.mpi_comm = None
        self._table: ProcessSetTable | None = None
        if hasattr(ranks_or_comm, "Get_group") and hasattr(ranks_or_comm, "Get_size"):
            self.mpi_comm = ranks_or_comm  # its world ranks are found when it is registered
            self.ranks = None
            return
        try:
            ranks = list(ranks_or_comm)
        except TypeError:
            raise ProcessSetError("ProcessSet takes a list of ranks or an mpi4py communicator, not "
                                  f"{type(ranks_or_comm).__name__}") from None
        if any(isinstance(r, bool) or not isinstance(r, int) and not hasattr(r, "__index__") for r in ranks):
            raise ProcessSetError(f"ProcessSet ranks must be integers, got {ranks}")
        ranks = sorted(int(r) for r in ranks)
        if len(set(ranks)) != len(ranks) or any(r < 0 for r in ranks):
            raise ProcessSetError(f"ProcessSet ranks must be distinct non-negative ranks, got {ranks}")
        self.ranks: list[int] | None = ranks

    def size(self) -> int | None:
        """Number of ranks in the set; None while the set is not registered."""
        return None if self.process_set_id is None else len(self.ranks)

    def rank(self) -> int | None:
        """This process's rank within the set (-1 if it is not in the set); None while not registered.
        Collectives still take world ranks (e.g. a broadcast's root), as in Horovod."""
        if self.process_set_id is None:
            return None
        world_rank = self._table.world_rank
        return self.ranks.index(world_rank) if world_rank in self.ranks else -1

    def included(self) -> bool | None:
        """Whether this process is in the set; None while not registered."""
        if self.process_set_id is None:
            return None
        return self._table.world_rank in self.ranks

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"

    __str__ = __repr__


class GlobalProcessSet(ProcessSet):
    """The world (id 0). One object for every runtime: it reads the current one when asked."""

    def __init__(self, current: Callable[[], "ProcessSetTable | None"]):
        self.mpi_comm = None
        self._current = current

    @property
    def process_set_id(self) -> int | None:
        return 0 if self._current() is not None else None

    @property
    def ranks(self) -> list[int] | None:
        table = self._current()
        return None if table is None else list(range(table.world_size))

    @property
    def _table(self):
        return self._current()


class Member:
    """This rank's part in one registered set: communicator, node layout, coordinator. Built and closed
    by the runtime (``build(comm, world_ranks, label)``)."""

    def __init__(self, process_set_id: int, ranks: list[int], world_rank: int, parts):
        self.process_set_id = process_set_id
        self.ranks = ranks
        self.rank = ranks.index(world_rank)
        self.size = len(ranks)
        self.comm, self.topology, self.coordinator = parts
        self._unnamed: dict[str, itertools.count] = {}

    def auto_name(self, operation: str) -> str:
        """A name for an unnamed tensor, the same on every rank of the set as long as they call in the
        same order; counted per set member (ranks of different sets call different numbers of collectives,
        and a removed set's id may come back with other ranks)."""
        counter = self._unnamed.setdefault(operation, itertools.count())
        suffix = f"{self.process_set_id}." if self.process_set_id else ""
        return f"{operation}{AUTO_NAME_MARK}{suffix}{next(counter)}"

    def close(self, leaving: bool = False) -> None:
        self.coordinator.close(leaving=leaving)
        if self.coordinator.lost is None:  # after a lost peer nothing collective: the process's end frees it
            self.comm.Free()


def check_process_set(process_set, name: str) -> "ProcessSet":
    """A process set argument is a :class:`ProcessSet` (a ValueError, :class:`ProcessSetError`, otherwise)."""
    if not isinstance(process_set, ProcessSet):
        raise ProcessSetError(f"{name}: process_set must be a ProcessSet (from commlib.add_process_set), "
                              f"not {type(process_set).__name__} {process_set!r}")
    return process_set


class ProcessSetTable:
    """The registered sets of one runtime, by id, and this rank's :class:`Member` of each set it is in.

    ``world_comm`` is the runtime's world communicator (used only from user threads, for the collective
    ``add``/``remove``); ``build(comm, ranks, label)`` makes the (comm, topology, coordinator) of a set;
    ``deadline`` (the runtime's :class:`~commlib.transport.deadline.Deadline`) bounds ``add``'s agreement."""

    def __init__(self, world_comm, build: Callable, world_member_parts, deadline):
        self._world = world_comm
        self._deadline = deadline
        self.world_rank = world_comm.Get_rank()
        self.world_size = world_comm.Get_size()
        self._build = build
        self._sets: dict[int, ProcessSet] = {}
        self._next_members_only = MEMBERS_ONLY_IDS  # above every members-only id this rank has used
        self._members: dict[int, Member] = {0: Member(0, list(range(self.world_size)), self.world_rank,
                                                      world_member_parts)}

    @property
    def world(self) -> Member:
        return self._members[0]

    def members(self) -> list[Member]:
        return list(self._members.values())

    def by_id(self, process_set_id: int) -> ProcessSet | None:
        """The registered set with this id (also one this rank is not in), or None; 0 is the world, which
        has no ProcessSet here (``commlib.global_process_set`` is the world's)."""
        return self._sets.get(process_set_id)

    def member(self, process_set, name: str = "") -> Member:
        """This rank's member of ``process_set`` (None or the global set: the world), or a clear error."""
        if process_set is None:
            return self._members[0]
        set_id = check_process_set(process_set, name).process_set_id
        if set_id == 0:
            return self._members[0]
        if set_id is None or self._sets.get(set_id) is not process_set:
            raise ProcessSetError(
                f"{name}: {process_set} is not registered (never added, or removed); register it on every "
                "rank with commlib.add_process_set before using it")
        member = self._members.get(set_id)
        if member is None:
            raise ProcessSetError(
                f"{name}: rank {self.world_rank} is not in process set {set_id} (ranks {process_set.ranks}); "
                "only the set's ranks may call its collectives (check process_set.included())")
        return member

    def add(self, process_set: ProcessSet | Sequence[int], members_only: bool = False) -> ProcessSet:
        """Register ``process_set`` (collective over the world: every rank, same ranks, same order; with
        ``members_only``, over the set's ranks only: see the module docstring)."""
        if not isinstance(process_set, ProcessSet):
            process_set = ProcessSet(process_set)
        if process_set.process_set_id is not None:
            raise ProcessSetError(f"{process_set} is already registered")
        if members_only:
            return self._add_members_only(process_set)
        ranks = self._ranks_of(process_set)
        every = self._agree(ranks)  # also the point where every rank must be
        differing = {r: v for r, v in enumerate(every) if v != ranks}
        if differing:
            listing = ", ".join(f"rank {r}: {v}" for r, v in enumerate(every))
            raise ProcessSetError(f"add_process_set was called with different ranks on different ranks "
                                  f"({listing}); every rank must add the same sets in the same order")
        if not ranks or ranks[-1] >= self.world_size:
            raise ProcessSetError(f"process set ranks {ranks} must be non-empty and below the world size "
                                  f"{self.world_size}")
        agreed = {i: s for i, s in self._sets.items() if not s.members_only}  # the sets every rank has
        if ranks == list(range(self.world_size)) or any(s.ranks == ranks for s in agreed.values()):
            raise ProcessSetError(f"Attempted to add a duplicate process set: a set with ranks {ranks} is "
                                  "already registered")
        set_id = next(i for i in range(1, len(agreed) + 2) if i not in agreed)
        included = self.world_rank in ranks
        comm = self._world.Split(0 if included else _undefined(), self.world_rank)
        return self._register(process_set, set_id, ranks, comm if included else None)

    def _register(self, process_set: ProcessSet, set_id: int, ranks: list[int], comm) -> ProcessSet:
        if comm is not None:
            self._members[set_id] = Member(set_id, ranks, self.world_rank,
                                           self._build(comm, ranks, f"process set {set_id}"))
        process_set.ranks = ranks
        process_set.process_set_id = set_id
        process_set._table = self
        self._sets[set_id] = process_set
        return process_set

    def _add_members_only(self, process_set: ProcessSet) -> ProcessSet:
        """Register ``process_set`` among its own ranks only (every one of them calls it, the others need
        not): agree on the ranks and the id point to point, then create the communicator over the members."""
        from mpi4py import MPI

        ranks = self._local_ranks_of(process_set)
        if not ranks or ranks[-1] >= self.world_size:
            raise ProcessSetError(f"process set ranks {ranks} must be non-empty and below the world size "
                                  f"{self.world_size}")
        if self.world_rank not in ranks:
            raise ProcessSetError(
                f"add_process_set(members_only=True): rank {self.world_rank} is not in {ranks}; only the set's "
                "ranks call it (the others skip it), or register it on every rank without members_only")
        every = self._agree_members(ranks)
        differing = {r: v for r, (v, _) in every.items() if v != ranks}
        if differing:
            listing = ", ".join(f"rank {r}: {v}" for r, (v, _) in every.items())
            raise ProcessSetError(f"add_process_set(members_only=True) was called with different ranks on the "
                                  f"set's ranks ({listing}); each member must add the same sets in the same order")
        set_id = max(next_id for _, next_id in every.values())
        self._next_members_only = set_id + 1
        world_group = self._world.Get_group()
        group = world_group.Incl(ranks)
        try:
            comm = self._world.Create_group(group, _CREATE_TAG)
        finally:
            group.Free()
            world_group.Free()
        assert comm != MPI.COMM_NULL
        process_set.members_only = True
        return self._register(process_set, set_id, ranks, comm)

    def _agree_members(self, ranks: list[int]) -> dict[int, tuple[list[int], int]]:
        """Every member's (ranks, next free members-only id), this rank's included, exchanged point to point
        with the other members of ``ranks``. Bounded by commlib's deadline: a member that never calls
        ``add_process_set`` is then an error naming it (PeerLostError), not a hang."""
        comm = self._world
        what = ("add_process_set(members_only=True)'s agreement on the set's ranks (every rank of the set must "
                "call it)")
        mine = np.full(self.world_size + 2, -1, np.int64)
        mine[0], mine[1] = len(ranks), self._next_members_only
        mine[2:2 + len(ranks)] = ranks
        peers = [r for r in ranks if r != self.world_rank]
        theirs = {peer: np.empty_like(mine) for peer in peers}
        receives = [comm.Irecv(theirs[peer], peer, _AGREE_TAG) for peer in peers]
        sends = [comm.Isend(mine, peer, _AGREE_TAG) for peer in peers]
        if peers:
            self._deadline.wait(receives + sends, comm, what, peers=peers + peers)
        every = {self.world_rank: (list(ranks), self._next_members_only)}
        for peer, message in theirs.items():
            count = int(message[0])
            every[peer] = (message[2:2 + count].tolist(), int(message[1]))
        return dict(sorted(every.items()))

    def _local_ranks_of(self, process_set: ProcessSet) -> list[int]:
        """The world ranks of a set given by its ranks or by a communicator this rank is in (no other rank
        is asked: a members-only set's ranks all hold the communicator)."""
        if process_set.ranks is not None:
            return list(process_set.ranks)
        from mpi4py import MPI

        comm = process_set.mpi_comm
        if comm == MPI.COMM_NULL:
            raise ProcessSetError("add_process_set(members_only=True): this rank is not in the ProcessSet's "
                                  "communicator; only the set's ranks call it")
        return self._world_ranks_of(comm)

    def _world_ranks_of(self, comm) -> list[int]:
        """The world ranks of ``comm``'s ranks (this rank is in ``comm``), sorted."""
        from mpi4py import MPI

        group, world = comm.Get_group(), self._world.Get_group()
        try:
            translated = MPI.Group.Translate_ranks(group, list(range(comm.Get_size())), world)
        finally:
            group.Free()
            world.Free()
        if any(t == MPI.UNDEFINED for t in translated):
            raise ProcessSetError("the communicator of this ProcessSet has ranks outside commlib's world")
        return sorted(translated)

    def _agree(self, ranks: list[int]) -> list[list[int]]:
        """Every rank's ``ranks``, gathered over the world. Bounded by commlib's deadline: a rank that never
        calls ``add_process_set`` is then an error naming it (PeerLostError), not a hang."""
        comm = self._world
        what = "add_process_set's agreement on the set's ranks (every rank must call add_process_set)"
        counts = np.zeros(self.world_size, np.int64)
        self._deadline.wait([comm.Iallgather(np.array([len(ranks)], np.int64), counts)], comm, what)
        gathered = np.zeros(int(counts.sum()), np.int64)
        self._deadline.wait([comm.Iallgatherv(np.array(ranks, np.int64), [gathered, counts])], comm, what)
        ends = np.cumsum(counts)
        return [gathered[end - count:end].tolist() for count, end in zip(counts, ends)]

    def remove(self, process_set: ProcessSet) -> bool:
        """Unregister ``process_set`` (every rank calls it, in the same order; for a members-only set, its
        ranks); False for the global set or a set that is not registered. Its pending operations fail."""
        set_id = process_set.process_set_id
        if set_id in (None, 0) or self._sets.get(set_id) is not process_set:
            return False
        del self._sets[set_id]
        member = self._members.pop(set_id, None)
        if member is not None:
            member.close()
        process_set.process_set_id = None
        process_set._table = None
        process_set.members_only = False
        return True

    def _ranks_of(self, process_set: ProcessSet) -> list[int]:
        if process_set.ranks is not None:
            return list(process_set.ranks)
        comm = process_set.mpi_comm  # translate the communicator's ranks into world ranks, on every rank
        from mpi4py import MPI

        mine = self._world_ranks_of(comm) if comm != MPI.COMM_NULL else -1
        # ranks outside the communicator learn its ranks from those inside
        found = [r for r in self._world.allgather(mine) if r != -1]
        if not found or any(r != found[0] for r in found):
            raise ProcessSetError(f"ProcessSet communicators differ between ranks: {found}")
        return found[0]

    def close(self, leaving: bool = False) -> None:
        """Close every set's member (the world last); registered sets become unregistered."""
        errors = []
        for set_id in sorted(self._members, reverse=True):
            try:
                self._members[set_id].close(leaving=leaving)
            except CommlibError as exc:  # close the others all the same
                errors.append(exc)
        for process_set in self._sets.values():
            process_set.process_set_id = None
            process_set._table = None
            process_set.members_only = False
        self._sets.clear()
        self._members.clear()
        if errors:
            raise errors[0]


def _undefined():
    from mpi4py import MPI

    return MPI.UNDEFINED
