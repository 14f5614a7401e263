"""Deadlines on every wait for a peer: MPI requests polled until done, a timeout, or a lost peer.

MPI's blocking calls cannot be interrupted: a rank inside ``MPI_Recv`` or ``MPI_Allreduce`` whose peer
is behind a cut link waits forever, spinning a core. So commlib never blocks in MPI. Every operation is
started nonblocking (``Isend``/``Irecv``, ``Iallreduce``, ``Ibcast``, ``Iallgatherv``, ``Ialltoallv``,
``Ibarrier``) and :meth:`Deadline.wait` polls it with ``MPI_Testall`` (which also drives MPI's
progress) until it completes or ``timeout_s`` has passed; then it raises :class:`PeerLostError` naming
the peers the rank waited for and what it was doing. A stuck request is abandoned, never freed: its
buffer may still be written, so the runtime is unusable from then on, and every later wait on any
transport sharing the deadline raises the same error at once (``lost``).

How a wait waits (measured in time since the wait began, as :mod:`commlib.coordinator.backoff`):
``SPIN`` polls back to back (a small message between ranks of one host completes within them), then a
poll and ``sched_yield`` in turn until ``YIELD_S`` (a reply from another host, a large transfer still
making progress, ranks that outnumber the cores waiting their turn: MPI progresses only inside its calls,
so a sleeping rank slows a live transfer; and where the wait is for a peer that shares the cores,
sleeping costs more than the yields it saves; docs/results/design_choices.md), then a poll and a sleep, longer and longer up to ``MAX_SLEEP_S``: a rank waiting on a dead link uses a
few percent of a core, not all of it. A *patient* wait (inside :func:`patiently`: the engine's bulk
allreduces across hosts) sleeps between polls already after ``PATIENT_YIELD_S``: such a transfer lasts
tens to hundreds of ms, mostly while the framework computes the next gradients on the same cores, and a
yielding poll competes with that compute for all of it.
Every ``WATCH_S`` of sleeping the ``watch`` hook runs (the
coordinator reads its peers' notices there: a peer that lost a rank says so, and this rank's wait
fails at once, naming that rank instead of the peer it waited for). A wait that runs out of time tells
the others whom it suspects, then keeps listening for ``GRACE_S`` more (at most a quarter of the
timeout) before it blames them: in a ring a rank waits for a neighbour that itself waits for the lost
rank, both run out of time within moments of each other, and the neighbour, which ignores a suspicion
of itself, tells the rank whom to blame. (Under elastic in-process recovery the coordinator tells no one:
a send to a dead rank can crash the sender, and the elastic driver sorts out whom to blame.)
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from typing import Callable, Sequence

from mpi4py import MPI

from ..errors import PeerLostError

SPIN = 32              # back-to-back polls before the first yield
YIELD_S = 1.0          # poll and yield the core until this long into a wait
MAX_SLEEP_S = 1e-3     # the longest sleep between polls after that
MIN_SLEEP_S = 20e-6
PATIENT_YIELD_S = 5e-4  # a patient wait (patiently) yields this long, then sleeps between polls,
PATIENT_SLEEP_S = 2e-4  # at most this long each time, until YIELD_S
WATCH_S = 0.1          # how often the watch hook runs while sleeping
GRACE_S = 1.0          # after the timeout, how long a wait still listens for a peer's notice

_testall = MPI.Request.Testall
_yield_core = getattr(os, "sched_yield", lambda: time.sleep(0))
_monotonic = time.monotonic
_waits = threading.local()   # .patient: this thread's waits are of a bulk transfer (see patiently)


@contextlib.contextmanager
def patiently():
    """The waits of this thread, inside the block, are of a bulk transfer across hosts: after
    ``PATIENT_YIELD_S`` of yielding they sleep between polls (at most ``PATIENT_SLEEP_S``) and leave the
    core to the framework's compute, where a yielding poll would keep competing with it for the whole
    transfer. A sleep that short costs such a transfer nothing measurable (the kernel's socket buffers
    hold far more than 200 us of a link), while short waits - a peer on the same host, a small message -
    stay yielding: sleeping there cost the 160-tensor training step 10-20%."""
    before = getattr(_waits, "patient", False)
    _waits.patient = True
    try:
        yield
    finally:
        _waits.patient = before


class Deadline:
    """The time limit of every wait of one runtime's transports, and the first peer loss they met.

    ``timeout_s``: the longest wait (``math.inf``: none). ``world``: the group whose ranks errors name
    (the runtime's communicator; default MPI.COMM_WORLD's). ``hosts``: host name per rank of ``world``,
    for messages. ``watch``: called every ``WATCH_S`` while a wait sleeps; it may raise
    :class:`PeerLostError` to end the wait (set by the coordinator)."""

    def __init__(self, timeout_s: float = math.inf, world: "MPI.Group | None" = None,
                 hosts: Sequence[str] | None = None):
        self.timeout_s = float(timeout_s)
        self._world = world
        self._hosts = list(hosts) if hosts is not None else None
        self.lost: PeerLostError | None = None
        self.watch: Callable[[Sequence[int] | None], None] | None = None

    # -- waiting ----------------------------------------------------------------------------------------
    def wait(self, requests: list, comm: "MPI.Comm", what: str, peers: Sequence[int] | None = None) -> None:
        """Return when every request of ``requests`` (MPI requests on ``comm``) has completed; raise
        :class:`PeerLostError` after ``timeout_s``. ``peers``: the ranks of ``comm`` waited for (None:
        every other rank, as for a collective); ``what`` names the operation in the error."""
        if len(requests) == 1:  # Test on the request: a third cheaper than Testall on a list of one
            test = requests[0].Test
            for _ in range(SPIN):
                if test():
                    return
            self._poll(test, requests, comm, what, peers)
            return
        for _ in range(SPIN):
            if _testall(requests):
                return
        self._poll(lambda: _testall(requests), requests, comm, what, peers)

    def wait_quietly(self, request: "MPI.Request", comm: "MPI.Comm", what: str, peers: Sequence[int]) -> None:
        """:meth:`wait` for one request without the ``watch`` hook: for the control channel's own
        receives (the watch reads that channel)."""
        if not request.Test():
            self._poll(request.Test, [request], comm, what, peers, watch=False)

    def _poll(self, done: Callable[[], bool], requests: list, comm: "MPI.Comm", what: str,
              peers: Sequence[int] | None, watch: bool = True) -> None:
        """The waiting past the first polls: yield, then sleep, watch, and give up after the timeout."""
        if self.lost is not None:
            raise self.lost
        start = _monotonic()
        limit = start + self.timeout_s
        grace = limit + min(GRACE_S, self.timeout_s / 4)
        next_watch = start + YIELD_S + WATCH_S
        suspects = None
        patient = getattr(_waits, "patient", False)
        while True:
            if done():
                return
            now = _monotonic()
            waited = now - start
            if waited < YIELD_S:
                if patient and waited >= PATIENT_YIELD_S:
                    time.sleep(min(PATIENT_SLEEP_S, max(MIN_SLEEP_S, (waited - PATIENT_YIELD_S) / 8)))
                else:
                    _yield_core()
                continue
            if now >= next_watch or now >= limit:
                next_watch = now + WATCH_S
                if self.lost is not None:
                    raise self.lost
                if watch and self.watch is not None:
                    if now >= limit and suspects is None:  # told once: the others may be waiting for them
                        suspects = self.world_ranks(comm, self._pending(requests, peers) or self._others(comm))
                    try:
                        self.watch(suspects)
                        suspects = suspects and []
                    except PeerLostError as exc:
                        self.lose(exc)
                        raise
                if now >= grace:
                    raise self.expired(comm, what, self._pending(requests, peers), limit - start)
            time.sleep(min(MAX_SLEEP_S, max(MIN_SLEEP_S, (waited - YIELD_S) / 8)))

    @staticmethod
    def _others(comm: "MPI.Comm") -> list[int]:
        me = comm.Get_rank()
        return [r for r in range(comm.Get_size()) if r != me]

    @staticmethod
    def _pending(requests: list, peers: Sequence[int] | None) -> Sequence[int] | None:
        """The peers of the requests still pending, when ``peers`` gives one per request (else as given)."""
        if peers is None or len(peers) != len(requests):
            return peers
        pending = [peer for request, peer in zip(requests, peers) if peer is not None and not request.Get_status()]
        return pending or None

    # -- what failed --------------------------------------------------------------------------------------
    def world_ranks(self, comm: "MPI.Comm", ranks: Sequence[int]) -> list[int]:
        """``ranks`` of ``comm`` as ranks of the world group (the runtime's communicator)."""
        world = self._world if self._world is not None else MPI.COMM_WORLD.Get_group()
        translated = MPI.Group.Translate_ranks(comm.Get_group(), list(ranks), world)
        return [r if r != MPI.UNDEFINED else -1 for r in translated]

    def describe(self, world_ranks: Sequence[int]) -> str:
        """``rank 2 (host h1)``, or ``ranks [1, 2] (hosts h0, h1)``."""
        ranks = list(world_ranks)
        hosts = ""
        if self._hosts is not None and all(0 <= r < len(self._hosts) for r in ranks):
            names = list(dict.fromkeys(self._hosts[r] for r in ranks))
            hosts = f" (host{'s' if len(names) > 1 else ''} {', '.join(names)})"
        return (f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}") + hosts

    def expired(self, comm: "MPI.Comm", what: str, peers: Sequence[int] | None, waited: float) -> PeerLostError:
        """The error of a wait that ran out of time; remembered in ``lost``."""
        me = comm.Get_rank()
        if peers is None:
            peers = self._others(comm)
        ranks = sorted(set(self.world_ranks(comm, peers)))
        own = self.world_ranks(comm, [me])[0]
        error = PeerLostError(
            f"rank {own} waited {waited:.1f} s (COMMLIB_TIMEOUT={self.timeout_s:g}) for {self.describe(ranks)} "
            f"in {what}, which never answered: the link to it is down, or its host is frozen or gone. The "
            "job cannot continue: end it (the launcher stops the other ranks) or, with elastic training, "
            "rebuild without it", ranks=ranks, what=what)
        self.lose(error)
        return error

    def lose(self, error: PeerLostError) -> None:
        """Record the first peer loss: every later wait raises it at once."""
        if self.lost is None:
            self.lost = error
            unlink_mapped_shared_memory()  # while this process still can: the launcher may kill it next


def unlink_mapped_shared_memory(prefix: str = "/dev/shm/mpich_shm_") -> list[str]:
    """Remove the names of the shared-memory files MPI mapped into this process (MPICH's node segments),
    once a peer is lost: the job then ends through ``MPI_Abort`` or a launcher's kill, and neither cleans
    them up (each would stay in /dev/shm).
    The mappings themselves stay valid for every process that has one. Returns the paths removed."""
    removed = []
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6}
    except OSError:  # not Linux: nothing known to remove
        return removed
    for path in sorted(p for p in paths if p.startswith(prefix)):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:  # already removed by a peer on the node
            pass
    return removed
