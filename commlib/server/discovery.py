"""Who is a worker and who is a summation server: found once per process, at the first ``init()``.

Workers and servers are ranks of one MPI job, launched MPMD (``mpiexec -n W python train.py : -n S python
-m commlib.server``). Every process of the job calls :func:`job` on the user's communicator (the workers
from ``init()``, the servers from their main loop): a duplicate of it (``full``) carries all traffic
between workers and servers, an allgather tells each process every other's role and host, and a split
gives the workers a communicator of their own, on which ``size()``, ``rank()``, every collective and
process set count workers only. Servers are ranks of no set.

Before any collective, a roll call with a deadline (``start_timeout_s``, COMMLIB_START_TIMEOUT): every
process reports its role and host to rank 0, which answers everyone with the table once every process
has reported, or, at the deadline, with the ranks still missing; then every process that started raises
an error naming them (a server that never starts would otherwise hold every worker in the first
collective forever). Rank 0 missing: the others name it after the deadline plus a grace period.

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

from ..errors import CommlibError
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
    #: by rank of ``full``: where a server listens for push_pull over TCP (:class:`.tcp.Endpoint`), or None
    endpoints: tuple = ()

    @property
    def tcp(self) -> bool:
        """Whether push_pull's data goes over TCP: every server listens (COMMLIB_SERVER_TRANSPORT=tcp)."""
        return bool(self.servers) and all(self.endpoints[r] is not None for r in self.servers)

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


#: The roll call's tag on the user's communicator (point-to-point, before the job's own duplicate exists).
TAG_ROLL_CALL = 32001
#: How much longer than the deadline the other processes wait for rank 0's table.
GRACE_S = 10.0


class StartError(CommlibError):
    """A process of the MPI job did not start in time."""


_jobs: dict[int, Job] = {}  # by the user's communicator handle: one layout per communicator per process


def job(comm: "MPI.Comm", role: str, start_timeout_s: float = 0.0, endpoint=None) -> Job:
    """The job's layout over ``comm`` (collective over every process of ``comm`` the first time in this
    process, workers and servers alike; free afterwards). A server passes ``endpoint`` when it takes
    push_pull's data over TCP (:mod:`.tcp`); the workers find it in ``Job.endpoints``. Raises :class:`StartError` on every process
    that started when another has not reached this call within ``start_timeout_s`` (0: wait forever)."""
    key = int(comm.handle)
    found = _jobs.get(key)
    if found is not None:
        return found
    reports = _roll_call(comm, (role, socket.gethostname(), endpoint), start_timeout_s)
    full = comm.Dup()
    roles = tuple(r[0] for r in reports)
    hosts = tuple(r[1] for r in reports)
    if SERVER in roles:
        own = full.Split(0 if role == WORKER else 1, full.Get_rank())
        if role == WORKER and WORKER in roles:
            servers = tuple(r for r, x in enumerate(roles) if x == SERVER)
            atexit.register(_say_exit, full, servers)
    else:
        own = full
    found = _jobs[key] = Job(full, own, roles, hosts, tuple(r[2] for r in reports))
    return found


def _receive(comm: "MPI.Comm", source: int, deadline: float | None):
    """``(arrived, object)``: the next message from ``source`` on the roll call's tag, if it arrives by
    ``deadline`` (None: no deadline). A matched probe, so that a table of any size is received whole."""
    while True:
        message = comm.improbe(source=source, tag=TAG_ROLL_CALL)
        if message is not None:
            return True, message.recv()
        if deadline is not None and time.monotonic() > deadline:
            return False, None
        time.sleep(1e-3)


def _roll_call(comm: "MPI.Comm", me: tuple, timeout_s: float) -> list[tuple]:
    """Every process's ``(role, host, endpoint)``, by rank of ``comm``, once all have reported (see the module)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return [me]
    start = time.monotonic()
    deadline = start + timeout_s if timeout_s else None
    if rank == 0:
        pending = {r: comm.irecv(source=r, tag=TAG_ROLL_CALL) for r in range(1, size)}
        reports = {0: me}
        while pending and (deadline is None or time.monotonic() <= deadline):
            for r, request in list(pending.items()):
                done, message = request.test()
                if done:
                    reports[r] = message
                    del pending[r]
            if pending:
                time.sleep(1e-3)
        missing = sorted(pending)
        for request in pending.values():
            request.Cancel()
        table = (reports, missing)
        MPI.Request.Waitall([comm.isend(table, dest=r, tag=TAG_ROLL_CALL) for r in reports if r])
    else:
        request = comm.isend(me, dest=0, tag=TAG_ROLL_CALL)
        done, table = _receive(comm, 0, None if deadline is None else deadline + GRACE_S)
        if not done:
            raise StartError(f"rank 0 of the MPI job has not started commlib within {timeout_s + GRACE_S:g} s "
                             "(COMMLIB_START_TIMEOUT plus a grace period): it failed to launch or hangs before "
                             "commlib.init(); see its output")
        request.Wait()
        reports, missing = table
    if missing:
        started = {r: reports[r] for r in sorted(reports)}
        workers = [r for r, report in started.items() if report[0] == WORKER]
        servers = [r for r, report in started.items() if report[0] == SERVER]
        raise StartError(
            f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of the MPI job "
            f"did not start within {timeout_s:g} s (COMMLIB_START_TIMEOUT): a summation server (python -m "
            f"commlib.server) or a worker failed to launch or hangs before commlib.init(); see its output. "
            f"Started: workers at ranks {workers or 'none'}, servers at ranks {servers or 'none'}")
    return [reports[r] for r in range(size)]


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
