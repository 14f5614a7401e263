"""push_pull through summation servers against commlib's allreduces, on the emulated cluster.

    flock /tmp/commlib-timing.lock .venv/bin/python scripts/bench_servers.py [--rate 1gbit] [--bytes 64M]
        [--workers 4] [--servers 4] [--rounds 3] [--out docs/results/servers_4x4_1gbit]

Two MPMD jobs, each on a fresh emulated cluster (commlib.testing.cluster) with every host's link at
``--rate``, one worker rank per host:

1. ``own``: the servers on hosts of their own (``workers + servers`` hosts);
2. ``beside``: each server on a worker's host (``workers`` hosts).

In each job the workers time, in rounds that rotate which method goes first: ``push_pull`` (float32,
``--bytes``) and the allreduces ``ring``, ``rabenseifner``, ``hierarchical_pipelined``, ``native`` and
``auto`` on the same workers (a barrier before each call; a call's time is the slowest worker's). Reports
the median per method, the best allreduce, and the link bounds: push_pull S/B (each worker link carries
S each way), allreduce 2(n-1)/n S/B. Before the ``own`` job, on the same hosts, the raw transport bound:
the same traffic over plain TCP sockets (no MPI, no sums), and one TCP flow alone on one link.
Writes ``OUT.txt`` and ``OUT.json``.

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
ALLREDUCES = ("ring", "rabenseifner", "hierarchical_pipelined", "native", "auto")


def worker(nbytes: int, rounds: int, allreduces: tuple[str, ...], auto_warmup: int = 0) -> None:
    import numpy as np

    import commlib as cl

    cl.init()
    n = nbytes // 4
    data = np.random.default_rng(cl.rank()).standard_normal(n).astype(np.float32)
    buf = data.copy()
    methods = ["push_pull"] + list(allreduces)

    def call(method: str) -> None:
        if method == "push_pull":
            cl.push_pull_(buf, op=cl.Sum, name="bench")
        else:
            cl.allreduce_(buf, op=cl.Sum, name=f"bench.{method}", algorithm=method)

    for method in methods:  # warm-up: buffers, connections, the cost model's choices
        call(method)
    for _ in range(auto_warmup if "auto" in methods else 0):  # auto learns which candidate is fastest
        call("auto")
    times: dict[str, list[float]] = {m: [] for m in methods}
    for r in range(rounds):
        for method in methods[r % len(methods):] + methods[:r % len(methods)]:
            buf[...] = data
            cl.barrier()
            start = time.perf_counter()
            call(method)
            elapsed = time.perf_counter() - start
            slowest = cl.allreduce(np.array([elapsed]), op=cl.Max, name="bench.time")[0]
            times[method].append(float(slowest))
    # check: push_pull's sum equals the ring's on every worker (same data)
    buf[...] = data
    cl.push_pull_(buf, op=cl.Sum, name="bench")
    ref = cl.allreduce(data, op=cl.Sum, name="bench.ref")
    assert np.allclose(buf, ref, rtol=1e-4, atol=1e-4)
    from commlib.algorithms import select
    from commlib.api import _rt

    ctx = _rt().coordinator._engine.context
    auto = {"runs": select.current(ctx, nbytes).algorithm,
            "predicted": [(c.algorithm, c.predicted_s) for c in select.ranked(ctx, nbytes)[:4]]}
    if cl.rank() == 0:
        print("RESULT " + json.dumps({"times": times, "workers": cl.size(), "servers": cl.num_servers(),
                                      "auto": auto}), flush=True)
    cl.shutdown()


def traced_worker(nbytes: int, rounds: int, out: str) -> None:
    """push_pull alone, ``rounds`` times, with the client's per-partition trace kept (``--trace``)."""
    import numpy as np

    import commlib as cl
    from commlib.api import _rt

    cl.init()
    buf = np.random.default_rng(cl.rank()).standard_normal(nbytes // 4).astype(np.float32)
    cl.push_pull_(buf, op=cl.Sum, name="bench")
    client = _rt().servers
    client.trace = []
    spans, cpu = [], []
    for _ in range(rounds):
        cl.barrier()
        before = _cpu_times()
        start = time.monotonic()
        cl.push_pull_(buf, op=cl.Sum, name="bench")
        spans.append((start, time.monotonic()))
        cpu.append([b - a for a, b in zip(before, _cpu_times())])
    Path(out, f"worker{cl.rank()}.json").write_text(json.dumps({"spans": spans, "trace": client.trace,
                                                                "cpu": cpu}))
    cl.shutdown()


def transport_rank(workers: int, nbytes: int, rounds: int) -> None:
    """One rank of the raw transport bound (``--transport``): plain TCP between the same hosts, blocking
    sockets and a thread per direction (no MPI on the data path, no polling, no sums). Ranks
    ``0..workers-1`` are the workers, the rest the servers. Mode ``all``: every worker sends ``nbytes``
    spread evenly over the servers and receives as much back from them, all at once (push_pull's
    traffic); mode ``one``: worker 0 sends ``nbytes`` to server 0 on one connection and nothing else
    moves (what one TCP flow gets from one link). MPI (mpi4py, already in the job) only exchanges the
    addresses, holds the barriers and gathers the times; rank 0 prints ``TRANSPORT {json}``."""
    import re
    import socket
    import threading

    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    servers = list(range(workers, size))
    share = nbytes // len(servers)
    shown = subprocess.run(["ip", "-o", "-4", "addr", "show", "eth0"], capture_output=True, text=True).stdout
    address = re.search(r"inet (\S+)/", shown).group(1)
    addresses = comm.allgather(address)
    port = 24000 + rank
    if rank >= workers:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((address, port))
        listener.listen(len(servers) + workers)
    comm.Barrier()
    if rank < workers:
        conns = []
        for s in servers:
            conn = socket.create_connection((addresses[s], 24000 + s))
            conn.sendall(bytes([rank]))
            conns.append(conn)
    else:
        by_worker = {}
        for _ in range(workers):
            conn, _ = listener.accept()
            by_worker[conn.recv(1)[0]] = conn
        conns = [by_worker[w] for w in range(workers)]
        listener.close()
    out = np.ones(share, np.uint8)
    into = [bytearray(share) for _ in conns]

    def receive(conn, buf, times=1):
        view = memoryview(buf)
        for _ in range(times):
            got = 0
            while got < share:
                n = conn.recv_into(view[got:])
                if n == 0:
                    raise ConnectionError("the peer closed the connection")
                got += n

    def send(conn, times=1):
        for _ in range(times):
            conn.sendall(out)

    times: dict[str, list[float]] = {"all": [], "one": []}
    cpu = []
    for mode in ("all", "one"):
        for r in range(rounds + 1):  # the first round warms the connections up
            if mode == "all":
                threads = [threading.Thread(target=send, args=(c,)) for c in conns] + \
                    [threading.Thread(target=receive, args=(c, b)) for c, b in zip(conns, into)]
            elif rank == 0:
                threads = [threading.Thread(target=send, args=(conns[0], len(servers)))]
            elif rank == workers:
                threads = [threading.Thread(target=receive, args=(conns[0], into[0], len(servers)))]
            else:
                threads = []
            comm.Barrier()
            before = _cpu_times()
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
            if r:
                times[mode].append(elapsed)
                if mode == "all":
                    cpu.append([b - a for a, b in zip(before, _cpu_times())])
    for conn in conns:
        conn.close()
    if rank == 0:
        print("TRANSPORT " + json.dumps({"times": times, "cpu": cpu}), flush=True)


def run_transport(cluster, workers: int, servers: int, nbytes: int, rounds: int, env: dict) -> dict:
    """The raw transport bound (:func:`transport_rank`) on ``cluster``'s first ``workers + servers``
    hosts; ``{"error": ...}`` when it fails (the comparison goes on without it)."""
    from commlib.testing.cluster import JobFailed

    me = [sys.executable, str(Path(__file__).resolve()), "--transport", "--workers", str(workers),
          "--bytes", str(nbytes), "--rounds", str(rounds)]
    try:
        done = cluster.mpiexec_mpmd([(list(range(workers + servers)), me)], timeout=120, env=env)
    except JobFailed as exc:
        return {"error": str(exc).splitlines()[0]}
    line = [l for l in done.stdout.splitlines() if l.startswith("TRANSPORT ")][-1]
    return json.loads(line[len("TRANSPORT "):])


def _cpu_times() -> list[int]:
    """The machine's CPU time so far (ticks): user+nice, system, irq+softirq, idle+iowait, all."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return [v[0] + v[1], v[2], v[5] + v[6], v[3] + v[4], sum(v)]


def cpu_use(ticks: list[int]) -> str:
    """'busy 93% (user 20, system 50, irq 23)' from a difference of :func:`_cpu_times`."""
    user, system, irq, idle, total = ticks
    total = max(1, total)
    return (f"machine CPU busy {100 * (total - idle) / total:.0f}% (user {100 * user / total:.0f}, system "
            f"{100 * system / total:.0f}, irq+softirq {100 * irq / total:.0f})")


def traced_server(out: str) -> None:
    """A summation server that keeps its trace and writes it to ``out`` when it exits (``--trace``)."""
    from mpi4py import MPI

    from commlib.config import Config
    from commlib.server.loop import open_server

    config = Config.load()
    server = open_server(MPI.COMM_WORLD, config.server_transport, congestion=config.server_tcp_congestion)
    server.trace = []
    server.run()
    Path(out, f"server{server.index}.json").write_text(json.dumps(server.trace))


def analyze(out: str, nbytes: int, rate_bps: float) -> list[str]:
    """Where a traced push_pull's time goes, round by round: per worker when its pushes went out and its
    answers came in, per server when the last push arrived and the last answer left."""
    workers = sorted(Path(out).glob("worker*.json"))
    servers = sorted(Path(out).glob("server*.json"))
    w = [json.loads(p.read_text()) for p in workers]
    s = [json.loads(p.read_text()) for p in servers]
    bound = nbytes / (rate_bps / 8)
    lines = [f"S/B bound {bound:.3f} s"]
    for r, (start, _) in enumerate(w[0]["spans"]):
        t0 = min(x["spans"][r][0] for x in w)
        t1 = max(x["spans"][r][1] for x in w)
        lines.append(f"round {r}: {t1 - t0:.3f} s ({(t1 - t0) / bound:.2f}x S/B)"
                     + (f", {cpu_use(w[0]['cpu'][r])}" if "cpu" in w[0] else ""))
        for i, x in enumerate(w):
            a, b = x["spans"][r]
            ev = [e for e in x["trace"] if a <= e[0] <= b]
            sent = [e[0] for e in ev if e[1] == "sent"]
            ans = [e[0] for e in ev if e[1] == "answered"]
            if sent and ans:
                lines.append(f"  worker {i}: start +{a - t0:.3f}, last push sent +{max(sent) - t0:.3f}, "
                             f"first answer +{min(ans) - t0:.3f}, last answer +{max(ans) - t0:.3f}, end +{b - t0:.3f}")
        for j, tr in enumerate(s):
            ev = [e for e in tr if t0 <= e[0] <= t1]
            rec = [e[0] for e in ev if e[1] == "received"]
            ans = [e[0] for e in ev if e[1] == "answer"]
            if rec and ans:
                lines.append(f"  server {j}: first push in +{min(rec) - t0:.3f}, last push in +{max(rec) - t0:.3f},"
                             f" first answer +{min(ans) - t0:.3f}, last answer posted +{max(ans) - t0:.3f}, "
                             f"{len(ans)} answers")
    return lines


def run_job(layout: str, workers: int, servers: int, rate: str, nbytes: int, rounds: int,
            allreduces: tuple[str, ...], auto_warmup: int = 0) -> dict:
    from commlib.testing.cluster import Cluster

    hosts = workers + servers if layout == "own" else workers
    server_hosts = list(range(workers, workers + servers)) if layout == "own" else \
        [i % workers for i in range(servers)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    programs = [(list(range(workers)), [sys.executable, str(Path(__file__).resolve()), "--worker",
                                        "--bytes", str(nbytes), "--rounds", str(rounds),
                                        "--allreduces", ",".join(allreduces),
                                        "--auto-warmup", str(auto_warmup)]),
                (server_hosts, [sys.executable, "-m", "commlib.server"])]
    with Cluster([1] * hosts, rate=rate) as cluster:
        transport = run_transport(cluster, workers, servers, nbytes, rounds, env) if layout == "own" else None
        command = cluster.mpmd_args(programs)
        done = cluster.mpiexec_mpmd(programs, timeout=900, env=env)
    line = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
    result["command"] = " ".join(command)
    if transport is not None:
        result["transport"] = transport
    return result


def run_traced(workers: int, servers: int, rate: str, nbytes: int, rounds: int, out: str) -> None:
    from commlib.testing.cluster import Cluster

    env = dict(os.environ, PYTHONPATH=str(REPO))
    me = [sys.executable, str(Path(__file__).resolve())]
    programs = [(list(range(workers)), me + ["--worker", "--bytes", str(nbytes), "--rounds", str(rounds),
                                             "--trace", out]),
                (list(range(workers, workers + servers)), me + ["--serve", "--trace", out])]
    with Cluster([1] * (workers + servers), rate=rate) as cluster:
        cluster.mpiexec_mpmd(programs, timeout=600, env=env)


def summarize(name: str, result: dict, nbytes: int, rate_bps: float) -> tuple[list[str], dict]:
    n = result["workers"]
    link = rate_bps / 8
    ps_bound = nbytes / link
    ar_bound = 2 * (n - 1) / n * nbytes / link
    med = {m: statistics.median(t) for m, t in result["times"].items()}
    # auto may run ps itself (servers on hosts of their own): the best allreduce is among the named ones
    best = min((m for m in med if m not in ("push_pull", "auto")), key=med.get)
    lines = [f"## {name}: {n} workers, {result['servers']} servers",
             f"{'method':24s} {'median s':>9s} {'min s':>8s} {'/ own bound':>12s}  all (s)"]
    for m, t in result["times"].items():
        bound = ps_bound if m == "push_pull" else ar_bound
        lines.append(f"{m:24s} {med[m]:9.3f} {min(t):8.3f} {med[m] / bound:12.2f}  "
                     + " ".join(f"{x:.3f}" for x in t))
    lines += [f"bounds: push_pull S/B = {ps_bound:.3f} s, allreduce 2(n-1)/n S/B = {ar_bound:.3f} s",
              f"best allreduce: {best} {med[best]:.3f} s; push_pull {med['push_pull']:.3f} s = "
              f"{med['push_pull'] / ps_bound:.3f}x its bound, {med[best] / med['push_pull']:.3f}x faster than "
              f"{best}"]
    transport = result.get("transport")
    if transport and "error" in transport:
        lines.append(f"raw transport bound: failed ({transport['error']})")
    elif transport:
        every, one = statistics.median(transport["times"]["all"]), statistics.median(transport["times"]["one"])
        lines += [f"raw transport bound (plain TCP, blocking sockets, no MPI, no sums; same hosts, before the job): "
                  f"each worker sends S spread over the servers and receives S back, all at once: median "
                  f"{every:.3f} s = {every / ps_bound:.2f}x S/B (" + " ".join(f"{x:.3f}" for x in transport["times"]["all"])
                  + f"), {cpu_use([sum(c) for c in zip(*transport['cpu'])])}",
                  f"one TCP flow of S on one link, nothing else moving: median {one:.3f} s = {one / ps_bound:.2f}x "
                  "S/B (" + " ".join(f"{x:.3f}" for x in transport["times"]["one"]) + "; the link's ceiling for "
                  "TCP payload: frame and header bytes count against the rate)",
                  f"push_pull {med['push_pull']:.3f} s = {med['push_pull'] / every:.2f}x the raw transport bound"]
    if "auto" in result:
        lines.append(f"auto runs {result['auto']['runs']} after its warm-up; the cost model predicted "
                     + ", ".join(f"{a} {t:.3f} s" for a, t in result["auto"]["predicted"])
                     + " (without a profile the model assumes 10 Gbit/s links: its ranking counts, not its seconds)")
    return lines, {"median_s": med, "best_allreduce": best, "push_pull_bound_s": ps_bound,
                   "allreduce_bound_s": ar_bound, **result}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--bytes", default="64M")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layouts", default="own,beside")
    parser.add_argument("--allreduces", default=",".join(ALLREDUCES), help="allreduce algorithms to compare")
    parser.add_argument("--auto-warmup", type=int, default=16,
                        help="calls of auto before the timed rounds, while it learns (reported: what it runs then)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--transport", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--report-only", action="store_true", help="rewrite OUT.txt from OUT.json (no jobs)")
    parser.add_argument("--trace", default=None, help="push_pull alone with per-partition traces kept in "
                        "this directory, then where its time went (own layout)")
    parser.add_argument("--out", default=None, help="write OUT.txt and OUT.json (default: print only)")
    args = parser.parse_args()
    from commlib.config import parse_size
    from commlib.testing.cluster import parse_rate

    nbytes = parse_size(args.bytes)
    if args.serve:
        traced_server(args.trace)
        return 0
    if args.transport:
        transport_rank(args.workers, nbytes, args.rounds)
        return 0
    if args.worker and args.trace:
        traced_worker(nbytes, args.rounds, args.trace)
        return 0
    if args.worker:
        worker(nbytes, args.rounds, tuple(args.allreduces.split(",")), args.auto_warmup)
        return 0
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    partition = os.environ.get("COMMLIB_SERVER_PARTITION", "default")
    transport = os.environ.get("COMMLIB_SERVER_TRANSPORT", "default (tcp)")
    lines = [f"# push_pull vs allreduce, {args.bytes} float32, links at {args.rate}, "
             f"COMMLIB_SERVER_PARTITION={partition}, COMMLIB_SERVER_TRANSPORT={transport}",
             f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit}, "
             f"{os.cpu_count()} cores, load average before {os.getloadavg()[0]:.2f} (1 min)",
             f"# {' '.join(sys.argv)}"]
    if args.report_only:
        report = json.loads(Path(args.out + ".json").read_text())
        old = Path(args.out + ".txt").read_text().splitlines()
        lines = [line for line in old[:3]] + [f"# (report rewritten from {args.out}.json by --report-only)"]
        for layout, result in report.items():
            text, _ = summarize(f"servers {'on hosts of their own' if layout == 'own' else 'on the worker hosts'}",
                                result, nbytes, parse_rate(args.rate))
            lines += [""] + text + [f"command: {result['command']}"]
        Path(args.out + ".txt").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return 0
    if args.trace:
        Path(args.trace).mkdir(parents=True, exist_ok=True)
        run_traced(args.workers, args.servers, args.rate, nbytes, args.rounds, args.trace)
        print("\n".join(analyze(args.trace, nbytes, parse_rate(args.rate))))
        return 0
    report = {}
    for layout in args.layouts.split(","):
        result = run_job(layout, args.workers, args.servers, args.rate, nbytes, args.rounds,
                         tuple(args.allreduces.split(",")), args.auto_warmup)
        text, report[layout] = summarize(f"servers {'on hosts of their own' if layout == 'own' else 'on the worker hosts'}",
                                         result, nbytes, parse_rate(args.rate))
        lines += [""] + text + [f"command: {result['command']}"]
        print("\n".join(text), flush=True)
    if args.out:
        Path(args.out + ".txt").write_text("\n".join(lines) + "\n")
        Path(args.out + ".json").write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}.txt and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
