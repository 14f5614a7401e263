"""Who is a worker and who is a summation server: found once per process, at the first ``init()``.

Workers and servers are ranks of one MPI job, launched MPMD (``mpiexec -n W python train.py : -n S python
-m commlib.server``). Every process of the job calls :func:`job` on the user's communicator (the workers
from ``init()``, the servers from their main loop): a duplicate of it (``full``) carries all traffic
between workers and servers, an allgather tells each process every other's role and host, and a split
gives the workers a communicator of their own, on which ``size()``, ``rank()``, every collective and
process set count workers only. Servers are ranks of no set.

The result is kept for the life of the process: a later ``init()`` (after ``shutdown()``) duplicates the
workers' communicator again instead of involving the servers in a collective, so a server needs no
start-up exchange after each `init()`.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import socket
import time

from mpi4py import MPI

from . import protocol

WORKER, SERVER = "worker", "server"

log = logging.getLogger("commlib")


@dataclasses.dataclass(frozen=True)
class Job:
    """The job's layout as one process sees it. ``full``: workers and servers; ``own``: this process's
    role only (for workers, the communicator commlib's runtime duplicates); ``roles``/``hosts`` by rank of
    ``full``; ``workers``/``servers``: the ranks of ``full`` of each role, in order."""

    full: "MPI.Comm"
    own: "MPI.Comm"
    roles: tuple[str, ...]
    hosts: tuple[str, ...]

    @property
    def workers(self) -> tuple[int, ...]:
        return tuple(r for r, role in enumerate(self.roles) if role == WORKER)

    @property
    def servers(self) -> tuple[int, ...]:
        return tuple(r for r, role in enumerate(self.roles) if role == SERVER)

    def describe_server(self, index: int) -> str:
        """``server 1 (rank 5 of the job, on host-b)``: how errors name a server."""
        rank = self.servers[index]
        return f"server {index} (rank {rank} of the job, on {self.hosts[rank]})"


_jobs: dict[int, Job] = {}  # by the user's communicator handle: one layout per communicator per process


def job(comm: "MPI.Comm", role: str) -> Job:
    """The job's layout over ``comm`` (collective over every process of ``comm`` the first time in this
    process, workers and servers alike; free afterwards)."""
    key = int(comm.handle)
    found = _jobs.get(key)
    if found is not None:
        return found
    full = comm.Dup()
    reports = full.allgather((role, socket.gethostname()))
    roles = tuple(r for r, _ in reports)
    hosts = tuple(h for _, h in reports)
    if SERVER in roles:
        own = full.Split(0 if role == WORKER else 1, full.Get_rank())
        if role == WORKER and WORKER in roles:
            servers = tuple(r for r, x in enumerate(roles) if x == SERVER)
            atexit.register(_say_exit, full, servers)
    else:
        own = full
    found = _jobs[key] = Job(full, own, roles, hosts)
    return found


def _say_exit(full: "MPI.Comm", servers: tuple[int, ...], patience_s: float = 2.0) -> None:
    """This worker's process is exiting: tell every server (each exits once every worker has), waiting
    at most ``patience_s`` (a server that died must not hold the exit)."""
    if MPI.Is_finalized():
        return
    requests = [full.issend(None, dest=s, tag=protocol.TAG_EXIT) for s in servers]
    deadline = time.monotonic() + patience_s
    while not MPI.Request.Testall(requests):
        if time.monotonic() > deadline:
            log.warning("commlib: servers at ranks %s did not take this worker's exit notice within %.0f s",
                        [s for s, r in zip(servers, requests) if not r.Test()], patience_s)
            for request in requests:
                try:
                    request.Cancel()
                except MPI.Exception:
                    pass
            return
        time.sleep(1e-3)
