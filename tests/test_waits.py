"""How a transport waits: a patient wait (a bulk transfer across hosts) sleeps between polls and leaves
the core to the framework; any other wait yields. One process, an MPI generalized request that another
thread completes later."""

from __future__ import annotations

import math
import threading
import time

import pytest
from mpi4py import MPI

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
