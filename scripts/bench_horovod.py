#!/usr/bin/env python
"""Training step time: one Horovod training script under commlib, under Horovod and as torch DDP, in
interleaved jobs; the first steps of a job and its steady state apart.

    flock -x /tmp/commlib-cpu.lock .venv/bin/python scripts/bench_horovod.py \\
        [--layouts 1x2,2x1,2x2] [--models mlp-25M,small-160] [--jobs 3] [--first 10] [--steps 20] \\
        [--peers horovod,ddp] [--layout-cache new,seen] [--base-tree DIR] [--horovod-venv DIR] [--output FILE]

The workload is ``scripts/horovod_train.py`` (``import horovod.torch as hvd``, DistributedOptimizer, SGD with
momentum, one torch thread). Under commlib it imports a ``horovod.torch`` written here at run time into a
temporary directory: one line re-exporting ``commlib.torch``. Under Horovod it runs in the virtualenv of a
Horovod build (``--horovod-venv``, default ``$TMPDIR/hvd-venv``, what
``/work/shared/horovod-build/build_horovod.sh`` or an equivalent build makes), with that venv's own
``mpiexec``; where no Horovod build is found, its rows say so. ``ddp`` is the same step as torch's
DistributedDataParallel over gloo (``horovod_train.py --ddp``, commlib's virtualenv, nothing of commlib).

commlib runs once per ``--layout-cache`` variant: ``new``, a job whose layout commlib has not seen (an empty
``COMMLIB_AUTO_CACHE`` directory per job: auto explores), and ``seen``, a job whose layout ran before (one
directory per row, filled by an untimed job of the same script first: auto starts settled).
``--base-tree DIR`` also runs commlib from another tree (its C extensions built in place), the row's
``commlib@base``: the same jobs before a change, in the same run, with the first ``--layout-cache`` variant's
cache (without one, a tree would read the user's cache, filled by whatever ran before).

Layouts: ``1x2`` is one host, 2 ranks; ``HxR`` with H > 1 is H emulated hosts of R ranks each
(:mod:`commlib.testing.cluster`, needs root), each host's link shaped to ``--rate`` (default 1gbit).
For each layout and model, ``--jobs`` rounds each run one job of every variant, the order rotating from
round to round, so that load from other work on the machine falls on all. A job times every step from
its first: its *first* time is the mean of its first ``--first`` steps (the slowest rank's), its *steady*
time the median of the ``--steps`` after them. A row gives every job's times, the medians over jobs, and
each variant's ratio to Horovod's and to DDP's, first and steady apart. No library gets any setting:
out of the box.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import os
import platform
import shlex
import socket
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
    # (run outside the repository: a ``python -c`` in it would see commlib's egg-info and torch would load
    # commlib's backend entry point in a virtualenv without commlib's dependencies)
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120, cwd=venv)
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

    def address(self, host: int) -> str:
        """The address other hosts reach host ``host`` at (torch.distributed's rendezvous)."""
        return self.cluster.host_address(host) if self.cluster is not None else "127.0.0.1"

    @property
    def interface(self) -> str:
        """The network interface between the hosts, as a host names it (gloo's GLOO_SOCKET_IFNAME)."""
        if self.cluster is None:
            return "lo"
        from commlib.testing.netns import HOST_IFACE

        return HOST_IFACE

    def run(self, python: Path, mpiexec: Path, args: list[str], env: dict, timeout: float,
            script: Path = TRAIN) -> str:
        command = [str(python), str(script), *args]
        if self.cluster is not None:
            return self.cluster.mpiexec(command, timeout=timeout, env=env, mpiexec=str(mpiexec)).stdout
        done = subprocess.run([str(mpiexec), "-n", str(self.ranks), *command], env=env, capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0:  # as the cluster's: the error holds the job's output
            from commlib.testing.cluster import JobFailed

            raise JobFailed(f"job failed ({done.returncode}): {shlex.join([str(mpiexec), *command])}\n"
                            f"{(done.stdout + done.stderr)[-4000:]}", done)
        return done.stdout


def result_line(output: str) -> dict | None:
    """The job's result (its JSON line with ``step_s``), or None where it printed none."""
    for line in output.splitlines():
        if line.startswith("{") and '"step_s"' in line:
            return json.loads(line)
    return None


def job_time(output: str) -> dict:
    found = result_line(output)
    if found is None:
        raise RuntimeError(f"no result line in the job's output:\n{output[-3000:]}")
    return found


@dataclasses.dataclass
class Variant:
    """One library as a row runs it: its python, launcher and environment, and what it needs per job."""

    label: str
    python: Path
    mpiexec: Path
    env: dict
    ddp: bool = False
    cache: str | None = None     # commlib's COMMLIB_AUTO_CACHE: "new" (a fresh directory per job), "seen"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", default="1x2,2x1", help="HOSTSxRANKS, comma-separated (default 1x2,2x1)")
    parser.add_argument("--models", default="mlp-25M,small-160")
    parser.add_argument("--jobs", type=int, default=3, help="jobs per variant per row (rotating order)")
    parser.add_argument("--first", type=int, default=10, help="the first steps, reported apart (default 10)")
    parser.add_argument("--steps", type=int, default=20, help="steps after the first ones: the steady state")
    parser.add_argument("--peers", default="horovod,ddp", help="besides commlib: horovod, ddp (comma-separated)")
    parser.add_argument("--layout-cache", default="new,seen",
                        help="commlib's variants: new (auto has not seen the layout), seen (it has)")
    parser.add_argument("--base-tree", type=Path, help="also run commlib from this tree (commlib@base)")
    parser.add_argument("--rate", default="1gbit", help="link rate of emulated hosts (tc syntax)")
    parser.add_argument("--horovod-venv", type=Path,
                        default=Path(os.environ.get("TMPDIR", "/tmp")) / "hvd-venv")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--output", help="also write the report (markdown) here")
    args = parser.parse_args()
    layouts = [parse_layout(t) for t in args.layouts.split(",")]
    models = args.models.split(",")
    peers = [p for p in args.peers.split(",") if p]
    caches = [c for c in args.layout_cache.split(",") if c]

    ours = commlib_info()
    hvd = horovod_build(args.horovod_venv) if "horovod" in peers else None
    venv_bin = Path(sys.executable).parent
    lines = [
        f"# scripts/bench_horovod.py {shlex.join(sys.argv[1:])}",
        f"# date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {_commit()}, "
        f"{platform.node()}, {os.cpu_count()} cores (load average {os.getloadavg()[0]:.2f} at the start)",
        f"# commlib {ours['commlib']}, torch {ours['torch']}, {ours['mpi']}",
    ]
    if "horovod" in peers:
        lines.append(("# Horovod " + ", ".join(f"{k}: {v}" for k, v in hvd.items())) if hvd else
                     f"# Horovod: no build at {args.horovod_venv} (build it with {BUILD_SCRIPT}); its rows skipped")
    if args.base_tree:
        lines.append(f"# commlib@base: {args.base_tree} at {_commit(args.base_tree)}")
    lines += [
        f"# {args.jobs} jobs per variant, the order rotating; each job {args.first} + {args.steps} steps, all "
        f"timed; first: the mean of the first {args.first} (the slowest rank's), steady: the median of the "
        f"rest; emulated hosts' links at {args.rate}",
        "",
        "| layout | model | variant | first ms (per job) | steady ms (per job) | first | steady | first / steady "
        "| vs Horovod first, steady | vs DDP first, steady |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    rows = []
    train_args = ["--steps", str(args.first + args.steps), "--warmup", "0"]
    with tempfile.TemporaryDirectory(prefix="commlib-hvd-bench-") as scratch:
        scratch = Path(scratch)
        write_shim(scratch / "shim")
        base = {k: v for k, v in os.environ.items() if not k.startswith(("COMMLIB_", "HOROVOD_"))}
        base.pop("PYTHONPATH", None)
        variants = []
        for cache in caches:
            variants.append(Variant(f"commlib ({cache} layout)" if len(caches) > 1 else "commlib",
                                    Path(sys.executable), venv_bin / "mpiexec",
                                    dict(base, PYTHONPATH=os.pathsep.join([str(scratch / "shim"), str(REPO)]),
                                         BENCH_LIBRARY="commlib"), cache=cache))
        if args.base_tree:
            variants.append(Variant("commlib@base", Path(sys.executable), venv_bin / "mpiexec",
                                    dict(base, PYTHONPATH=os.pathsep.join([str(scratch / "shim"),
                                                                           str(args.base_tree.resolve())]),
                                         BENCH_LIBRARY="commlib@base"), cache=caches[0] if caches else None))
        if hvd is not None:
            variants.append(Variant("Horovod", args.horovod_venv / "bin" / "python",
                                    args.horovod_venv / "bin" / "mpiexec", dict(base, BENCH_LIBRARY="horovod")))
        if "ddp" in peers:
            variants.append(Variant("DDP (gloo)", Path(sys.executable), venv_bin / "mpiexec",
                                    dict(base, BENCH_LIBRARY="ddp"), ddp=True))
        for hosts, ranks in layouts:
            layout = f"{hosts} host(s) x {ranks} rank(s)" + (" (emulated)" if hosts > 1 else "")
            with Launcher(hosts, ranks, args.rate) as launcher:
                for model in models:
                    seen_dir = Path(tempfile.mkdtemp(prefix="seen-", dir=scratch))
                    times = {v.label: [] for v in variants}

                    def run(variant: Variant, steps: list[str]) -> list[float]:
                        env = dict(variant.env)
                        if variant.cache == "new":
                            env["COMMLIB_AUTO_CACHE"] = tempfile.mkdtemp(prefix="new-", dir=scratch)
                        elif variant.cache == "seen":
                            env["COMMLIB_AUTO_CACHE"] = str(seen_dir)
                        command = ["--model", model, *steps]
                        if variant.ddp:
                            command.append("--ddp")
                            env["MASTER_ADDR"] = launcher.address(0)
                            env["MASTER_PORT"] = str(free_port())
                            env["GLOO_SOCKET_IFNAME"] = launcher.interface
                        return job_time(launcher.run(variant.python, variant.mpiexec, command, env,
                                                     args.timeout))["step_s"]

                    if any(v.cache == "seen" for v in variants):  # the layout's earlier job
                        run(next(v for v in variants if v.cache == "seen"), train_args)
                    for job in range(args.jobs):
                        shift = job % len(variants)
                        for variant in variants[shift:] + variants[:shift]:
                            steps = run(variant, train_args)
                            times[variant.label].append((statistics.mean(steps[:args.first]),
                                                         statistics.median(steps[args.first:])))
                    for row in _rows(layout, model, times):
                        rows.append(row)
                        print(row, flush=True)
    if args.output:
        Path(args.output).write_text("\n".join(lines + rows) + "\n")
        print(f"# written to {args.output}")
    return 0


def _rows(layout: str, model: str, times: dict[str, list[tuple[float, float]]]) -> list[str]:
    """One markdown row per variant: each job's first and steady time, their medians over jobs, and the
    ratios to Horovod's and DDP's medians."""
    medians = {label: (statistics.median(f for f, _ in jobs) * 1e3, statistics.median(s for _, s in jobs) * 1e3)
               for label, jobs in times.items() if jobs}

    def versus(label: str, peer: str) -> str:
        if peer not in medians or label == peer:
            return "-"
        (f, s), (pf, ps) = medians[label], medians[peer]
        return f"{f / pf:.3f}x, {s / ps:.3f}x"

    out = []
    for label, (first, steady) in medians.items():
        jobs = times[label]
        out.append(f"| {layout} | {model} | {label} | {', '.join(f'{f * 1e3:.1f}' for f, _ in jobs)} | "
                   f"{', '.join(f'{s * 1e3:.1f}' for _, s in jobs)} | {first:.1f} | {steady:.1f} | "
                   f"{first / steady:.3f}x | {versus(label, 'Horovod')} | {versus(label, 'DDP (gloo)')} |")
    return out


def _commit(tree: Path = REPO) -> str:
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (done.stdout.strip() or "unknown") + (" (with uncommitted changes)" if dirty else "")


if __name__ == "__main__":
    sys.exit(main())
