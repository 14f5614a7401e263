"""Worker for tests/transport/test_failures.py: collectives in a loop while the test cuts a host's link (or stops
its processes); every rank records how its call failed.

    python link_cut.py MODE DIR

MODE: ``large`` (4 MiB allreduce_), ``1m`` (1 MiB allreduce_, as issue 23's report), ``small`` (4 KiB allreduce_: eager across hosts), ``barrier``, or
``negotiation`` (the ranks stop calling when DIR/pause appears, say so in DIR/paused.RANK, and once
DIR/go appears each calls one allreduce, whose negotiation round cannot complete).

Files in DIR: ``ready.RANK`` once the loop runs; ``result.RANK`` (JSON) when the call fails: the wall
time, the exception's type, ``ranks`` and ``what``, its message, and how long a second call took to fail
(it must fail at once, the same way). The exception is then raised again, so the process exits through
commlib's exit path (MPI_Abort after a lost peer).
"""

import json
import os
import sys
import time

import numpy as np

import commlib as cl

mode, folder = sys.argv[1], sys.argv[2]
cl.init()
rank = cl.rank()


def mark(name: str, data: str = "") -> None:
    path = os.path.join(folder, f"{name}.{rank}")
    with open(path + ".tmp", "w") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def exists(name: str) -> bool:
    return os.path.exists(os.path.join(folder, name))


big = np.ones(((1 if mode == "1m" else 4) << 20) // 4, np.float32)
small = np.ones(1024, np.float32)


def step() -> None:
    if mode in ("large", "1m"):
        cl.allreduce_(big, name="big")
    elif mode == "small":
        cl.allreduce_(small, name="small")
    elif mode == "barrier":
        cl.barrier()
    elif mode == "negotiation":  # every rank pauses after the same call: the one where some rank saw pause
        pause = cl.allreduce(np.array([1.0 if exists("pause") else 0.0]), op=cl.Max, name="pause?")
        if pause[0]:
            mark("paused")
            while not exists("go"):
                time.sleep(0.01)
            cl.allreduce_(small, name="after-the-cut")
    else:
        raise SystemExit(f"unknown mode {mode}")


calls = 0
try:
    for _ in range(5):
        step()
        calls += 1
    mark("ready", str(os.getpid()))
    while True:
        step()
        calls += 1
except cl.CollectiveError as exc:
    failed_at = time.time()
    again_start = time.monotonic()
    try:
        cl.allreduce_(small, name="after-the-failure")
        again = "returned"
    except cl.CollectiveError as second:
        again = type(second).__name__
    again_s = time.monotonic() - again_start
    mark("result", json.dumps({
        "rank": rank, "time": failed_at, "type": type(exc).__name__, "ranks": list(getattr(exc, "ranks", ())),
        "what": getattr(exc, "what", ""), "message": str(exc), "calls": calls, "again": again,
        "again_s": again_s}))
    print(f"rank {rank} failed after {calls} calls: {type(exc).__name__}: {exc}", flush=True)
    raise
