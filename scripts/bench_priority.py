"""A training step with and without priority scheduling, on 2 emulated hosts x 1 rank (commlib.testing.cluster).

    .venv/bin/python scripts/bench_priority.py [--rate 1gbit] [--models mlp-25M,deep-24]
        [--rounds 3] [--steps 4] [--out docs/results/priority_2x1_1gbit.txt]   (and .json beside it)

One MPI job on a fresh emulated cluster (every host's link at ``--rate``, torn down afterwards). For each
model, four DistributedOptimizers over four copies of it (same seed, same data, SGD with momentum):

- ``plain``: gradients reduced in the order backward produces them (commlib's default);
- ``priority``: ``priority="forward", model=...``: the coordinator sends the gradients the next forward pass
  needs first, large ones in partitions (COMMLIB_PRIORITY_PARTITION / _CREDIT);
- ``overlap``: ``overlap_forward=True`` without priorities: ``step()`` returns at once and each layer's
  forward waits only for its own update (and those of the layers before it), sent in backward's order;
- ``priority+overlap``: both.

Rounds rotate which variant goes first; in a round each variant runs ``--steps`` steps back to back
(zero_grad, forward, backward, step) and then ``synchronize()`` (overlap_forward's last updates), after a
barrier; a step's time is that span's (the slowest rank's) divided by the steps. Models:

- ``mlp-25M``: scripts/horovod_train.py's Linear 1024-4096-4096-1024 (25.2 M parameters, 6 tensors), batch 32;
- ``deep-24``: 24 Linear 1024-1024 layers with ReLUs (25.2 M parameters, 48 tensors), batch 64.

The bound: an allreduce of S bytes on 2 hosts moves S over each link, so one step's communication takes at
least S/B. After the timed rounds every variant has taken the same steps on the same data: the script
checks their weights are equal (bit for bit on 2 ranks). Writes OUT.txt and OUT.json.
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
VARIANTS = ("plain", "priority", "overlap", "priority+overlap")


def make_model(name: str):
    import torch

    if name == "mlp-25M":
        return torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096),
                                   torch.nn.ReLU(), torch.nn.Linear(4096, 1024)), (32, 1024), 1024
    if name == "deep-24":
        layers = []
        for _ in range(24):
            layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers), (64, 1024), 1024
    raise SystemExit(f"unknown model {name!r}; use mlp-25M or deep-24")


def worker(models: list[str], rounds: int, steps: int, warmup: int) -> None:
    import torch
    import torch.nn.functional as F

    import commlib.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    results = {}
    for model_name in models:
        runs = {}
        for variant in VARIANTS:
            torch.manual_seed(0)
            model, batch, width = make_model(model_name)
            kwargs = {} if variant == "plain" else dict(model=model, overlap_forward="overlap" in variant)
            if variant.startswith("priority"):
                kwargs["priority"] = "forward"
            named = [(f"{model_name}.{variant}.{n}", p) for n, p in model.named_parameters()]
            optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9),
                                                 named_parameters=named, **kwargs)
            runs[variant] = (model, optimizer)
        g = torch.Generator().manual_seed(hvd.rank())
        x = torch.randn(*batch, generator=g)
        y = torch.randn(batch[0], width, generator=g)

        def step(model, optimizer):
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()

        for variant in VARIANTS:
            for _ in range(warmup):
                step(*runs[variant])
            runs[variant][1].synchronize()
        times = {v: [] for v in VARIANTS}
        for r in range(rounds):
            for variant in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
                model, optimizer = runs[variant]
                hvd.barrier()
                start = time.perf_counter()
                for _ in range(steps):
                    step(model, optimizer)
                optimizer.synchronize()
                elapsed = (time.perf_counter() - start) / steps
                slowest = hvd.allreduce(torch.tensor([elapsed], dtype=torch.float64), name="bench.time", op=hvd.Max)
                times[variant].append(float(slowest[0]))
        params = {v: [p.detach().clone() for p in runs[v][0].parameters()] for v in VARIANTS}
        differs = {v: max(float((a - b).abs().max()) for a, b in zip(params["plain"], params[v])) for v in VARIANTS}
        nbytes = sum(p.numel() * p.element_size() for p in runs["plain"][0].parameters())
        results[model_name] = {"times": times, "bytes": nbytes, "tensors": len(params["plain"]),
                               "max_weight_difference_vs_plain": differs}
        del runs, params
    if hvd.rank() == 0:
        print("RESULT " + json.dumps({"results": results, "ranks": hvd.size()}), flush=True)
    hvd.shutdown()


def run_job(rate: str, models: list[str], rounds: int, steps: int, warmup: int) -> dict:
    from commlib.testing.cluster import Cluster

    env = dict(os.environ, PYTHONPATH=str(REPO))
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--models", ",".join(models),
               "--rounds", str(rounds), "--steps", str(steps), "--warmup", str(warmup)]
    with Cluster([1, 1], rate=rate) as cluster:  # torn down on exit, also on errors and signals
        done = cluster.mpiexec(command, timeout=1200, env=env)
        launched = " ".join(cluster.mpiexec_args() + command)
    line = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
    result["command"] = launched
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--models", default="mlp-25M,deep-24")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="steps per variant and round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first")
    parser.add_argument("--out", default=None, help="write OUT.txt and OUT.json (OUT may end in .txt; "
                        "default: print only)")
    args = parser.parse_args()
    models = args.models.split(",")
    if args.out and args.out.endswith(".txt"):
        args.out = args.out[:-len(".txt")]
    if args.worker:
        worker(models, args.rounds, args.steps, args.warmup)
        return 0
    from commlib.testing.cluster import parse_rate

    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    load = os.getloadavg()
    result = run_job(args.rate, models, args.rounds, args.steps, args.warmup)
    link = parse_rate(args.rate) / 8
    lines = [f"# training step with and without priority scheduling, 2 emulated hosts x 1 rank, links at {args.rate}",
             f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit}, "
             f"{os.cpu_count()} cores, load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
             f"COMMLIB_PRIORITY_PARTITION={os.environ.get('COMMLIB_PRIORITY_PARTITION', 'default')}, "
             f"COMMLIB_PRIORITY_CREDIT={os.environ.get('COMMLIB_PRIORITY_CREDIT', 'default')}",
             f"# {' '.join(sys.argv)}", f"# command: {result['command']}"]
    report = {"command": result["command"], "commit": commit, "rate": args.rate, "models": {}}
    for model, data in result["results"].items():
        bound = data["bytes"] / link
        med = {v: statistics.median(t) for v, t in data["times"].items()}
        lines += ["", f"## {model}: {data['bytes'] / 1e6:.1f} MB of gradients in {data['tensors']} tensors; "
                      f"communication bound S/B = {bound:.3f} s per step",
                  f"{'variant':18s} {'median s':>9s} {'/ plain':>8s} {'/ bound':>8s}  all rounds (s/step)"]
        for v, t in data["times"].items():
            lines.append(f"{v:18s} {med[v]:9.3f} {med[v] / med['plain']:8.3f} {med[v] / bound:8.2f}  "
                         + " ".join(f"{x:.3f}" for x in t))
        lines.append("max |weight - plain's| after the same steps: "
                     + ", ".join(f"{v} {d:g}" for v, d in data["max_weight_difference_vs_plain"].items()))
        report["models"][model] = {"median_s": med, "bound_s": bound, **data}
    print("\n".join(lines), flush=True)
    if args.out:
        Path(args.out + ".txt").write_text("\n".join(lines) + "\n")
        Path(args.out + ".json").write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}.txt and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
