"""A rank that leaves or stops answering: every other rank gets an error naming it.

argv: case [rank that leaves, default the last].
- exit: the leaving rank returns early with sys.exit(0) (no shutdown()): the exit hook tells the others.
- raise: the leaving rank dies of an uncaught exception (the job then fails; the others must have been told).
- join: the others wait in join() while the leaving rank leaves instead of joining: their join fails.
- hold: the last rank holds the GIL for 8 s (it cannot answer rounds); with COMMLIB_STALL_SHUTDOWN_TIME set
  the others give up on it and, on waking, it fails too (their notices name it, which a rank takes as a
  suspicion it need not act on: it decides the abandoned round and fails once its wait runs out). The
  others then wait for it to report (a marker file, ``COORD_LEAVE_MARKER``) before they exit (after a lost
  peer a process ends the job with MPI_Abort at exit, docs/failures.md, which would kill it first).
- quiet: as hold, but the last rank first sleeps 2 s (its background thread answers the others' round
  announcing the step's tensor, which it has not submitted), then holds the GIL for 12 s: it went silent
  between rounds, with no round open. With COMMLIB_TIMEOUT set the others start an empty round while they
  wait, the last rank leaves it unanswered, and they give up on it within the timeout.
The other ranks keep calling allreduce until it fails, naming the rank that left, then check that the next
call fails too and shut down: named cases (tests/spmd.py) on every rank but the one that leaves (in
``hold``, on every rank). Each error is printed with the seconds from the failing call to it.
"""

import ctypes
import os
import sys
import time

import numpy as np

import commlib as cl
import spmd

CASE, LEAVE_AT = sys.argv[1], 5
HOLD_S = 12  # quiet: how long the last rank holds the GIL
RANK, SIZE = spmd.rank_and_size()
LAST = int(sys.argv[2]) if len(sys.argv) > 2 else SIZE - 1


def leave() -> None:
    """The leaving rank (exit, raise, join): what the others must notice is that it is gone."""
    cl.init()
    if CASE == "join":
        got = cl.allreduce(np.ones(2, np.float32), op=cl.Sum, name="lonely")
        assert np.all(got == 1), got  # the joined ranks contribute zeros
        sys.exit(0)
    for _ in range(LEAVE_AT):
        got = cl.allreduce(np.full(4, RANK + 1, np.float32), op=cl.Sum, name="grad")
        assert np.all(got == SIZE * (SIZE + 1) / 2), got
    if CASE == "exit":
        sys.exit(0)
    raise RuntimeError("rank leaves by an uncaught exception")


@spmd.case
def init():
    cl.init()


@spmd.case
def join_fails_naming_the_rank_that_left():
    started = time.monotonic()
    try:
        cl.join()
    except cl.CommlibError as exc:
        print(f"rank {RANK}: error after {time.monotonic() - started:.2f} s in join: {exc}", flush=True)
        assert f"rank {LAST} left" in str(exc), exc
    else:
        raise AssertionError(f"rank {RANK}: join returned")


@spmd.case
def a_call_fails_naming_the_rank_that_left():
    for step in range(10000):
        if RANK == LAST and step == LEAVE_AT and CASE == "hold":  # this rank cannot answer for 8 s
            ctypes.PyDLL(None).sleep(8)  # holds the GIL: commlib's background thread cannot run
        if RANK == LAST and step == LEAVE_AT and CASE == "quiet":
            time.sleep(2)  # the others' round with this step's tensor completes (answered with nothing)
            ctypes.PyDLL(None).sleep(HOLD_S)
        started = time.monotonic()
        try:
            got = cl.allreduce(np.full(4, RANK + 1, np.float32), op=cl.Sum, name="grad")
        except cl.CommlibError as exc:
            text = str(exc)
            print(f"rank {RANK}: error after {time.monotonic() - started:.2f} s at step {step}: {text}", flush=True)
            if RANK != LAST:
                assert f"rank(s) [{LAST}]" in text or f"rank {LAST}" in text, text
            return
        assert np.all(got == SIZE * (SIZE + 1) / 2), got
    raise AssertionError(f"rank {RANK}: no error")


@spmd.case
def the_next_call_fails_too():
    try:
        cl.allreduce(np.ones(4, np.float32), name="after")
    except cl.CommlibError as exc:
        print(f"rank {RANK}: next call failed too: {exc}", flush=True)
    else:
        raise AssertionError(f"rank {RANK}: the call after the error succeeded")


@spmd.case
def shutdown():
    cl.shutdown()


if __name__ == "__main__":
    if CASE == "join":
        leave() if RANK == LAST else spmd.main(["init", "join_fails_naming_the_rank_that_left", "shutdown"])
    elif CASE in ("exit", "raise") and RANK == LAST:
        leave()
    else:
        spmd.main(["init", "a_call_fails_naming_the_rank_that_left", "the_next_call_fails_too", "shutdown"])
        if CASE in ("hold", "quiet"):
            marker = os.environ["COORD_LEAVE_MARKER"]
            if RANK == LAST:
                with open(marker, "w"):
                    pass
            else:
                deadline = time.monotonic() + HOLD_S + 30
                while not os.path.exists(marker) and time.monotonic() < deadline:
                    time.sleep(0.05)
