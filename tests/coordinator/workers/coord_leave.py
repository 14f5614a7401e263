"""A rank that leaves or stops answering: every other rank gets an error naming it, within a bound.

argv: case [rank that leaves, default the last].
- exit: the last rank returns early with sys.exit(0) (no shutdown()): the exit hook tells the others.
- raise: the last rank dies of an uncaught exception (the job then fails; the others must have been told).
- join: the others wait in join() while the last rank leaves instead of joining: their join fails.
- hold: the last rank holds the GIL for 8 s (it cannot answer rounds); with COMMLIB_STALL_SHUTDOWN_TIME set
  the others give up on it and, on waking, it fails too instead of deciding from an abandoned round. The
  others then wait for it to report before they exit (after a lost peer a process ends the job with
  MPI_Abort at exit, docs/failures.md, which would kill it first).
The other ranks keep calling allreduce, print the seconds from the failing call to the error, then check
that the next call fails too and shut down.
"""

import ctypes
import sys
import time

import numpy as np

import commlib as cl

case, leave_at = sys.argv[1], 5
cl.init()
rank, size = cl.rank(), cl.size()
last = int(sys.argv[2]) if len(sys.argv) > 2 else size - 1

if case == "join":  # the others wait in join() for a rank that leaves instead of joining
    if rank == last:
        got = cl.allreduce(np.ones(2, np.float32), op=cl.Sum, name="lonely")
        assert np.all(got == 1), got  # the joined ranks contribute zeros
        sys.exit(0)
    started = time.monotonic()
    try:
        cl.join()
    except cl.CommlibError as exc:
        print(f"rank {rank}: error after {time.monotonic() - started:.2f} s in join: {exc}", flush=True)
        assert f"rank {last} left" in str(exc), exc
    else:
        raise AssertionError(f"rank {rank}: join returned")
    cl.shutdown()
    print(f"rank {rank}: leave case join OK", flush=True)
    raise SystemExit(0)

for step in range(10000):
    if rank == last and step == leave_at:
        if case == "exit":
            sys.exit(0)
        if case == "raise":
            raise RuntimeError("rank leaves by an uncaught exception")
        if case == "hold":
            ctypes.PyDLL(None).sleep(8)  # holds the GIL: commlib's background thread cannot run
    started = time.monotonic()
    try:
        got = cl.allreduce(np.full(4, rank + 1, np.float32), op=cl.Sum, name="grad")
    except cl.CommlibError as exc:
        text = str(exc)
        print(f"rank {rank}: error after {time.monotonic() - started:.2f} s at step {step}: {text}", flush=True)
        if rank != last:
            assert f"rank(s) [{last}]" in text or f"rank {last}" in text, text
        break
    assert np.all(got == size * (size + 1) / 2), got
else:
    raise AssertionError(f"rank {rank}: no error")
try:
    cl.allreduce(np.ones(4, np.float32), name="after")
except cl.CommlibError as exc:
    print(f"rank {rank}: next call failed too: {exc}", flush=True)
else:
    raise AssertionError(f"rank {rank}: the call after the error succeeded")
cl.shutdown()
print(f"rank {rank}: leave case {case} OK", flush=True)
if case == "hold" and rank != last:
    time.sleep(8)
