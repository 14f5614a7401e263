#!/usr/bin/env python
"""Training step time: one Horovod training script under commlib and under Horovod, in alternating jobs.

    flock /tmp/commlib-timing.lock .venv/bin/python scripts/bench_horovod.py \\
        [--layouts 1x2,2x1,2x2] [--models mlp-25M,small-160] [--jobs 3] [--horovod-venv DIR] [--output FILE]

The workload is ``scripts/horovod_train.py`` (``import horovod.torch as hvd``, DistributedOptimizer, SGD with
momentum, one torch thread). Under commlib it imports a ``horovod.torch`` written here at run time into a
temporary directory: one line re-exporting ``commlib.torch``. Under Horovod it runs in the virtualenv of a
Horovod build (``--horovod-venv``, default ``$TMPDIR/hvd-venv``, what
``/work/shared/horovod-build/build_horovod.sh`` or an equivalent build makes), with that venv's own
``mpiexec``. Where no Horovod build is found, its rows say so and only commlib runs.

Layouts: ``1x2`` is one host, 2 ranks; ``HxR`` with H > 1 is H emulated hosts of R ranks each
(:mod:`commlib.testing.cluster`, needs root), each host's link shaped to ``--rate`` (default 1gbit).
For each layout and model, ``--jobs`` rounds each run one commlib job and one Horovod job, the order
alternating from round to round, so that load from other work on the machine falls on both. A job's time
is the median over its timed steps of the slowest rank's step time; the row gives every job's time, the
median over jobs and commlib's median over Horovod's. Neither library gets any setting: out of the box.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "scripts" / "horovod_train.py"
BUILD_SCRIPT = Path("/work/shared/horovod-build/build_horovod.sh")
SHIM = "# Horovod's torch API, served by commlib (written by scripts/bench_horovod.py).\nfrom commlib.torch import *  # noqa: F401,F403\n"


def write_shim(directory: Path) -> None:
    """``horovod/torch/__init__.py`` re-exporting commlib.torch, under ``directory``."""
    (directory / "horovod" / "torch").mkdir(parents=True)
    (directory / "horovod" / "__init__.py").write_text("")
    (directory / "horovod" / "torch" / "__init__.py").write_text(SHIM)


def horovod_build(venv: Path) -> dict | None:
    """What the Horovod venv holds (versions, MPI) and how it was built; None where there is none."""
    python = venv / "bin" / "python"
    if not python.exists() or not (venv / "bin" / "mpiexec").exists():
        return None
    probe = ("import horovod, horovod.torch as h, torch, mpi4py; from mpi4py import MPI; "
             "print(horovod.__version__); print(torch.__version__); print(h.mpi_built()); "
             "print(MPI.Get_library_version().splitlines()[0].strip())")
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return None
    version, torch_version, mpi_built, mpi = done.stdout.strip().splitlines()[:4]
    mpi = " ".join(mpi.split())
    info = {"venv": str(venv), "horovod": version, "torch": torch_version, "mpi_built": mpi_built, "mpi": mpi}
    if BUILD_SCRIPT.exists():
        digest = hashlib.sha256(BUILD_SCRIPT.read_bytes()).hexdigest()[:12]
        info["built_by"] = (f"{BUILD_SCRIPT} (sha256 {digest}): Horovod 0.28.1 from its PyPI source with "
                            "HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_CPU_OPERATIONS=MPI, no "
                            "TensorFlow/MXNet/Gloo, patched for C++17 (torch 2.13's headers need it)")
    return info


def commlib_info() -> dict:
    done = subprocess.run([sys.executable, "-c", "import commlib, torch; from mpi4py import MPI; "
                           "print(commlib.__version__); print(torch.__version__); "
                           "print(MPI.Get_library_version().splitlines()[0].strip())"],
                          capture_output=True, text=True, check=True)
    version, torch_version, mpi = done.stdout.strip().splitlines()[:3]
    mpi = " ".join(mpi.split())
    return {"commlib": version, "torch": torch_version, "mpi": mpi}


def parse_layout(text: str) -> tuple[int, int]:
    hosts, ranks = (int(v) for v in text.lower().split("x"))
    if hosts < 1 or ranks < 1:
        raise argparse.ArgumentTypeError(f"layout {text!r}: HOSTSxRANKS, e.g. 1x2 or 2x1")
    return hosts, ranks


class Launcher:
    """Runs one job on a layout: plain mpiexec on one host, or on an emulated cluster."""

    def __init__(self, hosts: int, ranks: int, rate: str):
        self.hosts, self.ranks, self.rate = hosts, ranks, rate
        self.cluster = None

    def __enter__(self):
        if self.hosts > 1:
            from commlib.testing.cluster import Cluster

            self.cluster = Cluster(hosts=[self.ranks] * self.hosts, rate=self.rate).up()
        return self

    def __exit__(self, *exc):
        if self.cluster is not None:
            self.cluster.down()

    def run(self, python: Path, mpiexec: Path, args: list[str], env: dict, timeout: float,
            script: Path = TRAIN) -> str:
        command = [str(python), str(script), *args]
        if self.cluster is not None:
            return self.cluster.mpiexec(command, timeout=timeout, env=env, mpiexec=str(mpiexec)).stdout
        done = subprocess.run([str(mpiexec), "-n", str(self.ranks), *command], env=env, capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"job failed ({done.returncode}): {shlex.join([str(mpiexec), *command])}\n"
                               f"{(done.stdout + done.stderr)[-4000:]}")
        return done.stdout


def job_time(output: str) -> dict:
    for line in output.splitlines():
        if line.startswith("{") and '"step_s"' in line:
            return json.loads(line)
    raise RuntimeError(f"no result line in the job's output:\n{output[-3000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", default="1x2,2x1", help="HOSTSxRANKS, comma-separated (default 1x2,2x1)")
    parser.add_argument("--models", default="mlp-25M,small-160")
    parser.add_argument("--jobs", type=int, default=3, help="jobs per library per row (alternating)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first (auto settles in them)")
    parser.add_argument("--rate", default="1gbit", help="link rate of emulated hosts (tc syntax)")
    parser.add_argument("--horovod-venv", type=Path,
                        default=Path(os.environ.get("TMPDIR", "/tmp")) / "hvd-venv")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--output", help="also write the report (markdown) here")
    args = parser.parse_args()
    layouts = [parse_layout(t) for t in args.layouts.split(",")]
    models = args.models.split(",")

    ours = commlib_info()
    hvd = horovod_build(args.horovod_venv)
    venv_bin = Path(sys.executable).parent
    lines = [
        f"# scripts/bench_horovod.py {shlex.join(sys.argv[1:])}",
        f"# date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {_commit()}, "
        f"{platform.node()}, {os.cpu_count()} cores (shared with other work while measured: load average "
        f"{os.getloadavg()[0]:.2f} at the start)",
        f"# commlib {ours['commlib']}, torch {ours['torch']}, {ours['mpi']}",
        ("# Horovod " + ", ".join(f"{k}: {v}" for k, v in hvd.items())) if hvd else
        f"# Horovod: no build at {args.horovod_venv} (build it with {BUILD_SCRIPT}); Horovod rows skipped",
        f"# {args.jobs} alternating jobs per library, {args.warmup} warm-up + {args.steps} timed steps each; "
        "a job's time: median step (slowest rank); emulated hosts' links at " + args.rate,
        "",
        "| layout | model | commlib ms (per job) | Horovod ms (per job) | commlib | Horovod | commlib / Horovod |",
        "|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="commlib-hvd-shim-") as shim_dir:
        write_shim(Path(shim_dir))
        base = {k: v for k, v in os.environ.items() if not k.startswith(("COMMLIB_", "HOROVOD_"))}
        ours_env = dict(base, PYTHONPATH=os.pathsep.join([shim_dir, str(REPO)]), BENCH_LIBRARY="commlib")
        theirs_env = dict(base, BENCH_LIBRARY="horovod")
        theirs_env.pop("PYTHONPATH", None)
        for hosts, ranks in layouts:
            layout = f"{hosts} host(s) x {ranks} rank(s)" + (" (emulated)" if hosts > 1 else "")
            with Launcher(hosts, ranks, args.rate) as launcher:
                for model in models:
                    train_args = ["--model", model, "--steps", str(args.steps), "--warmup", str(args.warmup)]
                    times: dict[str, list[float]] = {"commlib": [], "horovod": []}
                    for job in range(args.jobs):
                        order = ["commlib", "horovod"] if job % 2 == 0 else ["horovod", "commlib"]
                        for library in order:
                            if library == "horovod":
                                if hvd is None:
                                    continue
                                python, mpiexec, env = (args.horovod_venv / "bin" / "python",
                                                        args.horovod_venv / "bin" / "mpiexec", theirs_env)
                            else:
                                python, mpiexec, env = Path(sys.executable), venv_bin / "mpiexec", ours_env
                            result = job_time(launcher.run(python, mpiexec, train_args, env, args.timeout))
                            times[library].append(statistics.median(result["step_s"]) * 1e3)
                    row = _row(layout, model, times)
                    rows.append(row)
                    print(row, flush=True)
    if args.output:
        Path(args.output).write_text("\n".join(lines + rows) + "\n")
        print(f"# written to {args.output}")
    return 0


def _row(layout: str, model: str, times: dict[str, list[float]]) -> str:
    ours, theirs = times["commlib"], times["horovod"]
    mine = statistics.median(ours)
    if theirs:
        other = statistics.median(theirs)
        return (f"| {layout} | {model} | {', '.join(f'{t:.1f}' for t in ours)} | "
                f"{', '.join(f'{t:.1f}' for t in theirs)} | {mine:.1f} | {other:.1f} | {mine / other:.2f}x |")
    return (f"| {layout} | {model} | {', '.join(f'{t:.1f}' for t in ours)} | (no Horovod build) | {mine:.1f} "
            "| - | - |")


def _commit() -> str:
    done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (done.stdout.strip() or "unknown") + (" (with uncommitted changes)" if dirty else "")


if __name__ == "__main__":
    sys.exit(main())
