"""A job with summation servers started by commlib-run (tests/run/test_run.py). argv[1]: the case.

- ``values``: push_pull of float32 (Sum and Average) and int64 tensors of 0, 1 and several partitions
  against numpy, the same bits on every worker; then rank 0 prints one ``RUNSERVERS {json}`` line with
  every worker's and every server's host;
- ``killed``: after one push_pull, worker 0 kills server 0 (SIGKILL; the emulated hosts share the process
  table: the server is the process of this job, below the same mpiexec, whose PMI_RANK is the server's
  rank), then every worker pushes again until it fails or the launcher ends it. Before the kill, worker 0
  removes the names of the shared-memory files the job's processes map (the kills would leave them).
"""

import json
import os
import signal
import socket
import sys
import time

import numpy as np

import commlib as cl

case = sys.argv[1]
cl.init()
rank, size = cl.rank(), cl.size()
runtime_job = cl.api._rt().servers.job  # the layout discovery found: roles and hosts by rank of the job
servers = [runtime_job.hosts[r] for r in runtime_job.servers]
rng = np.random.default_rng(1000 + rank)



def _parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _ancestors(pid):
    chain = []
    while pid > 1:
        pid = _parent(pid)
        chain.append(pid)
    return chain


def job_processes():
    """``{pid: PMI_RANK}`` of every process of this job: the commlib processes below the same mpiexec (not
    the labellers commlib-run starts each of them through, commlib/run/output.py)."""
    launcher = next(p for p in _ancestors(os.getpid()) if b"mpiexec" in open(f"/proc/{p}/cmdline", "rb").read())
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                labeller = b"commlib/run/output.py" in f.read()
            if b"PMI_RANK" in env and not labeller and launcher in _ancestors(int(entry)):
                found[int(entry)] = int(env[b"PMI_RANK"])
        except (OSError, ValueError):
            continue
    return found


def unlink_shared_memory(pids):
    """Remove the names of MPICH's shared-memory files these processes map (the mappings stay valid): the
    launcher's kill that follows would leave them in /dev/shm."""
    for pid in pids:
        with open(f"/proc/{pid}/maps") as maps:
            paths = {line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6}
        for path in paths:
            if path.startswith("/dev/shm/mpich_shm_") and os.path.exists(path):
                os.unlink(path)


if case == "values":
    partition = int(os.environ["COMMLIB_SERVER_PARTITION"])
    for n in (0, 1, 7, 3 * partition // 4 * len(servers) + 5):  # the last spans every server
        for dtype, op in ((np.float32, cl.Sum), (np.float32, cl.Average), (np.int64, cl.Sum)):
            mine = (rng.standard_normal(n) * 10).astype(dtype)
            every = cl.allgather(mine[None, :] if n else np.zeros((1, 0), dtype), name=f"in.{n}.{op}.{dtype}")
            expect = every.astype(np.float64).sum(axis=0) / (size if op is cl.Average else 1)
            got = cl.push_pull(mine, op=op, name=f"pp.{n}.{op}.{dtype}")
            assert got.dtype == mine.dtype and got.shape == mine.shape, (got.dtype, got.shape)
            assert np.allclose(got, expect, rtol=1e-5, atol=1e-4), (n, op, dtype, np.abs(got - expect).max())
            bits = cl.allgather(got.view(np.uint8)[None, :], name=f"bits.{n}.{op}.{dtype}")
            assert (bits == bits[0]).all(), f"workers differ for n={n} {op} {dtype}"
    hosts = cl.allgather_object(socket.gethostname())
    if rank == 0:
        print("RUNSERVERS " + json.dumps({"workers": hosts, "servers": servers, "size": size,
                                          "num_servers": cl.num_servers()}), flush=True)
    cl.shutdown()
    print(f"values ok on worker {rank}", flush=True)
elif case == "killed":
    x = np.ones(1 << 16, np.float32)
    assert (cl.push_pull(x, op=cl.Sum, name="before") == size).all()
    cl.barrier()
    if rank == 0:
        processes = job_processes()
        assert sorted(processes.values()) == list(range(size + len(servers))), processes
        unlink_shared_memory(processes)
        victim = next(pid for pid, r in processes.items() if r == runtime_job.servers[0])
        print(f"worker 0 kills server 0 (pid {victim}, on {servers[0]})", flush=True)  # the job may end first
        os.kill(victim, signal.SIGKILL)
    start = time.monotonic()
    try:
        while time.monotonic() - start < 60:
            cl.push_pull(x, op=cl.Sum, name="after")
            time.sleep(0.05)
    except cl.CommlibError as exc:
        print(f"worker {rank} failed after {time.monotonic() - start:.1f} s: {exc}", flush=True)
        sys.exit(1)
    print(f"worker {rank} never failed", flush=True)
