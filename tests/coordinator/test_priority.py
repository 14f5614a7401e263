"""Priority scheduling (commlib/coordinator/priority.py, DistributedOptimizer(priority=, overlap_forward=)):
the queue's rule in process, the order and results on 2 real ranks, and the torch optimizer's weights."""

import numpy as np
import pytest

from commlib.coordinator.priority import PartResponse, PriorityQueue
from commlib.coordinator.requests import Kind, Meta, Response
from mpirun import run_mpi, run_mpmd


def _response(name, count, priority, op=0, compression="none"):
    return Response(Kind.ALLREDUCE, [Meta(name, Kind.ALLREDUCE, "float32", (count,), op=op,
                                          compression=compression, priority=priority)])


class _Entry:
    def __init__(self, count):
        from commlib.coordinator.requests import Handle

        self.output = np.zeros(count, np.float32)
        self.handle = Handle("x")
        self.submitted = 0.0


def test_queue_releases_most_urgent_first_within_the_credit():
    finished = []
    queue = PriorityQueue(partition_bytes=1000, credit_bytes=1400, finish=lambda *a: finished.append(a))
    assert not queue and not PriorityQueue.wanted([_response("a", 10, 0)])
    assert PriorityQueue.wanted([_response("a", 10, 0), _response("b", 10, 2)])
    entries = {name: _Entry(count) for name, count in [("low", 1000), ("mid", 100), ("high", 10), ("tie", 10)]}
    for name, count, priority in [("low", 1000, 1), ("mid", 100, 5), ("high", 10, 9), ("tie", 10, 5)]:
        queue.push(_response(name, count, priority), [entries[name]])
    # 'low' is 4000 bytes: four partitions of 250 floats; equal priorities keep the order they were decided
    first = queue.release()
    assert [r.metas[0].name for r, _ in first] == ["high", "mid", "tie", "low.part0of4"]  # 480 bytes < 1400 <= 1480
    assert isinstance(first[3][0], PartResponse) and first[3][0].metas[0].shape == (250,)
    assert np.shares_memory(first[3][1][0].output, entries["low"].output)
    queue.push(_response("late", 10, 7), [_Entry(10)])  # decided later, still before the rest of 'low'
    second = queue.release()
    assert [r.metas[0].name for r, _ in second] == ["late", "low.part1of4", "low.part2of4"]
    third = queue.release()
    assert [r.metas[0].name for r, _ in third] == ["low.part3of4"] and not queue
    # the whole finishes (and its handle completes) when its last partition has run, in any order
    split = first[3][0].split
    for part in (third[0][0], second[2][0], first[3][0]):
        assert not entries["low"].handle.done()
        part.split.part_done(None)
    split.part_done(None)
    assert entries["low"].handle.done() and len(finished) == 1 and finished[0][2] is None


def test_queue_keeps_whole_what_cannot_be_split():
    queue = PriorityQueue(partition_bytes=100, credit_bytes=1, finish=None)
    adasum_like = _response("topk", 1000, 3, compression="topk")
    queue.push(adasum_like, [_Entry(1000)])
    assert [r for r, _ in queue.release()] == [adasum_like]


@pytest.mark.mpi
def test_order_results_and_agreement_on_two_ranks(tmp_path):
    run_mpi(2, "priority_order.py", str(tmp_path), timeout=120,
            env={"COMMLIB_TIMELINE": str(tmp_path / "trace.json"), "COMMLIB_PRIORITY_PARTITION": "256K",
                 "COMMLIB_PRIORITY_CREDIT": "1"}, cases=["the_most_urgent_runs_first_in_the_same_order_everywhere"])


@pytest.mark.mpi
def test_results_with_two_lanes(tmp_path):
    run_mpi(2, "priority_order.py", str(tmp_path), "--results-only", timeout=120,
            env={"COMMLIB_NUM_STREAMS": "2", "COMMLIB_PRIORITY_PARTITION": "256K",
                 "COMMLIB_PRIORITY_CREDIT": "600K"}, cases=["results_equal_numpy"])


@pytest.mark.mpi
def test_torch_priority_and_overlap_forward_give_the_plain_weights():
    pytest.importorskip("torch")
    run_mpi(2, "torch_priority.py", timeout=240,
            env={"PYTHONWARNINGS": "ignore::DeprecationWarning",
                 "COMMLIB_PRIORITY_PARTITION": "16K", "COMMLIB_PRIORITY_CREDIT": "32K"},
            cases=["sgd_gives_the_plain_weights", "adam_gives_the_plain_weights"])


@pytest.mark.mpi
def test_torch_priority_through_summation_servers():
    """algorithm="ps": each partition the coordinator releases is one push_pull through the server."""
    pytest.importorskip("torch")
    run_mpmd(2, 1, "torch_priority.py", "sgd", timeout=240,
             env={"PYTHONWARNINGS": "ignore::DeprecationWarning", "COMMLIB_ALGORITHM": "ps",
                  "COMMLIB_PRIORITY_PARTITION": "16K", "COMMLIB_PRIORITY_CREDIT": "32K"},
             cases=["sgd_gives_the_plain_weights"])
