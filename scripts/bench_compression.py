"""Time to accuracy of examples/train_compressed.py over a slow link, for each compression method.

    sudo flock /work/wt/bench.lock .venv/bin/python scripts/bench_compression.py --repeats 2

Starts an emulated cluster (commlib.testing.cluster: 2 hosts x 1 rank, each host's link capped at
``--rate``, 1 Gbit/s by default), runs the example once per method and repeat, interleaved (none, fp16,
topk, dgc, powersgd, localsgd, then again), and writes:

- ``docs/results/compression.json``: every run's result line (time per step, time to the target, final
  accuracy, the accuracy history) with the command that produced it;
- ``docs/results/compression.md``: the table (medians over repeats; the spread as min-max) with each
  method's time to target as a ratio of uncompressed training's;
- ``docs/results/compression.png``: test accuracy against training time, one line per run.

"uncompressed" (``none``) is the peer every ratio refers to; the physical bound of its step is the link:
an allreduce of the 82 MB gradient between 2 hosts moves 82 MB each way, 0.66 s at 1 Gbit/s.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
METHODS = ["none", "fp16", "topk", "dgc", "powersgd", "localsgd"]


def run_all(args) -> list[dict]:
    try:
        from commlib.testing.cluster import Cluster
    except ImportError:
        sys.exit("commlib.testing.cluster is missing: this benchmark needs the emulated cluster "
                 "(merge the branch that adds commlib/testing/cluster.py)")
    runs = []
    with Cluster(hosts=[1] * args.hosts, rate=args.rate) as cluster:
        for repeat in range(args.repeats):
            for method in args.methods:
                command = [sys.executable, str(REPO / "examples" / "train_compressed.py"), "--compression", method,
                           "--target", str(args.target), "--max-steps", str(args.max_steps)] + args.extra
                started = time.perf_counter()
                done = cluster.mpiexec(command, timeout=args.timeout, check=False)
                wall = time.perf_counter() - started
                lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
                if not lines:
                    print(done.stdout[-3000:], file=sys.stderr)
                    result = {"compression": method, "reached": False, "error": f"exit {done.returncode}"}
                else:
                    result = json.loads(lines[-1][len("RESULT "):])
                result.update(repeat=repeat, job_wall_s=round(wall, 1))
                keys = ("median_step_s", "time_to_target_s", "steps_to_target", "final_accuracy")
                shown = {k: result.get(k) for k in keys}
                print(f"{method:9s} repeat {repeat}: {json.dumps(shown)}", flush=True)
                runs.append(result)
    return runs


def _spread(values) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:.3g} ({min(values):.3g}-{max(values):.3g})" if len(values) > 1 else f"{med:.3g}"


def table(runs: list[dict], args, command: str) -> str:
    base = [r["time_to_target_s"] for r in runs if r["compression"] == "none" and r.get("time_to_target_s")]
    base_med = statistics.median(base) if base else None
    lines = [f"# Compression: time to {args.target:.0%} test accuracy, {args.hosts} hosts x 1 rank at {args.rate}",
             "", f"Command: `{command}`", "",
             "| method | time per step (s) | steps to target | time to target (s) | ratio to none "
             "| final accuracy | reached |",
             "|---|---|---|---|---|---|---|"]
    for method in args.methods:
        mine = [r for r in runs if r["compression"] == method]
        times = [r.get("time_to_target_s") for r in mine]
        ratio = "-"
        if base_med and all(times):
            ratio = f"{statistics.median(times) / base_med:.2f}"
        lines.append(f"| {method} | {_spread(r.get('median_step_s') for r in mine)} | "
                     f"{_spread(r.get('steps_to_target') for r in mine)} | {_spread(times)} | {ratio} | "
                     f"{_spread(r.get('final_accuracy') for r in mine)} | "
                     f"{sum(bool(r.get('reached')) for r in mine)}/{len(mine)} |")
    lines += ["", "Medians over repeats, (min-max) when repeated. Time excludes evaluation and start-up."]
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = dict(zip(METHODS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for r in runs:
        history = r.get("history") or []
        if history:
            ax.plot([h[1] for h in history], [h[2] for h in history], color=colors.get(r["compression"]),
                    label=r["compression"] if r.get("repeat", 0) == 0 else None, alpha=0.8)
    ax.axhline(runs[0].get("target", 0.9), color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("test accuracy")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=METHODS)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results")
    parser.add_argument("extra", nargs="*", help="more arguments for the example (after --)")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "scripts/bench_compression.py"] + (argv if argv is not None else sys.argv[1:]))
    runs = run_all(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compression.json").write_text(json.dumps({"command": command, "runs": runs}, indent=1) + "\n")
    text = table(runs, args, command)
    (args.out / "compression.md").write_text(text)
    plot(runs, args.out / "compression.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
