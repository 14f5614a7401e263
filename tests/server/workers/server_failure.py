"""Failures around summation servers. argv[1]: the case.

- ``none``: a job without servers: push_pull and algorithm="ps" fail at once, saying how to launch servers;
- ``stopped``: a server stops answering (SIGSTOP) mid-run: every worker fails within the timeout, naming
  it; then worker 0 kills it, which ends the job;
- ``killed``: a server is killed (SIGKILL) mid-run: the job ends (mpiexec names the rank).
Named cases on every worker (tests/spmd.py); the job ends after them.
"""

import os
import signal
import sys
import time

import numpy as np

import commlib as cl
import spmd
from commlib.server.client import ServerError

#: far above COMMLIB_SERVER_TIMEOUT (3 s in the tests) on any load: the bound is the feature (a stopped
#: server fails the workers instead of hanging them), not how fast a loaded machine says so
FAILS_WITHIN_S = 60.0
rank = size = victim = 0


@spmd.case
def init():
    global rank, size
    cl.init()
    rank, size = cl.rank(), cl.size()


def server_pids():
    """The servers of this job on this host: processes of our launcher running commlib.server."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().split(b"\0")
        except OSError:
            continue
        if ppid == os.getppid() and b"commlib.server" in cmdline:
            pids.append(int(entry))
    return sorted(pids)


@spmd.case
def ps_without_servers_is_refused_and_commlib_keeps_working():
    assert cl.num_servers() == 0
    for attempt in (lambda: cl.push_pull(np.ones(3, np.float32), name="x"),
                    lambda: cl.allreduce(np.ones(3, np.float32), algorithm="ps", name="y")):
        try:
            attempt()
        except cl.CommlibError as exc:
            assert "needs summation servers" in str(exc) and "commlib.server" in str(exc), str(exc)
            print(f"refused on rank {rank}: {exc}", flush=True)
        else:
            raise AssertionError("ps without servers accepted")
    # the library keeps working
    assert np.all(cl.allreduce(np.ones(3, np.float32), op=cl.Sum, name="z") == size)


@spmd.case
def shutdown():
    cl.shutdown()


def partitions() -> int:
    return 4 * int(os.environ["COMMLIB_SERVER_PARTITION"]) // 4 * cl.num_servers()  # every server owns one


@spmd.case
def push_pull_then_worker_0_stops_or_kills_a_server():
    global victim
    n = partitions()
    assert np.all(cl.push_pull(np.ones(n, np.float32), op=cl.Sum, name="warm") == size)
    cl.barrier()
    victim = server_pids()[0]
    if rank == 0:
        how = sys.argv[1]
        os.kill(victim, signal.SIGSTOP if how == "stopped" else signal.SIGKILL)
        print(f"worker 0 sent {how} to server pid {victim}", flush=True)
    cl.barrier()


@spmd.case
def every_worker_fails_naming_the_server():
    start = time.monotonic()
    try:
        cl.push_pull(np.ones(partitions(), np.float32), op=cl.Sum, name="after")
    except ServerError as exc:
        took = time.monotonic() - start
        assert "server" in str(exc) and "rank" in str(exc), str(exc)
        print(f"worker {rank} failed after {took:.1f} s: {exc}", flush=True)
        assert took < FAILS_WITHIN_S, took
    else:
        raise AssertionError("push_pull completed with a server stopped")


if __name__ == "__main__":
    if sys.argv[1] == "none":
        spmd.main(["init", "ps_without_servers_is_refused_and_commlib_keeps_working", "shutdown"])
    else:
        spmd.main(["init", "push_pull_then_worker_0_stops_or_kills_a_server", "every_worker_fails_naming_the_server"])
        cl.barrier()
        if rank == 0:
            print("killing the stopped server", flush=True)
            os.kill(victim, signal.SIGKILL)
        time.sleep(30)  # mpiexec ends the job
