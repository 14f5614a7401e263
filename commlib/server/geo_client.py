"""The worker side of Geo-SGD: a table's deltas pushed to the servers, the merged values received.

:class:`GeoClient` (one per worker runtime, on the job's communicator) opens tables; a :class:`GeoTable`
sends one round at a time (:meth:`GeoTable.push` or :meth:`GeoTable.pull`), every partition to the server
that owns it (the rule of :mod:`.protocol`), and the servers' answers land in ``table.merged``. A
background thread receives the answers, so that the caller keeps computing while they travel; the caller
thread posts the sends. Messages: :class:`.protocol.GeoMessage` and :class:`.protocol.GeoReply` (the
server's side: :mod:`.geo`).

Bounded waits: a partition whose server has not answered for ``timeout_s`` (with nothing heard from that
server meanwhile; a server holding an answer for the staleness bound says so every second) fails the round
with a :class:`~commlib.server.client.ServerError` naming the server, the table and the partition. A reply
that is not what the protocol allows (from a rank that is not a server, malformed, values of another
length) fails the rounds waiting for that server, saying so.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time

import numpy as np
from mpi4py import MPI

from ..coordinator.backoff import Backoff
from . import mpi_messages, protocol
from .client import ServerError
from .discovery import Job
from .protocol import GeoMessage, GeoReply

log = logging.getLogger("commlib")


class GeoTable:
    """One table on this worker: ``total`` values of ``dtype`` in partitions ``parts`` = ``[(lo, hi,
    server)]``. At most one round (push or pull) is in flight; its answers land in :attr:`merged`."""

    def __init__(self, client: "GeoClient", key: str, total: int, dtype: np.dtype, staleness: int | None):
        self.client = client
        self.key = key
        self.total = total
        self.dtype = np.dtype(dtype)
        self.staleness = -1 if staleness is None else int(staleness)
        per, nparts = protocol.partitions(total, self.dtype.itemsize, client.partition_bytes, len(client.servers))
        self.parts = [(p * per, min(total, (p + 1) * per), protocol.server_of(key, p, len(client.servers)))
                      for p in range(nparts)]
        self.merged = np.empty(total, self.dtype)
        self.round = 0  # the last round pushed
        self.outstanding: dict[int, float] = {}  # partition -> when its request went out
        self.error: BaseException | None = None
        self.slowest = 0  # the lowest clock among the workers in, as the last answers said
        self.waiting = ""  # what a server holding an answer last said
        self.done = threading.Event()
        self.done.set()
        self.closed = False

    def message(self, kind: str, part: int, rnd: int = 0) -> GeoMessage:
        """This worker's message of ``kind`` about partition ``part``."""
        lo, hi, _ = self.parts[part]
        return GeoMessage(kind, self.key, part, self.total, hi - lo, self.dtype.name, self.staleness,
                          self.client.worker, rnd)

    def open(self, values: np.ndarray) -> None:
        """Worker 0: give the servers the starting values (a copy is sent)."""
        values = np.array(values, self.dtype, copy=True)
        self.client.post([(self.message("open", p), values[lo:hi], server)
                          for p, (lo, hi, server) in enumerate(self.parts)])

    def push(self, delta: np.ndarray, rnd: int) -> None:
        """Send round ``rnd``'s ``delta`` (not to be changed until the round is done; :meth:`wait`)."""
        self.client.start(self, rnd, [(self.message("push", p, rnd), delta[lo:hi], server)
                                      for p, (lo, hi, server) in enumerate(self.parts)])

    def pull(self) -> None:
        """Ask for the merged values without pushing anything."""
        self.client.start(self, self.round, [(self.message("pull", p), None, server)
                                             for p, (_, _, server) in enumerate(self.parts)])

    def ready(self) -> bool:
        """Whether the round in flight (if any) is answered; raises its error if it failed."""
        self.check()
        return self.done.is_set()

    def wait(self) -> None:
        """Block until the round in flight is answered (raises its error if it failed)."""
        self.client.wait(self)
        self.check()

    def check(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def leave(self) -> None:
        """Done with the table: the servers stop counting this worker in the staleness bound."""
        if not self.closed:
            self.closed = True
            self.client.leave(self)


class GeoClient:
    """Geo-SGD's transport for one worker runtime over ``job`` (which has servers). Thread-safe."""

    def __init__(self, job: Job, partition_bytes: int, timeout_s: float, max_sleep_s: float = 1e-3):
        self.job = job
        self.comm = job.full
        self.servers = job.servers
        self.worker = job.workers.index(self.comm.Get_rank())
        self.partition_bytes = partition_bytes
        self.timeout_s = timeout_s
        self._lock = threading.RLock()
        self._numbers = itertools.count()  # tables opened: every worker opens its tables in the same order
        self._tables: dict[str, GeoTable] = {}
        self._sends: list[MPI.Request] = []
        self._leaves: list[MPI.Request] = []
        #: receives of answers' values: (request, its table or None to drop them, partition, bytes expected)
        self._recvs: list[tuple[MPI.Request, GeoTable | None, int, int]] = []
        self._heard = [time.monotonic()] * len(self.servers)
        self._backoff = Backoff(max_sleep_s)
        self._status = MPI.Status()
        self._stop = False
        self._work = threading.Event()  # set when something goes out: the idle thread then polls again
        self._thread: threading.Thread | None = None

    @property
    def closed(self) -> bool:
        return self._stop

    def table_key(self, name: str) -> str:
        """The key of the next table this worker opens, named ``name`` (equal on every worker that opens
        its tables in the same order)."""
        return f"geo/{name}#{next(self._numbers)}"

    def open(self, key: str, values: np.ndarray, staleness: int | None) -> GeoTable:
        """Open table ``key`` over ``values`` (1-D, float32 or float64; equal on every worker: worker 0's
        are the servers' starting point)."""
        if values.dtype.name not in protocol.GEO_DTYPES:
            raise ServerError(f"Geo-SGD table {key!r}: dtype {values.dtype} is not one of {', '.join(protocol.GEO_DTYPES)}")
        if self._stop:
            raise ServerError(f"Geo-SGD table {key!r}: commlib shut down")
        table = GeoTable(self, key, values.size, values.dtype, staleness)
        with self._lock:
            self._tables[key] = table
        if self.worker == 0:
            table.open(values)
        self._ensure_thread()
        return table

    def post(self, messages: list, synchronous: bool = False) -> list:
        """Post ``(message, values or None, server)`` each; the requests of the headers. ``synchronous``:
        the headers' sends complete only once their server has taken them."""
        headers = []
        with self._lock:
            for message, data, server in messages:
                dest = self.servers[server]
                headers.append(mpi_messages.post(self.comm, message.encode(), dest, protocol.TAG_GEO, synchronous))
                if data is not None:
                    self._sends.append(self.comm.Isend(data.view(np.uint8), dest=dest, tag=protocol.TAG_GEO_DATA))
            self._sends += headers
        self._work.set()
        return headers

    def start(self, table: GeoTable, rnd: int, messages: list) -> None:
        """Send ``table``'s round ``rnd`` (its ``messages``, as :meth:`post` takes them)."""
        table.check()
        if table.closed or self._stop:
            raise ServerError(f"Geo-SGD table {table.key!r} is closed")
        if not table.done.is_set():
            raise ServerError(f"Geo-SGD table {table.key!r}: round {table.round} is still in flight; wait for it")
        table.round = rnd
        if not table.parts:
            return
        with self._lock:
            table.done.clear()
            now = time.monotonic()
            table.outstanding = {p: now for p in range(len(table.parts))}
        self.post(messages)

    def leave(self, table: GeoTable) -> None:
        """``table`` is done on this worker: tell its servers (synchronous sends, which :meth:`close` waits
        for, so that the servers have taken the leave before this worker's next runtime opens a table of the
        same key) and forget it."""
        with self._lock:
            self._tables.pop(table.key, None)
        if not MPI.Is_finalized():
            self._leaves += self.post([(table.message("leave", p), None, server)
                                       for p, (_, _, server) in enumerate(table.parts)], synchronous=True)

    # -- progress -----------------------------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._progress, name="commlib-geo", daemon=True)
            self._thread.start()

    def _progress(self) -> None:
        last = checked = time.monotonic()
        try:
            while not self._stop:
                moved = self._cycle()
                now = time.monotonic()
                if now - checked > 0.1:
                    self._check_deadlines(now)
                    checked = now
                if moved:
                    last = now
                elif self._idle():  # nothing asked for: no answer, error or heartbeat can come
                    self._work.wait(0.1)
                    self._work.clear()
                else:
                    self._backoff.pause(now - last)
        except BaseException as exc:  # never leave a waiter blocked
            log.error("commlib: the Geo-SGD progress thread failed: %r", exc)
            with self._lock:
                for table in self._tables.values():
                    self._fail(table, ServerError(f"Geo-SGD table {table.key!r}: the progress thread failed: "
                                                  f"{exc!r}"))

    def _cycle(self) -> bool:
        with self._lock:
            if MPI.Is_finalized():
                return False
            moved = False
            for source, reply in mpi_messages.arrived(self.comm, protocol.TAG_GEO_REPLY, self._status, GeoReply):
                moved = True
                self._reply(source, reply)
            if self._recvs:
                done = mpi_messages.test_some([r for r, *_ in self._recvs])
                if done:
                    moved = True
                    finished = [self._recvs[i] + (nbytes,) for i, nbytes in done]
                    gone = {i for i, _ in done}
                    self._recvs = [item for i, item in enumerate(self._recvs) if i not in gone]
                    for _, table, part, expected, nbytes in finished:
                        if table is None:
                            continue
                        server = table.parts[part][2]
                        self._heard[server] = time.monotonic()
                        if nbytes != expected:
                            self._malformed(server, f"{nbytes} bytes of values for Geo-SGD table {table.key!r} "
                                                    f"partition {part}, of {expected}")
                        elif table.outstanding.pop(part, None) is not None and not table.outstanding:
                            table.done.set()
            if self._sends:
                done = mpi_messages.test_some(self._sends)
                if done:
                    moved = True
                    gone = {i for i, _ in done}
                    self._sends = [r for i, r in enumerate(self._sends) if i not in gone]
            return moved

    def _idle(self) -> bool:
        with self._lock:
            return not (self._sends or self._recvs or any(t.outstanding for t in self._tables.values()))

    def _reply(self, source: int, reply: GeoReply | protocol.ProtocolError) -> None:
        """A server's answer (under the lock): post the receive of its values into the table's
        ``merged`` (the next message on TAG_GEO_VALUES from that server), or note what it says."""
        if source not in self.servers:
            log.error("commlib: dropped a Geo-SGD reply from rank %d, which is not a server", source)
            return
        server = self.servers.index(source)
        if isinstance(reply, protocol.ProtocolError):  # its values, if any, can no longer be matched
            self._malformed(server, str(reply))
            return
        self._heard[server] = time.monotonic()
        table = self._tables.get(reply.key)
        live = table is not None and reply.part in table.outstanding and table.parts[reply.part][2] == server
        if reply.kind == "values":
            if not live:  # a round given up: its values are taken and dropped, in order
                request = self.comm.Irecv(np.empty(reply.nbytes, np.uint8), source=source, tag=protocol.TAG_GEO_VALUES)
                self._recvs.append((request, None, reply.part, reply.nbytes))
                return
            lo, hi, _ = table.parts[reply.part]
            table.slowest = reply.slowest
            request = self.comm.Irecv(table.merged[lo:hi].view(np.uint8), source=source, tag=protocol.TAG_GEO_VALUES)
            self._recvs.append((request, table, reply.part, table.merged[lo:hi].nbytes))
        elif table is None:
            return
        elif reply.kind == "waiting":
            table.waiting = f"{self.job.describe_server(server)}: {reply.text}"
        else:
            self._fail(table, ServerError(reply.text))

    def _malformed(self, server: int, why: str) -> None:
        """``server`` sent what the protocol does not allow (under the lock): fail the rounds waiting for it."""
        log.error("commlib: dropped a malformed Geo-SGD message from %s: %s", self.job.describe_server(server), why)
        for table in list(self._tables.values()):
            if any(table.parts[p][2] == server for p in table.outstanding):
                self._fail(table, ServerError(f"Geo-SGD table {table.key!r} round {table.round}: "
                                              f"{self.job.describe_server(server)} sent a malformed message ({why})"))

    def _fail(self, table: GeoTable, error: BaseException) -> None:
        """Fail ``table``'s round in flight (under the lock); answers that still come are dropped."""
        if table.done.is_set():
            return
        table.error = error
        table.outstanding = {}
        table.done.set()

    def _check_deadlines(self, now: float) -> None:
        if not self.timeout_s:
            return
        with self._lock:
            for table in list(self._tables.values()):
                for part, since in list(table.outstanding.items()):
                    server = table.parts[part][2]
                    waited = now - max(since, self._heard[server])
                    if waited > self.timeout_s:
                        self._fail(table, ServerError(
                            f"Geo-SGD table {table.key!r} round {table.round}: {self.job.describe_server(server)} "
                            f"has not answered partition {part} for {waited:.1f} s (COMMLIB_SERVER_TIMEOUT="
                            f"{self.timeout_s:g}): the server died or hangs"))
                        break

    def wait(self, table: GeoTable) -> None:
        """Block until ``table``'s round is answered or failed, polling here too (an answer is then read
        without waking the thread)."""
        last = time.monotonic()
        while not table.done.is_set():
            if self._cycle():
                last = time.monotonic()
                continue
            idle = time.monotonic() - last
            if idle > 0.01:
                table.done.wait(0.05)
                if self._thread is None or not self._thread.is_alive():
                    with self._lock:
                        self._fail(table, ServerError(f"Geo-SGD table {table.key!r}: the progress thread is "
                                                      "not running"))
            else:
                self._backoff.pause(idle)

    def close(self, patience_s: float = 5.0) -> None:
        """Let the rounds in flight finish (at most ``patience_s``), leave every table, wait for the sends
        and for the servers to take the leaves (as long), stop the thread."""
        if self._thread is None or self._stop or MPI.Is_finalized():
            self._stop = True
            return
        deadline = time.monotonic() + patience_s
        for table in list(self._tables.values()):
            while not table.done.is_set() and time.monotonic() < deadline:
                time.sleep(1e-3)
            table.leave()
        while (self._sends or not MPI.Request.Testall(self._leaves)) and time.monotonic() < deadline:
            self._cycle()
            time.sleep(1e-3)
        self._stop = True
        self._work.set()
        self._thread.join()
