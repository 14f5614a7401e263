#!/usr/bin/env python
"""DDP and FSDP2 step time on the ``commlib`` backend against gloo, in alternating jobs.

    flock -x /tmp/commlib-cpu.lock .venv/bin/python scripts/bench_ddp.py \\
        [--layouts 1x2,2x1,2x2] [--servers] [--fsdp] [--jobs 3] [--steps 40] [--rate 1gbit]
        [--layout-cache new,seen] [--output FILE]

The workload is ``scripts/ddp_train.py``: the issue's step (MLP 1024-4096-4096-1024, 25.2 M parameters,
batch 32, SGD with momentum, one torch thread) as a plain DDP script, on whichever backend it is given, with
no tuning profile and no setting beyond the ones each row names. Rows per layout (``HxR``: H hosts of R
ranks; H > 1: emulated hosts, commlib.testing.cluster, links shaped to ``--rate``):

- ``ddp``: gloo against the commlib backend;
- ``fp16``: DDP over gloo with PyTorch's ``fp16_compress_hook`` against the commlib backend with fp16 on the
  wire (``COMMLIB_TORCH_COMPRESSION=fp16``: the backend's option) and against commlib's
  ``fp16_wrapper(allreduce_hook)`` on the commlib backend;
- ``--servers``: 4 worker hosts x 1 rank plus 4 hosts of summation servers (an MPMD job: ``python -m
  commlib.server`` on the server hosts, whose presence lets ``auto`` send through them; and with
  ``COMMLIB_ALGORITHM=ps``, every bucket through them) against gloo on the same 4 worker hosts;
- ``--fsdp``: FSDP2 (``fully_shard`` per layer) on 2 hosts x 1 rank, gloo against commlib.

``--layout-cache`` runs each commlib variant once per kind given: ``new``, a job whose layout ``auto`` has not
seen (an empty ``COMMLIB_AUTO_CACHE`` directory per job: it explores), ``seen``, a job whose layout ran
before (one directory per row, filled by an untimed job of each commlib variant first: it starts settled).
Without it, every job reads and writes the user's cache, so a row's later jobs see what its earlier left.

Each row runs ``--jobs`` rounds; each round runs every variant once, in an order that rotates from round to
round. A job reports every step's time (the slowest rank's); its *first 10* is the mean of its first 10
steps, its *steady* the median of the rest. The row gives each variant's steady time per job and the
median over jobs, the ratio to the row's gloo variant, commlib's first 10 against its steady state, and the
link bound: the bytes the best schedule must move over one host's link at ``--rate`` (none on one host).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_horovod import (Launcher, _commit, commlib_info, job_time, parse_layout,  # noqa: E402 - shared
                           result_line)

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "scripts" / "ddp_train.py"
PARAMETERS = 1024 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 1024 + 1024  # 25,175,040
GRADIENT_BYTES = 4 * PARAMETERS
FIRST = 10  # steps reported apart: the first ones, where auto still measures

#: variant -> (backend, ddp_train.py arguments, extra environment)
VARIANTS = {
    "gloo": ("gloo", [], {}),
    "commlib": ("commlib", [], {}),
    "gloo + torch fp16 hook": ("gloo", ["--hook", "torch-fp16"], {}),
    "commlib + fp16 option": ("commlib", [], {"COMMLIB_TORCH_COMPRESSION": "fp16"}),
    "commlib + commlib fp16 hook": ("commlib", ["--hook", "commlib-fp16"], {}),
    "commlib, algorithm ps": ("commlib", [], {"COMMLIB_ALGORITHM": "ps"}),
    "gloo fsdp2": ("gloo", ["--fsdp"], {}),
    "commlib fsdp2": ("commlib", ["--fsdp"], {}),
}
ROWS = {"ddp": ["gloo", "commlib"],
        "fp16": ["gloo + torch fp16 hook", "commlib + fp16 option", "commlib + commlib fp16 hook"],
        "fsdp2": ["gloo fsdp2", "commlib fsdp2"]}


def rate_bytes_per_s(rate: str) -> float:
    from commlib.testing.cluster import parse_rate

    return parse_rate(rate) / 8


def link_bound_s(hosts: int, rate: str, wire_bytes: int, servers: bool = False) -> float | None:
    """The least time one host's link needs for the step's reduction: with summation servers every worker
    link carries the bytes each way once; an allreduce over H hosts at best (hierarchical: one host's ranks
    reduce at home first) 2 (H - 1) / H times them each way."""
    if hosts == 1:
        return None
    factor = 1.0 if servers else 2 * (hosts - 1) / hosts
    return factor * wire_bytes / rate_bytes_per_s(rate)


def parse_job(output: str) -> list[float]:
    return job_time(output)["step_s"]


def summary(steps: list[float]) -> tuple[float, float]:
    """(mean of the first steps, median of the rest), seconds."""
    return statistics.mean(steps[:FIRST]), statistics.median(steps[FIRST:])


class ServerLauncher:
    """4 worker hosts x 1 rank and 4 server hosts: gloo on the workers' hosts, commlib with the servers."""

    def __init__(self, workers: int, servers: int, rate: str):
        self.workers, self.servers, self.rate = workers, servers, rate
        self.cluster = None

    def __enter__(self):
        from commlib.testing.cluster import Cluster

        self.cluster = Cluster(hosts=[1] * (self.workers + self.servers), rate=self.rate).up()
        return self

    def __exit__(self, *exc):
        self.cluster.down()

    def run(self, python, mpiexec, args, env, timeout, script=TRAIN, with_servers: bool = False) -> str:
        train = [str(python), str(script), *args]
        if not with_servers:
            return self.cluster.mpiexec(train, timeout=timeout, env=env, nprocs=self.workers).stdout
        server = [str(python), "-m", "commlib.server"]
        programs = [(list(range(self.workers)), train),
                    (list(range(self.workers, self.workers + self.servers)), server)]
        return self.cluster.mpiexec_mpmd(programs, timeout=timeout, env=env).stdout


def run_row(launcher, variants: list[str], args, base_env: dict, notes: list[str], servers: bool = False) -> dict:
    """Every variant of a row (commlib's once per ``--layout-cache`` kind), ``args.jobs`` rounds in rotating
    order; {label: [[step_s...] per job]}. A job that printed its steps and then exited non-zero (gloo's
    FSDP2 jobs abort at exit now and then: "terminate called without an active exception") keeps its
    steps; ``notes`` says so."""
    from commlib.testing.cluster import JobFailed

    python, mpiexec = Path(sys.executable), Path(sys.executable).parent / "mpiexec"
    caches = [c for c in args.layout_cache.split(",") if c]
    jobs = [(v, None) for v in variants if VARIANTS[v][0] != "commlib" or not caches]
    jobs[1:1] = [(v, c) for v in variants if VARIANTS[v][0] == "commlib" for c in caches]  # after gloo's

    def label(variant: str, cache: str | None) -> str:
        return f"{variant} ({cache} layout)" if cache and len(caches) > 1 else variant

    def run(variant: str, cache: str | None, scratch: str, what: str) -> str:
        backend, extra, env = VARIANTS[variant]
        env = dict(base_env, **env)
        if cache == "new":
            env["COMMLIB_AUTO_CACHE"] = tempfile.mkdtemp(prefix="new-", dir=scratch)
        elif cache == "seen":
            env["COMMLIB_AUTO_CACHE"] = str(Path(scratch) / "seen")
        train_args = ["--backend", backend, "--steps", str(args.steps), *extra]
        kwargs = {"with_servers": True} if servers and backend == "commlib" else {}
        try:
            return launcher.run(python, mpiexec, train_args, env, args.timeout, script=TRAIN, **kwargs)
        except JobFailed as exc:
            output = exc.completed.stdout or ""
            if result_line(output) is None:
                raise
            notes.append(f"# note: {label(variant, cache)}, {what}, exited {exc.completed.returncode} after "
                         "printing its steps; its steps are kept")
            print(notes[-1], flush=True)
            return output

    runs: dict[str, list[list[float]]] = {label(v, c): [] for v, c in jobs}
    with tempfile.TemporaryDirectory(prefix="commlib-ddp-bench-") as scratch:
        for variant, cache in jobs:
            if cache == "seen":  # the layout's earlier job, untimed
                run(variant, cache, scratch, "the untimed earlier job")
        for job in range(args.jobs):
            order = jobs[job % len(jobs):] + jobs[:job % len(jobs)]
            for variant, cache in order:
                steps = parse_job(run(variant, cache, scratch, f"job {job + 1}"))
                runs[label(variant, cache)].append(steps)
                first, steady = summary(steps)
                print(f"#   {label(variant, cache)}: job {job + 1}: steady {steady * 1e3:.1f} ms, first {FIRST} "
                      f"{first * 1e3:.1f} ms", flush=True)
    return runs


def row_lines(layout: str, row: str, runs: dict, bound: float | None, unbound: str = "none (one host)") -> list[str]:
    """The table's rows for one layout and row; ``unbound``: the link-bound cell where ``bound`` is None."""
    variants = list(runs)
    base = statistics.median(summary(s)[1] for s in runs[variants[0]])
    lines = []
    for variant in variants:
        steadies = [summary(s)[1] for s in runs[variant]]
        firsts = [summary(s)[0] for s in runs[variant]]
        steady, first = statistics.median(steadies), statistics.median(firsts)
        bound_text = f"{bound * 1e3:.0f} ms ({steady / bound:.2f}x)" if bound else unbound
        lines.append(f"| {layout} | {row} | {variant} | {', '.join(f'{t * 1e3:.0f}' for t in steadies)} | "
                     f"{steady * 1e3:.1f} | {steady / base:.2f}x | {first * 1e3:.1f} ({first / steady:.2f}x) | "
                     f"{bound_text} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", default="1x2,2x1,2x2", help="HOSTSxRANKS, comma-separated ('' for none)")
    parser.add_argument("--rows", default="ddp,fp16", help="rows per layout: ddp, fp16")
    parser.add_argument("--servers", action="store_true", help="also 4 worker hosts + 4 server hosts")
    parser.add_argument("--fsdp", action="store_true", help="also FSDP2 on 2 hosts x 1 rank")
    parser.add_argument("--jobs", type=int, default=3, help="rounds: jobs per variant")
    parser.add_argument("--steps", type=int, default=40, help="steps per job (the first 10 reported apart)")
    parser.add_argument("--rate", default="1gbit", help="link rate of emulated hosts (tc syntax)")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--layout-cache", default="",
                        help="commlib's variants: new (auto has not seen the layout), seen (it has); "
                             "default: the user's cache")
    parser.add_argument("--output", help="also write the report (markdown) here, and its JSON beside it")
    args = parser.parse_args()

    info = commlib_info()
    header = [
        f"# scripts/bench_ddp.py {shlex.join(sys.argv[1:])}",
        f"# date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {_commit()}, "
        f"{platform.node()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the start",
        f"# commlib {info['commlib']}, torch {info['torch']}, {info['mpi']}; no tuning profile "
        f"({'present' if Path.home().joinpath('.cache/commlib/tuning.json').exists() else 'none on this machine'})",
        f"# {args.jobs} rounds of alternating jobs, {args.steps} steps each: steady = median of steps {FIRST + 1}+, "
        f"first {FIRST} = their mean; a step is the slowest rank's; emulated links at {args.rate}; "
        f"{GRADIENT_BYTES / 1e6:.1f} MB of float32 gradients; auto's layout cache: "
        + (args.layout_cache or "the user's"),
        "",
        "| layout | row | variant | steady ms per job | steady ms | vs first variant | first 10 ms (vs steady) | "
        "link bound |",
        "|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(header), flush=True)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMLIB_", "HOROVOD_"))}
    base_env.update(PYTHONPATH=str(REPO), GLOO_SOCKET_IFNAME="eth0")
    lines, record, notes = [], {}, []
    layouts = [parse_layout(t) for t in args.layouts.split(",") if t]
    for hosts, ranks in layouts:
        layout = f"{hosts}x{ranks}" + (" (emulated)" if hosts > 1 else "")
        env = dict(base_env) if hosts > 1 else {k: v for k, v in base_env.items() if k != "GLOO_SOCKET_IFNAME"}
        with Launcher(hosts, ranks, args.rate) as launcher:
            for row in args.rows.split(","):
                runs = run_row(launcher, ROWS[row], args, env, notes)
                wire = GRADIENT_BYTES // 2 if row == "fp16" else GRADIENT_BYTES
                new = row_lines(layout, row, runs, link_bound_s(hosts, args.rate, wire))
                lines += new
                record[f"{layout} {row}"] = runs
                print("\n".join(new), flush=True)
    if args.fsdp:
        with Launcher(2, 1, args.rate) as launcher:
            runs = run_row(launcher, ROWS["fsdp2"], args, base_env, notes)
        new = row_lines("2x1 (emulated)", "fsdp2", runs, None, unbound="not computed")
        lines += new
        record["2x1 fsdp2"] = runs
        print("\n".join(new), flush=True)
    if args.servers:
        with ServerLauncher(4, 4, args.rate) as launcher:
            runs = run_row(launcher, ["gloo", "commlib", "commlib, algorithm ps"], args, base_env, notes,
                           servers=True)
        new = row_lines("4x1 workers + 4 server hosts (emulated)", "servers", runs,
                        link_bound_s(4, args.rate, GRADIENT_BYTES, servers=True))
        lines += new
        record["4x1+4 servers"] = runs
        print("\n".join(new), flush=True)
    if args.output:
        Path(args.output).write_text("\n".join(header + lines + ([""] + notes if notes else [])) + "\n")
        Path(args.output).with_suffix(".json").write_text(json.dumps(record))
        print(f"# written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
