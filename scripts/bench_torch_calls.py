#!/usr/bin/env python
"""What one torch.distributed call costs on the ``commlib`` backend: its adapter against commlib's own API,
and against gloo.

    flock -x /tmp/commlib-cpu.lock .venv/bin/python scripts/bench_torch_calls.py [--ranks 2] [--bytes 4096]
        [--calls 2000] [--rounds 7] [--output FILE]

Alternating jobs of ``--ranks`` ranks on this host (one per backend, ``--rounds`` each). In a commlib job,
calls of four kinds interleave round by round: ``commlib.allreduce_`` on a numpy array (commlib's API, the
floor), ``dist.all_reduce`` (synchronous: the Work is waited for in the calling thread), ``all_reduce(...,
async_op=True).wait()``, and ``all_reduce(..., async_op=True).get_future().wait()`` (DDP's way: the future is
completed by the backend's completer thread). A gloo job times the last three. Each figure is the median
over rounds of the mean time per call; the adapter's cost is the difference to commlib's own call.

Inside a job the script runs with ``--worker``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KINDS = ("commlib.allreduce_", "dist.all_reduce", "async + wait", "async + future")


def worker(backend: str, nbytes: int, calls: int, rounds: int) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    import commlib as cl

    dist.init_process_group(backend)
    torch.set_num_threads(1)
    tensor = torch.ones(nbytes // 4)
    array = np.ones(nbytes // 4, np.float32)
    kinds = KINDS if backend == "commlib" else KINDS[1:]
    run = {
        "commlib.allreduce_": lambda: cl.allreduce_(array, op=cl.Sum, name="bench"),
        "dist.all_reduce": lambda: dist.all_reduce(tensor),
        "async + wait": lambda: dist.all_reduce(tensor, async_op=True).wait(),
        "async + future": lambda: dist.all_reduce(tensor, async_op=True).get_future().wait(),
    }
    times = {k: [] for k in kinds}
    for k in kinds:  # warm-up
        for _ in range(50):
            run[k]()
    for r in range(rounds):
        for k in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                run[k]()
            times[k].append((time.perf_counter() - start) / calls)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(times), flush=True)
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--bytes", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=2, help="jobs per backend, alternating")
    parser.add_argument("--output")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.bytes, args.calls, args.rounds)
        return 0
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMLIB_")}
    env["PYTHONPATH"] = str(REPO)
    found: dict[str, list[float]] = {}
    for job in range(args.jobs):
        for backend in (("commlib", "gloo") if job % 2 == 0 else ("gloo", "commlib")):
            done = subprocess.run([str(mpiexec), "-n", str(args.ranks), sys.executable, __file__, "--worker", backend,
                                   "--bytes", str(args.bytes), "--calls", str(args.calls), "--rounds",
                                   str(args.rounds)], capture_output=True, text=True, env=env, timeout=1800)
            line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                raise SystemExit(f"{backend} job failed:\n{(done.stdout + done.stderr)[-3000:]}")
            for kind, values in json.loads(line[7:]).items():
                found.setdefault(f"{backend}: {kind}", []).extend(values)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    floor = statistics.median(found["commlib: commlib.allreduce_"])
    lines = [f"# scripts/bench_torch_calls.py {' '.join(sys.argv[1:])}",
             f"# date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit}, "
             f"{args.ranks} ranks on one host, {args.bytes} bytes float32 SUM, {args.jobs} jobs per backend x "
             f"{args.rounds} rounds x {args.calls} calls; load average {os.getloadavg()[0]:.2f} at the end", "",
             "| call | us per call (median over rounds) | over commlib's own call |", "|---|---:|---:|"]
    for name, values in found.items():
        t = statistics.median(values)
        lines.append(f"| {name} | {t * 1e6:.1f} | {'' if name.startswith('gloo') else f'+{(t - floor) * 1e6:.1f} us'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
