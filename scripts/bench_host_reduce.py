"""push_pull with and without the reduction inside each host first (COMMLIB_SERVER_HOST_REDUCE), on the
emulated cluster: 2 worker hosts x 2 ranks and 2 server hosts, every link at --rate.

One MPMD job; the workers alternate the two modes round by round (init/shutdown per mode, which comes
first rotating), and a lossy compressor's push_pull (top-k 1% with error feedback) when --lossy is given.
Each timed call: a barrier, push_pull of --bytes float32, the slowest worker's time; median over rounds.
Bounds: a host's link carries S each way when the host reduces first (S/B), 2 S when both of its
workers push (2 S/B).

    flock /tmp/commlib-timing.lock python scripts/bench_host_reduce.py --out docs/results/servers_host_reduce_2x2.txt
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

REPO = Path(__file__).resolve().parents[1]


def worker(nbytes: int, rounds: int, lossy: bool) -> None:
    import numpy as np

    import commlib as cl

    x = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)
    modes = ["off", "on"] + (["topk"] if lossy else [])
    times: dict[str, list[float]] = {m: [] for m in modes}
    compressor = None
    for r in range(rounds + 1):  # round 0 warms up (first partitions, buffers, the servers' pools)
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for mode in order:
            cl.init(server_host_reduce="off" if mode == "topk" else mode)
            if mode == "topk" and compressor is None:
                compressor = cl.Compression.topk(0.01)
            cl.barrier()
            start = time.perf_counter()
            cl.push_pull(x, op=cl.Average, name=f"x.{mode}", compression=compressor if mode == "topk" else None)
            took = time.perf_counter() - start
            slowest = float(cl.allreduce(np.array([took]), op=cl.Max, name=f"t.{mode}.{r}", algorithm="ring")[0])
            if r:
                times[mode].append(slowest)
            cl.shutdown()
    cl.init(server_host_reduce="auto")
    from commlib import api

    chosen = api._reduces_in_hosts(api._rt(), x.nbytes, None)
    if cl.rank() == 0:
        print("RESULT " + json.dumps({"times": times, "auto_reduces_in_hosts": chosen}), flush=True)
    cl.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--bytes", default="64M")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lossy", action="store_true", help="also time push_pull with top-k 1%% (flat)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from commlib.config import parse_size

    nbytes = parse_size(args.bytes)
    if args.worker:
        worker(nbytes, args.rounds, args.lossy)
        return 0
    from commlib.testing.cluster import Cluster, parse_rate

    me = [sys.executable, str(Path(__file__).resolve()), "--worker", "--bytes", str(nbytes), "--rounds",
          str(args.rounds)] + (["--lossy"] if args.lossy else [])
    programs = [([0, 0, 1, 1], me), ([2, 3], [sys.executable, "-m", "commlib.server"])]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    load_before = os.getloadavg()
    with Cluster([2, 2, 1, 1], rate=args.rate) as cluster:
        command = " ".join(cluster.mpmd_args(programs))
        done = cluster.mpiexec_mpmd(programs, timeout=600, env=env)
    load_after = os.getloadavg()
    result = json.loads([l for l in done.stdout.splitlines() if l.startswith("RESULT ")][-1][7:])
    link = parse_rate(args.rate) / 8
    bound_host, bound_flat = nbytes / link, 2 * nbytes / link
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    lines = [f"# push_pull of {nbytes} bytes float32, 2 emulated worker hosts x 2 ranks + 2 server hosts, "
             f"links at {args.rate}",
             f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit}, "
             f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after",
             f"# python scripts/bench_host_reduce.py {' '.join(sys.argv[1:])}",
             f"# job: {command}",
             f"# bounds per host link: S/B = {bound_host:.3f} s (one push per host), 2 S/B = {bound_flat:.3f} s "
             "(both workers push)",
             f"{'mode':28s} {'median s':>9s} {'min s':>8s} {'/ S/B':>6s}  all (s)"]
    names = {"off": "every worker pushes (off)", "on": "reduce inside hosts (on)", "topk": "top-k 1%, off"}
    med = {}
    for mode, t in result["times"].items():
        med[mode] = statistics.median(t)
        lines.append(f"{names[mode]:28s} {med[mode]:9.3f} {min(t):8.3f} {med[mode] / bound_host:6.2f}  "
                     + " ".join(f"{v:.3f}" for v in t))
    lines.append(f"off / on: {med['off'] / med['on']:.2f}x; auto reduces inside hosts at this size: "
                 f"{result['auto_reduces_in_hosts']}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
