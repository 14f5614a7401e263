"""How a transport waits: a patient wait (a bulk transfer across hosts) sleeps between polls and leaves
the core to the framework; any other wait yields. One process, an MPI generalized request that another
thread completes later. And how the coordinator's background thread gathers a burst of submissions."""

from __future__ import annotations

import math
import threading
import time

import pytest
from mpi4py import MPI

from commlib.coordinator import progress
from commlib.coordinator.progress import GATHER_S, Progress, gather_limit_s
from commlib.topology import Topology
from commlib.transport.deadline import Deadline, patiently


def _cpu_share_of_a_wait(seconds: float, patient: bool) -> float:
    """The CPU time this thread spends waiting ``seconds`` for a request, over the wall time."""
    request = MPI.Grequest.Start()
    timer = threading.Timer(seconds, request.Complete)
    deadline = Deadline(timeout_s=math.inf)
    timer.start()
    try:
        wall, cpu = time.perf_counter(), time.thread_time()
        if patient:
            with patiently():
                deadline.wait([request], MPI.COMM_SELF, "a test request", [None])
        else:
            deadline.wait([request], MPI.COMM_SELF, "a test request", [None])
        return (time.thread_time() - cpu) / (time.perf_counter() - wall)
    finally:
        timer.join()


def _how_a_wait_waited(seconds: float, patient: bool, monkeypatch) -> tuple[list, int]:
    """Wait ``seconds`` for a request as :func:`_cpu_share_of_a_wait` does, recording each sleep of the
    wait (how long into the wait it came, how long it asked for) and counting its yields."""
    from commlib.transport import deadline as module

    sleeps, yields, start = [], [0], []

    class Clock:  # the module's time, recording sleeps
        @staticmethod
        def sleep(s):
            sleeps.append((module._monotonic() - start[0], s))
            time.sleep(s)

    def counted_yield():
        yields[0] += 1
        real_yield()

    real_yield = module._yield_core
    monkeypatch.setattr(module, "time", Clock)
    monkeypatch.setattr(module, "_yield_core", counted_yield)
    start.append(module._monotonic())
    _cpu_share_of_a_wait(seconds, patient)
    monkeypatch.undo()
    return sleeps, yields[0]


def test_a_patient_wait_leaves_the_core(monkeypatch):
    """Waiting 0.4 s patiently costs a small share of a core: after PATIENT_YIELD_S it sleeps between polls,
    at most PATIENT_SLEEP_S each time; an ordinary wait of the same request polls and yields instead, and
    sleeps only after YIELD_S. (What each wait does, counted, not how long it took: a loaded machine only
    lowers the patient wait's share of a core, and lengthens the waits.)"""
    from commlib.transport.deadline import PATIENT_SLEEP_S, PATIENT_YIELD_S, YIELD_S

    patient = _cpu_share_of_a_wait(0.4, patient=True)
    assert patient < 0.25, f"a patient wait used {patient:.0%} of a core"
    sleeps, _ = _how_a_wait_waited(0.4, True, monkeypatch)
    early = [(at, s) for at, s in sleeps if at < YIELD_S]
    assert early and all(at >= PATIENT_YIELD_S and s <= PATIENT_SLEEP_S for at, s in early), sleeps[:10]
    sleeps, yields = _how_a_wait_waited(0.4, False, monkeypatch)
    assert yields > 0 and all(at >= YIELD_S for at, _ in sleeps), (yields, sleeps[:10])


def test_patiently_is_per_thread_and_restored():
    """Patience holds inside the block, on the thread that entered it only, and nests."""
    from commlib.transport import deadline as module

    seen = {}

    def other():
        seen["other"] = getattr(module._waits, "patient", False)

    with patiently():
        with patiently():
            pass
        assert module._waits.patient is True
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert module._waits.patient is False and seen["other"] is False


@pytest.mark.parametrize("hosts, nbytes, bulk", [(2, 8 << 20, True), (2, (8 << 20) - 1, False),
                                                 (1, 64 << 20, False)])
def test_bulk_transfers_are_those_across_hosts(hosts, nbytes, bulk):
    """Engine._bulk: an allreduce of at least PATIENT_BYTES between hosts; never within one host."""
    from commlib.engine import PATIENT_BYTES, Engine
    from commlib.topology import Topology

    assert PATIENT_BYTES == 8 << 20
    engine = Engine.__new__(Engine)  # the decision reads the topology only
    engine.topology = Topology.from_node_ids(0, list(range(hosts)) if hosts > 1 else [0, 0])
    assert engine._bulk(nbytes) is bulk


def test_whole_bursts_are_gathered_on_one_node_without_spare_cores(monkeypatch):
    """One node whose ranks fill its cores: gather whole bursts; across nodes, or with cores to spare: one
    cycle time."""
    monkeypatch.setattr(progress.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert gather_limit_s(Topology.blocks(rank=0, size=2, local_size=2)) == GATHER_S
    assert gather_limit_s(Topology.blocks(rank=0, size=4, local_size=4)) == GATHER_S
    assert gather_limit_s(Topology.blocks(rank=0, size=2, local_size=1)) == 0.0      # 2 nodes
    assert gather_limit_s(Topology.blocks(rank=0, size=4, local_size=2)) == 0.0      # 2 nodes of 2
    monkeypatch.setattr(progress.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert gather_limit_s(Topology.blocks(rank=0, size=2, local_size=2)) == 0.0      # cores to spare


class _VirtualTime:
    """progress.py's clock and sleep, on a virtual clock that only sleeping advances: what the gathering
    does is then a function of the arrivals alone, whatever the machine's load."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _Submissions:
    """What Progress reads of a coordinator that never has work, with a count of submissions that arrive
    every 0.2 ms on ``clock`` for ``stream_s``."""

    def __init__(self, clock: _VirtualTime, stream_s: float):
        self._clock, self._stream_s = clock, stream_s

    @property
    def submitted(self) -> int:
        return int(min(self._clock.now, self._stream_s) / 2e-4)

    def has_work(self) -> bool:
        return False

    def cycle(self) -> bool:
        return False


@pytest.mark.parametrize("gather_s, stream_s, gathered_s", [
    (0.0, 0.3, 0.005),    # one cycle, however long the burst
    (1.0, 0.0, 0.005),    # nothing more arrives: one cycle
    (1.0, 0.3, 0.305),    # the whole burst, and the cycle that saw nothing more arrive
    (0.1, 2.0, 0.105),    # a cycle, then no longer than gather_s
])
def test_gathering_lasts_while_submissions_arrive(monkeypatch, gather_s, stream_s, gathered_s):
    """A cycle time of 5 ms; submissions every 0.2 ms for ``stream_s`` (on a virtual clock)."""
    clock = _VirtualTime()
    waiting = Progress(_Submissions(clock, stream_s), cycle_s=5e-3, gather_s=gather_s)
    try:
        monkeypatch.setattr(progress, "time", clock)  # the background thread, idle, reads no clock
        waiting._gather()
    finally:
        monkeypatch.undo()
        waiting.stop()
    assert clock.now == pytest.approx(gathered_s), f"gathered for {clock.now:.3f} s"
