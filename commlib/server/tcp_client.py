"""push_pull's worker side over TCP (:mod:`.tcp`; ``COMMLIB_SERVER_TRANSPORT=tcp``, the default).

The same client as :class:`.client.ServerClient` (partitions, their order in ``_queued``, encoding,
decoding, errors, deadlines), with the data plane replaced: one connection per server, opened at the first
push to it; one thread sends the queued partitions one after the other, in the queue's order (a blocking
``sendall`` returns once the kernel holds the data, so the link stays busy, and the order, one partition
per server by turns, is what each link sees); one thread per server receives its answers, each straight
into the memory its partition was sent from (the server answers only after it has received the whole push,
so that memory is no longer being sent). Nothing polls: blocking sockets release the GIL and use no CPU
while they wait.

A server whose connection fails or closes (its process died) fails every tensor with a partition on it
at once, naming the server; a server that stops answering but keeps its connection is caught by the
deadline (``COMMLIB_SERVER_TIMEOUT``), as over MPI.
"""

from __future__ import annotations

import socket
import threading
import time

import numpy as np

from . import protocol, tcp
from .client import ServerClient, ServerError, _Job, _Part
from .discovery import Job


class TcpServerClient(ServerClient):
    """push_pull for one worker runtime over ``job``, whose servers listen for TCP. Thread-safe."""

    depth = protocol.TCP_DEPTH

    def __init__(self, job: Job, partition_bytes: int, timeout_s: float, max_sleep_s: float = 1e-3,
                 congestion: str = tcp.CONGESTION, rcvbuf: int = tcp.RCVBUF):
        super().__init__(job, partition_bytes, timeout_s, max_sleep_s)
        self._congestion, self._rcvbuf = congestion, rcvbuf  # of the connections (tcp.tune)
        self._parts: dict[int, _Part] = {}  # by slot, under _lock: sent, awaiting their answer
        self._wake = threading.Condition(self._lock)
        self._conns: list[socket.socket | None] = [None] * len(self.servers)
        self._dead: dict[int, str] = {}  # server -> why it cannot be reached
        self._sender: threading.Thread | None = None
        self._current: _Part | None = None  # the partition the sending thread is sending
        self._receivers: list[threading.Thread] = []

    # -- the sending thread -----------------------------------------------------------------------------
    def _launch(self) -> None:
        """Partitions were queued (under the lock): wake the sending thread."""
        self._wake.notify()

    def _ensure_thread(self) -> None:
        super()._ensure_thread()
        if self._sender is None:
            self._sender = threading.Thread(target=self._send_loop, name="commlib-push-send", daemon=True)
            self._sender.start()

    def _send_loop(self) -> None:
        while True:
            with self._lock:
                while not self._queued and not self._stop:
                    self._wake.wait(0.1)
                if self._stop:
                    return
                part = self._queued.popleft()
                if part.job.failed:
                    continue
                why = self._dead.get(part.server)
                if why is not None:
                    self._fail(part.job, self._lost(part, why))
                    continue
                part.since = time.monotonic()
                self._parts[part.slot] = part
                if self.trace is not None:  # taken from the queue: stamped under the lock that orders it
                    self.trace.append((part.since, "post", part.server, part.slot))
            conn = self._connection(part.server)
            if conn is None:
                continue  # the connection failed: _server_lost failed the partition's tensor
            data = (part.wire if part.payload is None else part.payload).view(np.uint8)
            self._current = part
            try:
                tcp.send_frame(conn, tcp.PUSH, part.header, data)
            except OSError as exc:
                self._server_lost(part.server, f"sending failed: {exc}")
                continue
            finally:
                self._current = None
            now = time.monotonic()
            self._heard[part.server] = now
            if self.trace is not None:
                self.trace.append((now, "sent", part.server, part.slot))

    def _connection(self, server: int) -> socket.socket | None:
        """The connection to ``server``, opened (and its receiving thread started) at first use."""
        conn = self._conns[server]
        if conn is not None:
            return conn
        try:
            conn = tcp.connect(self.job.endpoints[self.servers[server]], self.worker, server,
                               self._congestion, self._rcvbuf)
        except ConnectionError as exc:
            self._server_lost(server, f"cannot connect: {exc}")
            return None
        self._conns[server] = conn
        thread = threading.Thread(target=self._receive_loop, args=(server, conn), daemon=True,
                                  name=f"commlib-push-recv-{server}")
        self._receivers.append(thread)
        thread.start()
        return conn

    # -- the receiving threads --------------------------------------------------------------------------
    def _receive_loop(self, server: int, conn: socket.socket) -> None:
        try:
            while True:
                kind, header, size = tcp.recv_head(conn)
                now = time.monotonic()
                if kind == tcp.ANSWER:
                    with self._lock:
                        self._heard[server] = now
                        part = self._parts.pop(header, None)
                        self._by_slot.pop(header, None)
                    if part is None or part.job.failed or part.wire.nbytes != size:
                        tcp.discard(conn, size)  # its tensor failed meanwhile
                        continue
                    tcp.recv_exact(conn, memoryview(part.wire.view(np.uint8)))
                    if self.trace is not None:
                        self.trace.append((time.monotonic(), "answered", server, part.slot))
                    self._complete(part)
                elif kind == tcp.ERROR:
                    slot, text = header
                    tcp.discard(conn, size)
                    with self._lock:
                        self._heard[server] = now
                        part = self._by_slot.get(slot)
                        if part is not None:
                            self._fail(part.job, ServerError(text))
                else:
                    raise ConnectionError(f"unexpected frame kind {kind}")
        except (OSError, EOFError) as exc:
            if not self._stop:
                self._server_lost(server, f"its connection closed ({exc})")
        except Exception as exc:  # a malformed frame: the connection is unusable
            self._server_lost(server, f"it sent a malformed frame ({exc!r})")

    def _server_lost(self, server: int, why: str) -> None:
        """``server`` cannot be reached: fail every tensor with a partition on it, now and later."""
        with self._lock:
            self._dead.setdefault(server, why)
            for part in self._pending():
                if part.server == server and not part.job.failed:
                    self._fail(part.job, self._lost(part, why))
        conn, self._conns[server] = self._conns[server], None
        if conn is not None:  # shut down first: that ends a send or receive blocked on it in another thread
            for end in (lambda: conn.shutdown(socket.SHUT_RDWR), conn.close):
                try:
                    end()
                except OSError:
                    pass

    def _lost(self, part: _Part, why: str) -> ServerError:
        return ServerError(f"push_pull {part.job.key!r}: {self.job.describe_server(part.server)} cannot be "
                           f"reached: {why}; the server died or exited (see its output), or its port is "
                           f"not reachable from this host (COMMLIB_SERVER_TRANSPORT=mpi sends through MPI "
                           f"instead)")

    # -- bookkeeping the base class shares --------------------------------------------------------------
    def _stage(self, part: _Part) -> str:
        return "answered" if part.slot in self._parts and part is not self._current else "taken its push"

    def _pending(self) -> list[_Part]:
        return list(self._parts.values()) + list(self._queued)

    def _watched(self) -> list[_Part]:
        """The partitions sent or being sent: the queued ones wait only for the sending thread, which a
        server that stops taking its pushes blocks (see :meth:`_check_deadlines`)."""
        return list(self._parts.values())

    def _check_deadlines(self, now: float) -> None:
        """Besides the deadlines: a server that has not taken a push for the timeout (its connection
        full, the server stopped) holds the sending thread; it is given up, so that the partitions queued
        for the other servers go on."""
        super()._check_deadlines(now)
        part = self._current
        if part is not None and self.timeout_s and now - part.since > self.timeout_s:
            self._server_lost(part.server, f"it has not taken a push for {now - part.since:.1f} s")

    def _forget_sent(self, job: _Job) -> None:
        for slot in [slot for slot, part in self._parts.items() if part.job is job]:
            del self._parts[slot]
            self._by_slot.pop(slot, None)

    def _progress(self) -> None:
        """The deadlines (the data moves in the sending and receiving threads)."""
        while not self._stop:
            time.sleep(0.05)
            self._check_deadlines(time.monotonic())

    # -- waiting and closing ----------------------------------------------------------------------------
    def wait(self, handle) -> None:
        while not handle.done():
            handle.wait_briefly(0.05)
            if not handle.done() and (self._thread is None or not self._thread.is_alive()):
                handle.set_error(ServerError(f"push_pull {handle.name!r}: the progress thread is not running"))

    def close(self) -> None:
        """As over MPI; then the connections are shut down (which also ends a send blocked on a server
        that stopped) and the threads joined."""
        super().close()
        with self._lock:
            self._wake.notify_all()
        conns = [conn for conn in self._conns if conn is not None]
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in ([self._sender] if self._sender is not None else []) + self._receivers:
            thread.join(timeout=5.0)
        for conn in conns:
            conn.close()


def open_client(job: Job, partition_bytes: int, timeout_s: float, congestion: str = tcp.CONGESTION,
                rcvbuf: int = tcp.RCVBUF) -> ServerClient:
    """push_pull's client for ``job``: over TCP where the servers listen (``COMMLIB_SERVER_TRANSPORT=tcp``;
    its connections with ``congestion`` and ``rcvbuf``, see :func:`.tcp.tune`), else over MPI."""
    if job.tcp:
        return TcpServerClient(job, partition_bytes, timeout_s, congestion=congestion, rcvbuf=rcvbuf)
    return ServerClient(job, partition_bytes, timeout_s)
