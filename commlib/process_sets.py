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
"""

from __future__ import annotations

import itertools
from typing import Callable, Sequence

import numpy as np

from .coordinator.requests import AUTO_NAME_MARK
from .errors import CommlibError, ProcessSetError


class ProcessSet:
    """A set of world ranks. Create it with a list of ranks (or an mpi4py communicator whose ranks are
    all in the world); register it with ``commlib.add_process_set``.

    Example::

        evens = cl.add_process_set(range(0, cl.size(), 2))
        if evens.included():
            total = cl.allreduce(x, op=cl.Sum, process_set=evens)
    """

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

    def add(self, process_set: ProcessSet | Sequence[int]) -> ProcessSet:
        """Register ``process_set`` (collective over the world: every rank, same ranks, same order)."""
        if not isinstance(process_set, ProcessSet):
            process_set = ProcessSet(process_set)
        if process_set.process_set_id is not None:
            raise ProcessSetError(f"{process_set} is already registered")
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
        if ranks == list(range(self.world_size)) or any(s.ranks == ranks for s in self._sets.values()):
            raise ProcessSetError(f"Attempted to add a duplicate process set: a set with ranks {ranks} is "
                                  "already registered")
        set_id = next(i for i in range(1, len(self._sets) + 2) if i not in self._sets)
        included = self.world_rank in ranks
        comm = self._world.Split(0 if included else _undefined(), self.world_rank)
        if included:
            self._members[set_id] = Member(set_id, ranks, self.world_rank,
                                           self._build(comm, ranks, f"process set {set_id}"))
        process_set.ranks = ranks
        process_set.process_set_id = set_id
        process_set._table = self
        self._sets[set_id] = process_set
        return process_set

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
        """Unregister ``process_set`` (every rank calls it, in the same order); False for the global set
        or a set that is not registered. Its pending operations fail."""
        set_id = process_set.process_set_id
        if set_id in (None, 0) or self._sets.get(set_id) is not process_set:
            return False
        del self._sets[set_id]
        member = self._members.pop(set_id, None)
        if member is not None:
            member.close()
        process_set.process_set_id = None
        process_set._table = None
        return True

    def _ranks_of(self, process_set: ProcessSet) -> list[int]:
        if process_set.ranks is not None:
            return list(process_set.ranks)
        comm = process_set.mpi_comm  # translate the communicator's ranks into world ranks, on every rank
        from mpi4py import MPI

        mine = -1
        if comm != MPI.COMM_NULL:
            group, world = comm.Get_group(), self._world.Get_group()
            try:
                translated = MPI.Group.Translate_ranks(group, list(range(comm.Get_size())), world)
            finally:
                group.Free()
                world.Free()
            if any(t == MPI.UNDEFINED for t in translated):
                raise ProcessSetError("the communicator of this ProcessSet has ranks outside commlib's world")
            mine = sorted(translated)
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
        self._sets.clear()
        self._members.clear()
        if errors:
            raise errors[0]


def _undefined():
    from mpi4py import MPI

    return MPI.UNDEFINED
