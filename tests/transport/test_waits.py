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


def test_a_patient_wait_leaves_the_core():
    """Waiting 0.4 s patiently costs a small share of a core (it sleeps between polls); an ordinary wait
    of the same request polls and yields, and costs far more wherever the core is free."""
    patient = _cpu_share_of_a_wait(0.4, patient=True)
    assert patient < 0.25, f"a patient wait used {patient:.0%} of a core"
    ordinary = _cpu_share_of_a_wait(0.4, patient=False)
    assert ordinary > patient, (ordinary, patient)


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


class _Submissions:
    """What Progress reads of a coordinator that never has work, with a count of submissions that a
    thread raises every 0.2 ms for ``seconds``."""

    def __init__(self):
        self.submitted = 0

    def has_work(self) -> bool:
        return False

    def cycle(self) -> bool:
        return False

    def stream(self, seconds: float) -> threading.Thread:
        def run():
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                self.submitted += 1
                time.sleep(2e-4)
        thread = threading.Thread(target=run)
        thread.start()
        return thread


@pytest.mark.parametrize("gather_s, stream_s, at_least, at_most", [
    (0.0, 0.3, 0.0, 0.15),   # one cycle, however long the burst
    (1.0, 0.0, 0.0, 0.15),   # nothing more arrives: one cycle
    (1.0, 0.3, 0.3, 0.95),   # the whole burst
    (0.1, 2.0, 0.1, 0.6),    # no longer than gather_s
])
def test_gathering_lasts_while_submissions_arrive(gather_s, stream_s, at_least, at_most):
    """A cycle time of 5 ms: the submitting thread's 0.2 ms sleeps overrun it only on a stalled machine."""
    coordinator = _Submissions()
    waiting = Progress(coordinator, cycle_s=5e-3, gather_s=gather_s)
    try:
        submitter = coordinator.stream(stream_s)
        start = time.perf_counter()
        waiting._gather()
        took = time.perf_counter() - start
        submitter.join()
    finally:
        waiting.stop()
    assert at_least <= took <= at_most, f"gathered for {took:.3f} s"
