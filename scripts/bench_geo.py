"""Time to a target loss: synchronous data-parallel SGD against Geo-SGD, with one slow worker link.

    flock /tmp/commlib-timing.lock .venv/bin/python scripts/bench_geo.py [--rate 400mbit] [--workers 3]
        [--servers 1] [--target 1.2] [--out docs/results/geo_3w1s_slowlink.txt]

One emulated cluster (commlib.testing.cluster): ``--workers`` worker hosts x 1 rank and ``--servers``
server hosts, every link at ``--rate`` except worker 1's, at a quarter of it (``--slow``). On it, MPMD jobs
(the servers are launched in every job; the synchronous one does not use them), in the order given by
``--runs`` (default: sync, geo, geo:2, sync, geo, geo:2, interleaved; ``geo:S`` is Geo-SGD with staleness
S):

- ``sync``: ``commlib.torch.DistributedOptimizer`` (gradients averaged by an allreduce every step; the
  slowest link paces every worker) for ``--steps`` steps;
- ``geo``: ``commlib.torch.GeoSGD`` (``--k`` local steps between exchanges, ``--staleness``) for
  ``--seconds`` seconds of training on every worker.

The task: a 512-1024-512-10 MLP (1.05 M parameters, 4.2 MB) learning the labels of a fixed random linear
teacher, SGD with momentum, batch 64 per worker, every worker its own samples; worker 0 evaluates the
cross-entropy on 2048 held-out samples every ``--eval-every`` steps (for Geo-SGD: its own parameters,
which are the merged ones plus at most ``k`` local steps). Time to target: the first evaluation at or
below ``--target``, counted from a barrier after set-up. Writes ``OUT.txt`` and ``OUT.json``.

Inside a job this script runs with ``--worker`` (it is the workers' program).
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
IN, HIDDEN1, HIDDEN2, OUT = 512, 1024, 512, 10


def worker(args) -> None:
    import numpy as np
    import torch

    import commlib as cl
    import commlib.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    g = torch.Generator().manual_seed(7)
    teacher = torch.nn.Linear(IN, OUT)
    with torch.no_grad():
        for p in teacher.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        eval_x = torch.randn(2048, IN, generator=g)
        eval_y = teacher(eval_x).argmax(1)
        mine = torch.Generator().manual_seed(1000 + rank)
        train_x = torch.randn(8192, IN, generator=mine)
        train_y = teacher(train_x).argmax(1)
    torch.manual_seed(11)  # the same initial model everywhere
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN1), torch.nn.ReLU(), torch.nn.Linear(HIDDEN1, HIDDEN2),
                                torch.nn.ReLU(), torch.nn.Linear(HIDDEN2, OUT))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if args.mode == "sync":
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    else:
        staleness = None if args.staleness in ("none", "None") else int(args.staleness)
        opt = hvd.GeoSGD(opt, model.named_parameters(), k=args.k, staleness=staleness)
    loss_fn = torch.nn.CrossEntropyLoss()
    curve = []
    cl.barrier()
    start = time.perf_counter()
    step = 0
    while True:
        elapsed = time.perf_counter() - start
        if (args.mode == "sync" and step >= args.steps) or (args.mode == "geo" and elapsed >= args.seconds):
            break
        idx = torch.randint(0, train_x.shape[0], (args.batch,), generator=mine)
        opt.zero_grad()
        loss_fn(model(train_x[idx]), train_y[idx]).backward()
        opt.step()
        step += 1
        if rank == 0 and step % args.eval_every == 0:
            with torch.no_grad():
                loss = loss_fn(model(eval_x), eval_y).item()
            curve.append((round(time.perf_counter() - start, 3), step, round(loss, 4)))
    if args.mode == "geo":
        opt.close()
    took = time.perf_counter() - start
    steps = cl.allgather(np.array([step]), name="bench.steps").tolist()
    times = cl.allgather(np.array([took]), name="bench.took").tolist()
    if rank == 0:
        print("RESULT " + json.dumps({"mode": args.mode, "curve": curve, "steps": steps, "seconds": times,
                                      "workers": size, "servers": cl.num_servers()}), flush=True)
    hvd.shutdown()


def time_to(curve: list, target: float) -> float | None:
    for t, _, loss in curve:
        if loss <= target:
            return t
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="sync", help=argparse.SUPPRESS)
    parser.add_argument("--rate", default="400mbit", help="every link's rate but the slow one's")
    parser.add_argument("--slow", type=float, default=4.0, help="worker 1's link is --rate divided by this")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100, help="sync: steps per worker")
    parser.add_argument("--seconds", type=float, default=30.0, help="geo: seconds of training per worker")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--staleness", default="none")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--target", type=float, default=1.2)
    parser.add_argument("--runs", default="sync,geo,geo:2,sync,geo,geo:2")
    parser.add_argument("--out", default=None, help="write OUT.txt and OUT.json (OUT may end in .txt; default: "
                        "print only)")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0

    from commlib.testing.cluster import Cluster, parse_rate

    slow_rate = f"{int(parse_rate(args.rate) / args.slow / 1e3)}kbit"
    hosts = args.workers + args.servers
    rates = [args.rate] * hosts
    rates[1] = slow_rate
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    load = os.getloadavg()
    lines = [f"# time to loss <= {args.target}: synchronous SGD (allreduce) vs Geo-SGD (k={args.k}, staleness "
             f"{args.staleness}); {args.workers} worker hosts + {args.servers} server host(s) x 1 rank, links "
             f"{args.rate}, worker 1's {slow_rate}",
             f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit}, "
             f"{os.cpu_count()} cores, load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
             f"# {' '.join(sys.argv)}"]
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore::DeprecationWarning")
    results = []
    with Cluster([1] * hosts, rate=rates) as cluster:
        for label in args.runs.split(","):
            mode, _, staleness = label.partition(":")  # geo:2 -> staleness 2
            command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--mode", mode,
                       "--steps", str(args.steps), "--seconds", str(args.seconds), "--k", str(args.k),
                       "--staleness", staleness or args.staleness, "--lr", str(args.lr), "--batch", str(args.batch),
                       "--eval-every", str(args.eval_every)]
            programs = [(list(range(args.workers)), command),
                        (list(range(args.workers, hosts)), [sys.executable, "-m", "commlib.server"])]
            done = cluster.mpiexec_mpmd(programs, timeout=600, env=env)
            line = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")][-1]
            result = json.loads(line[len("RESULT "):])
            result["command"] = " ".join(cluster.mpmd_args(programs))
            result["time_to_target"] = time_to(result["curve"], args.target)
            result["label"] = label
            results.append(result)
            t = result["time_to_target"]
            text = (f"{label}: time to loss <= {args.target}: {'not reached' if t is None else f'{t:.1f} s'}; "
                    f"steps per worker {result['steps']} in {[round(s, 1) for s in result['seconds']]} s; "
                    f"final loss {result['curve'][-1][2] if result['curve'] else 'n/a'}")
            print(text, flush=True)
            lines.append(text)
    per_mode = {}
    for r in results:
        per_mode.setdefault(r["label"], []).append(r["time_to_target"])
    summary = {}
    for mode, ts in per_mode.items():
        reached = [t for t in ts if t is not None]
        summary[mode] = statistics.median(reached) if len(reached) == len(ts) else None
    lines.append("")
    for mode, t in summary.items():
        lines.append(f"median time to target, {mode}: {'not reached in every run' if t is None else f'{t:.1f} s'}")
    if summary.get("sync") and summary.get("geo"):
        ratio = summary["geo"] / summary["sync"]
        lines.append(f"Geo-SGD / synchronous: {ratio:.2f}x (done-criterion: at most 0.70x)")
    for label, t in summary.items():
        if label.startswith("geo:") and t and summary.get("sync"):
            lines.append(f"Geo-SGD staleness {label[4:]} / synchronous: {t / summary['sync']:.2f}x")
    load = os.getloadavg()
    lines.append(f"load average after {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    lines.append(f"command (last job): {results[-1]['command']}")
    print("\n".join(lines[-7:]))
    if args.out:
        args.out = args.out.removesuffix(".txt").removesuffix(".json")
        Path(args.out + ".txt").write_text("\n".join(lines) + "\n")
        Path(args.out + ".json").write_text(json.dumps({"args": vars(args), "rates": rates, "summary": summary,
                                                        "runs": results}, indent=1) + "\n")
        print(f"wrote {args.out}.txt and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
