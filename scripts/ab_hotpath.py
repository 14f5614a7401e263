"""A/B of two commlib trees on the hot path: a 4 KiB named allreduce_ and a 64 MiB allreduce_, 2 ranks on
one host, jobs of A and B interleaved round by round (each round starts with the next tree).

    python scripts/ab_hotpath.py --a /path/to/base/tree --b . [--rounds 6] [--small-calls 3000]

Each job imports commlib from its tree (PYTHONPATH; the tree's C extensions built in place) and prints
the median time per call over blocks of calls after a barrier (the slower rank's). The summary gives the
median over rounds per tree and the ratio B/A. Run it under the timing lock:
``flock /tmp/commlib-timing.lock python scripts/ab_hotpath.py ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, statistics, sys, time
import numpy as np
import commlib as cl
from mpi4py import MPI
small_calls, large_calls = int(sys.argv[1]), int(sys.argv[2])
cl.init()
comm = MPI.COMM_WORLD
def timed(fn, calls, blocks=5):
    fn(); fn()
    times = []
    for _ in range(blocks):
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append(comm.allreduce((time.perf_counter() - start) / calls, op=MPI.MAX))
    return statistics.median(times)
small = np.ones(1024, np.float32)
large = np.ones((64 << 20) // 4, np.float32)
result = {"small_us": timed(lambda: cl.allreduce_(small, name="small"), small_calls) * 1e6,
          "large_ms": timed(lambda: cl.allreduce_(large, name="large"), large_calls) * 1e3,
          "commlib": cl.__file__}
cl.shutdown()
if comm.rank == 0:
    print("RESULT " + json.dumps(result), flush=True)
"""


def run_job(tree: Path, mpiexec: str, small_calls: int, large_calls: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMLIB_")}
    env["PYTHONPATH"] = str(tree)
    out = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", WORKER, str(small_calls), str(large_calls)],
                         env=env, capture_output=True, text=True, timeout=600, cwd="/")
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[7:])
            if not result["commlib"].startswith(str(tree)):
                raise SystemExit(f"job imported {result['commlib']}, not the tree {tree}")
            return result
    raise SystemExit(f"job on {tree} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, type=Path, help="the base tree")
    parser.add_argument("--b", required=True, type=Path, help="the changed tree")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--small-calls", type=int, default=3000)
    parser.add_argument("--large-calls", type=int, default=10)
    args = parser.parse_args()
    mpiexec = str(Path(sys.executable).with_name("mpiexec"))
    trees = {"A": args.a.resolve(), "B": args.b.resolve()}
    results = {"A": [], "B": []}
    for i in range(args.rounds):
        order = ["A", "B"] if i % 2 == 0 else ["B", "A"]
        for side in order:
            res = run_job(trees[side], mpiexec, args.small_calls, args.large_calls)
            results[side].append(res)
            print(f"round {i} {side}: 4 KiB {res['small_us']:.1f} us, 64 MiB {res['large_ms']:.2f} ms", flush=True)
    for key, unit in (("small_us", "us"), ("large_ms", "ms")):
        a = statistics.median(r[key] for r in results["A"])
        b = statistics.median(r[key] for r in results["B"])
        spread = lambda side: (min(r[key] for r in results[side]), max(r[key] for r in results[side]))
        print(f"{key}: A median {a:.2f} {unit} {spread('A')}, B median {b:.2f} {unit} {spread('B')}, "
              f"B/A {b / a:.3f}")


if __name__ == "__main__":
    main()
