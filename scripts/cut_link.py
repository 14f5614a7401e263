"""A network link cut under a running job, on the emulated cluster (docs/cluster.md, docs/failures.md).

    python scripts/cut_link.py [--hosts 1,1] [--rate 1gbit] [--mode 1m] [--timeout 10] [--how cut|stop]

Runs tests/transport/workers/link_cut.py (a loop of allreduce_ calls; ``1m``: 1 MiB) on every rank, takes the last
host's link down (``ip link set <its bridge-side veth> down``; ``--how stop``: SIGSTOP its ranks) once
every rank loops, and reports when each rank raised, what it named, how much CPU the ranks used while
they waited, and when mpiexec exited. Needs root (namespaces). Without ``--timeout`` the default
COMMLIB_TIMEOUT applies.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from commlib.testing.cluster import Cluster  # noqa: E402


def cpu_seconds(pid: str) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="1,1")
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--mode", default="1m")
    parser.add_argument("--timeout", type=float, default=None, help="COMMLIB_TIMEOUT (default: commlib's)")
    parser.add_argument("--how", choices=["cut", "stop"], default="cut")
    parser.add_argument("--limit", type=float, default=None, help="give up on mpiexec after this (s)")
    parser.add_argument("--sigterm-after", type=float, default=None,
                        help="send mpiexec a SIGTERM this many seconds after the cut (as `timeout` would)")
    args = parser.parse_args()
    hosts = [int(h) for h in args.hosts.split(",")]
    size = sum(hosts)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMLIB_")}
    env["PYTHONPATH"] = str(REPO)
    if args.timeout is not None:
        env["COMMLIB_TIMEOUT"] = str(args.timeout)
    limit = args.limit or (args.timeout or 600) + 60
    folder = Path(tempfile.mkdtemp(prefix="cut-link-"))
    with Cluster(hosts=hosts, rate=args.rate) as cluster:
        cmd = cluster.mpiexec_args() + [sys.executable, str(REPO / "tests/transport/workers/link_cut.py"), args.mode, str(folder)]
        job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               start_new_session=True)
        while not all((folder / f"ready.{r}").exists() for r in range(size)):
            if job.poll() is not None:
                print(job.stdout.read())
                return 1
            time.sleep(0.05)
        time.sleep(2)
        pids = {r: (folder / f"ready.{r}").read_text() for r in range(size)}
        lost_host = len(hosts) - 1
        if args.how == "cut":
            subprocess.run(["ip", "link", "set", f"{cluster.name}-h{lost_host}", "down"], check=True)
        else:
            for r in range(size):
                if cluster.host_of_rank(r) == lost_host:
                    os.kill(int(pids[r]), signal.SIGSTOP)
        cut = time.time()
        if args.sigterm_after is not None:
            time.sleep(args.sigterm_after)
            job.send_signal(signal.SIGTERM)
        time.sleep(2)
        before = {r: cpu_seconds(p) for r, p in pids.items() if Path(f"/proc/{p}").exists()}
        time.sleep(4)
        cpu = {r: (cpu_seconds(pids[r]) - c) / 4 for r, c in before.items() if Path(f"/proc/{pids[r]}").exists()}
        try:
            job.communicate(timeout=limit)
            ended = time.time() - cut
        except subprocess.TimeoutExpired:
            ended = None
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
        print(f"{args.how} of host {lost_host} ({cluster.hosts[lost_host]}); hosts {hosts}, rate {args.rate}, "
              f"mode {args.mode}, COMMLIB_TIMEOUT={args.timeout if args.timeout is not None else 'default'}"
              + (f", SIGTERM to mpiexec {args.sigterm_after:g} s after the cut" if args.sigterm_after is not None else ""))
        print("CPU used per rank in the 4 s from 2 s after the cut (cores): "
              + ", ".join(f"rank {r}: {c:.2f}" for r, c in sorted(cpu.items())))
        for r in range(size):
            path = folder / f"result.{r}"
            if path.exists():
                res = json.loads(path.read_text())
                print(f"rank {r}: {res['type']} {res['time'] - cut:.1f} s after the cut (after {res['calls']} calls), "
                      f"ranks={res['ranks']}, next call: {res['again']} in {res['again_s'] * 1e3:.1f} ms: "
                      f"{res['message'][:240]}")
            else:
                print(f"rank {r}: no failure recorded")
        print(f"mpiexec exited {ended:.1f} s after the cut (status {job.returncode})" if ended is not None
              else f"mpiexec still ran {limit:.0f} s after the cut (killed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
