"""A synchronous call with nothing else under way runs by the coordinator's lone path (its own thread, the
round decided without the ready table); it must give what the general cycle gives, driven by a waiting
thread (``synchronize``) or by the background thread (``poll`` until done): the same results, bit for bit,
and the same errors.

argv: scenario.
- results: allreduces of every dtype, size and op, each called synchronously (the lone path, once the
  name is negotiated) and asynchronously both ways, on the same inputs; also with a priority (which the
  lone path leaves to the cycle) and on a process set of ranks 0 and 1 (3 ranks).
- mismatch: a name negotiated before, then submitted with another shape on the last rank: the error
  every rank raises names the shape of each rank, whichever path each rank took; commlib goes on.
- leave: the last rank returns without shutdown() after a few calls; every other rank's next synchronous
  call fails naming it (asynchronous with ``leave background``). The error is printed for the test.
"""

import sys
import time

import ml_dtypes
import numpy as np

import commlib as cl
import spmd
from commlib import lifecycle

SCENARIO = sys.argv[1]
HOW = sys.argv[2] if len(sys.argv) > 2 else "sync"
RANK, SIZE = spmd.rank_and_size()
CALLS = 5


def coordinator(process_set=None):
    return lifecycle.current().sets.member(process_set).coordinator


def background(handle):
    """Wait without driving: the background thread runs the cycle (poll drives nothing)."""
    while not cl.poll(handle):
        time.sleep(1e-4)
    return cl.synchronize(handle)


def three_ways(make, name, **kwargs):
    """(sync, waiter-driven, background-driven) results of CALLS calls each on ``make(i)``'s arrays."""
    out = {"sync": [], "wait": [], "background": []}
    for i in range(CALLS):
        out["sync"].append(cl.allreduce_(make(i), name=f"{name}.sync", **kwargs).copy())
        out["wait"].append(cl.synchronize(cl.allreduce_async_(make(i), name=f"{name}.wait", **kwargs)).copy())
        out["background"].append(background(cl.allreduce_async_(make(i), name=f"{name}.bg", **kwargs)).copy())
    return out


def assert_same(out, label):
    for way in ("wait", "background"):
        for i, (a, b) in enumerate(zip(out["sync"], out[way])):
            assert a.dtype == b.dtype and a.shape == b.shape, (label, way, i, a.dtype, b.dtype)
            assert a.tobytes() == b.tobytes(), f"{label}: call {i} differs between sync and {way}: {a} {b}"


@spmd.case
def init():
    cl.init()


@spmd.case
def results_match_every_dtype_size_and_op():
    if SCENARIO != "results":
        spmd.skip("results scenario")
    before = coordinator().alone
    dtypes = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int32, np.int64, np.uint8]
    for dtype in dtypes:
        for count in (1, 17, 1000, 70000):
            for op in (cl.Sum, cl.Average, cl.Min, cl.Max, cl.Product):
                if op is cl.Average and np.dtype(dtype).kind in "iu":
                    continue

                def make(i, dtype=dtype, count=count):
                    rng = np.random.default_rng(1000 * i + 10 * RANK + count)
                    values = rng.uniform(1, 3, count) if op is cl.Product else rng.uniform(-50, 50, count)
                    return values.astype(dtype)
                label = f"{np.dtype(dtype).name}.{count}.{op.name}"
                assert_same(three_ways(make, label, op=op), label)
    # the lone path gives a call to the cycle when a peer takes over 2 ms to answer (a loaded machine): not
    # every call takes it, but hundreds of calls cannot all miss it
    assert coordinator().alone > before, "no call took the lone path"


@spmd.case
def a_priority_goes_to_the_cycle_and_matches():
    if SCENARIO != "results":
        spmd.skip("results scenario")
    before = coordinator().alone
    out = three_ways(lambda i: np.full(1000, RANK + i, np.float32), "prio", op=cl.Sum, priority=3)
    assert_same(out, "priority")
    assert coordinator().alone == before, "a call with a priority took the lone path"
    assert np.all(out["sync"][-1] == sum(r + CALLS - 1 for r in range(SIZE)))


@spmd.case
def a_process_set_matches():
    if SCENARIO != "results" or SIZE < 3:
        spmd.skip("results scenario on 3 or more ranks")
    pair = cl.add_process_set([0, 1])
    if RANK in (0, 1):
        before = coordinator(pair).alone
        out = three_ways(lambda i: np.arange(300, dtype=np.float64) * (RANK + 1) + i, "pair", op=cl.Sum,
                         process_set=pair)
        assert_same(out, "process set")
        assert np.allclose(out["sync"][0], np.arange(300) * 3)
        assert coordinator(pair).alone > before, "no call took the lone path"
    cl.remove_process_set(pair)


@spmd.case
def a_mismatch_is_the_same_error_on_every_path():
    if SCENARIO != "mismatch":
        spmd.skip("mismatch scenario")
    texts = {}
    for way in ("sync", "wait", "background"):
        name = f"shape.{way}"
        for _ in range(3):  # negotiated and cached: the first ranks' next call may take the lone path
            call(way, np.ones(4, np.float32), name)
        try:
            call(way, np.ones(5 if RANK == SIZE - 1 else 4, np.float32), name)
        except cl.CollectiveError as exc:
            texts[way] = str(exc).replace(name, "NAME")
        else:
            raise AssertionError(f"{way}: no error for mismatched shapes")
        got = call(way, np.full(2, RANK, np.float32), f"after.{way}")  # commlib goes on
        assert np.all(got == sum(range(SIZE))), got
    assert len(set(texts.values())) == 1, texts
    assert "mismatched shape" in texts["sync"] and f"rank {SIZE - 1}: (5,)" in texts["sync"], texts


def call(way, array, name):
    if way == "sync":
        return cl.allreduce_(array, op=cl.Sum, name=name)
    handle = cl.allreduce_async_(array, op=cl.Sum, name=name)
    return cl.synchronize(handle) if way == "wait" else background(handle)


def leave():
    """The last rank in the leave scenario: a few calls, then it returns without shutdown() (the exit hook
    tells the others)."""
    cl.init()
    for _ in range(CALLS):
        got = call(HOW, np.full(4, RANK + 1, np.float32), "grad")
        assert np.all(got == SIZE * (SIZE + 1) / 2), got
    sys.exit(0)


@spmd.case
def a_rank_that_leaves_is_named():
    if SCENARIO != "leave":
        spmd.skip("leave scenario")
    for _ in range(CALLS):
        got = call(HOW, np.full(4, RANK + 1, np.float32), "grad")
        assert np.all(got == SIZE * (SIZE + 1) / 2), got
    try:
        for _ in range(1000):
            call(HOW, np.full(4, RANK + 1, np.float32), "grad")
    except cl.CollectiveError as exc:
        # one write, newline included: unbuffered, print() writes the line and its newline apart, and
        # another rank's line could land between them
        sys.stdout.write(f"rank {RANK} {HOW} error: {str(exc).splitlines()[0]}\n")
        sys.stdout.flush()
        assert f"rank {SIZE - 1} left" in str(exc), exc
    else:
        raise AssertionError("no error after a rank left")


@spmd.case
def shutdown():
    cl.shutdown()


if __name__ == "__main__":
    if SCENARIO == "leave" and RANK == SIZE - 1:
        leave()
    else:
        spmd.main()
