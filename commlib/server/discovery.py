"""Who is a worker and who is a summation server, and where each server listens: found when the job starts.

Workers and servers are ranks of one MPI job, launched MPMD (``mpiexec -n W python train.py : -n S python
-m commlib.server``). Every process of the job calls :func:`job` on the user's communicator (the workers
from their first ``init()``, the servers from their main loop): a duplicate of it (``full``) carries all
traffic between workers and servers, a roll call tells each process every other's role, host and
addresses, and a split gives the workers a communicator of their own, on which ``size()``, ``rank()``,
every collective and process set count workers only. Servers are ranks of no set.

The roll call has a deadline (``start_timeout_s``, COMMLIB_START_TIMEOUT): every process sends its
:class:`~.protocol.Report` to rank 0, which answers everyone with the table once every process has
reported, or, at the deadline, with the ranks still missing; then every process that started raises an
error naming them (a server that never starts would otherwise hold every worker in the first collective
forever). Rank 0 missing: the others name it after the deadline plus a grace period. When the job has
servers, a second round the same way carries where each server listens for push_pull over TCP (a
:class:`~.protocol.Listening`): a server chooses the job's interface from the first round's table
(:func:`.tcp.job_addresses`) and listens there only. Every message is fixed binary fields, received with
its size bounded (:mod:`.mpi_messages`): nothing is unpickled. A later ``init()`` in the process keeps
the layout, and its workers meet the same way on their own communicator (servers take part once).

The :class:`Job` is kept for the life of the process by whoever called :func:`job` (a worker's in
:mod:`commlib.lifecycle`'s process record, for the next ``init()``, so that a server takes part in this
only once); nothing is kept here.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import socket
import time
from typing import Callable

from mpi4py import MPI

from ..errors import CommlibError
from . import mpi_messages, protocol, tcp

WORKER, SERVER = protocol.ROLES

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


#: The roll call's tags on the user's communicator (point-to-point, before the job's own duplicate exists):
#: the reports, then the servers' listening places.
TAG_ROLL_CALL, TAG_LISTENING = 32001, 32002
#: A later init()'s roll call, among the workers only (on their own communicator): the servers meet once.
TAG_INIT_AGAIN = 32003
#: How much longer than the deadline the other processes wait for rank 0's table.
GRACE_S = 10.0


class StartError(CommlibError):
    """A process of the MPI job did not start in time, or a server could not listen."""


def job(comm: "MPI.Comm", role: str, start_timeout_s: float = 0.0,
        listen: Callable[[tuple[str, ...]], tcp.Endpoint] | None = None, interface: str = "") -> Job:
    """The job's layout over ``comm`` (collective over every process of ``comm``, workers and servers
    alike). A server that takes push_pull's data over TCP passes ``listen``, which listens on the
    addresses it is given (the job's interface, ``interface`` naming it if set: :func:`.tcp.job_addresses`)
    and returns the endpoint; the workers find it in ``Job.endpoints``. Raises :class:`StartError` on every
    process that started when another has not reached this call within ``start_timeout_s`` (0: wait
    forever), or when a server could not listen."""
    host = socket.gethostname()
    me = protocol.Report(role, host, _fitting(tcp.local_addresses(), protocol.REPORT_ADDRESS_BYTES))
    reports = _roll_call(comm, me.encode(), protocol.Report, start_timeout_s, TAG_ROLL_CALL)
    roles = tuple(r.role for r in reports)
    hosts = tuple(r.host for r in reports)
    endpoints: tuple = (None,) * len(reports)
    if SERVER in roles:
        listening = protocol.Listening()
        if listen is not None:
            try:
                addresses = tcp.job_addresses(interface, host, list(hosts), [r.address_list for r in reports])
                listening = listen(addresses).listening()
            except OSError as exc:
                listening = protocol.Listening(error=protocol.cut(f"the server at rank {comm.Get_rank()} on {host} "
                                                                  f"cannot listen: {exc}"))
        places = _roll_call(comm, listening.encode(), protocol.Listening, start_timeout_s, TAG_LISTENING)
        failed = [p.error for p in places if p.error]
        if failed:
            raise StartError("; ".join(failed))
        endpoints = tuple(tcp.Endpoint.of(p) for p in places)
    full = comm.Dup()
    if SERVER in roles:
        own = full.Split(0 if role == WORKER else 1, full.Get_rank())
        if role == WORKER and WORKER in roles:
            servers = tuple(r for r, x in enumerate(roles) if x == SERVER)
            atexit.register(_say_exit, full, servers)
    else:
        own = full
    return Job(full, own, roles, hosts, endpoints)


def _fitting(addresses: tuple[str, ...], limit: int) -> str:
    """``addresses`` comma-separated, as many as fit in ``limit`` bytes (the first ones: loopback is last)."""
    text = ""
    for address in addresses:
        longer = f"{text},{address}" if text else address
        if len(longer) > limit:
            break
        text = longer
    return text


def worker_job(comm: "MPI.Comm", known: dict | None, start_timeout_s: float = 0.0, meet: bool = False) -> Job:
    """A worker's layout of the job over ``comm``: the one ``known`` holds for that communicator (a
    runtime of this process found it), else :func:`job`'s, kept in ``known``. With ``meet`` (a runtime
    starts), a known layout's workers also meet under the start deadline, so that a rank that never calls
    ``init()`` again fails the others' ``init()``, naming it, instead of holding them in MPI for ever."""
    key = int(comm.handle)
    found = known.get(key) if known is not None else None
    if found is None:
        found = job(comm, WORKER, start_timeout_s)
        if known is not None:
            known[key] = found
    elif meet:
        me = protocol.Report(WORKER, socket.gethostname(), "")
        _roll_call(found.own, me.encode(), protocol.Report, start_timeout_s, TAG_INIT_AGAIN, _not_again)
    return found


def _roll_call(comm: "MPI.Comm", mine: bytes, kind: type, timeout_s: float, tag: int,
               not_started: Callable[[list[int], dict, float], str] | None = None) -> list:
    """Every process's message of ``kind`` (``mine`` is this process's, encoded), by rank of ``comm``, once
    all have sent theirs (see the module). ``not_started(missing, reports, timeout_s)`` words the error
    when some never sent theirs (the job's start by default)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return [kind.decode(mine)]
    limit = kind.LAYOUT.max_size
    status = MPI.Status()
    deadline = time.monotonic() + timeout_s if timeout_s else None
    if rank == 0:
        reports: dict[int, bytes] = {0: mine}
        malformed: dict[int, str] = {}
        while len(reports) + len(malformed) < size and (deadline is None or time.monotonic() <= deadline):
            got = mpi_messages.take(comm, tag, status, kind)
            if got is None:
                time.sleep(1e-3)
                continue
            source, message = got
            if isinstance(message, protocol.ProtocolError):
                malformed[source] = str(message)
            else:
                reports[source] = message.encode()
        missing = [r for r in range(size) if r not in reports]
        table = protocol.pack_table([reports.get(r, b"") for r in range(size)], missing)
        MPI.Request.Waitall([mpi_messages.post(comm, table, r, tag) for r in range(1, size)])
        if malformed:
            log.error("commlib: malformed roll call messages: %s",
                      "; ".join(f"rank {r}: {why}" for r, why in malformed.items()))
    else:
        request = mpi_messages.post(comm, mine, 0, tag)
        data = _receive_table(comm, tag, status, protocol.table_limit(size, limit),
                              None if deadline is None else deadline + GRACE_S)
        if data is None and not_started is not None:
            raise StartError(not_started([0], {}, timeout_s + GRACE_S))
        if data is None:
            raise StartError(f"rank 0 of the MPI job has not started commlib within {timeout_s + GRACE_S:g} s "
                             "(COMMLIB_START_TIMEOUT plus a grace period): it failed to launch or hangs before "
                             "commlib.init(); see its output")
        request.Wait()
        try:
            table, missing = protocol.unpack_table(data, size, limit)
            reports = {r: table[r] for r in range(size) if r not in missing}
        except protocol.ProtocolError as exc:
            raise StartError(f"rank 0's answer to the job's roll call is malformed ({exc}); is every process "
                             "of the job running the same commlib?") from None
    decoded = {r: kind.decode(data) for r, data in reports.items()}
    if missing:
        raise StartError((not_started or _not_started)(missing, decoded, timeout_s))
    return [decoded[r] for r in range(size)]


def _not_started(missing: list[int], decoded: dict, timeout_s: float) -> str:
    """The start's error: who never came, and who did, by role."""
    workers = [r for r, report in sorted(decoded.items()) if getattr(report, "role", SERVER) == WORKER]
    servers = [r for r, report in sorted(decoded.items()) if getattr(report, "role", WORKER) == SERVER]
    return (f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of the MPI job "
            f"did not start (or sent a malformed start-up message) within {timeout_s:g} s (COMMLIB_START_TIMEOUT): "
            f"a summation server (python -m commlib.server) or a worker failed to launch or hangs before "
            f"commlib.init(); see its output. Started: workers at ranks {workers or 'none'}, servers at ranks "
            f"{servers or 'none'}")


def _not_again(missing: list[int], decoded: dict, timeout_s: float) -> str:
    """A later ``init()``'s error: the workers that did not call it."""
    return (f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not call commlib.init() "
            f"again within {timeout_s:g} s (COMMLIB_START_TIMEOUT): after shutdown(), every rank must call "
            f"init() before any can use commlib again")


def _receive_table(comm: "MPI.Comm", tag: int, status: "MPI.Status", limit: int, deadline: float | None):
    """Rank 0's table, if it arrives by ``deadline`` (None: no deadline); b"" when it was too long."""
    while True:
        got = mpi_messages.receive(comm, tag, status, limit, source=0)
        if got is not None:
            return got[1] if got[1] is not None else b""
        if deadline is not None and time.monotonic() > deadline:
            return None
        time.sleep(1e-3)


def _say_exit(full: "MPI.Comm", servers: tuple[int, ...], patience_s: float = 2.0) -> None:
    """This worker's process is exiting: tell every server (each exits once every worker has), waiting
    at most ``patience_s`` (a server that died must not hold the exit)."""
    if MPI.Is_finalized():
        return
    requests = [mpi_messages.post(full, b"", s, protocol.TAG_EXIT, synchronous=True) for s in servers]
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
