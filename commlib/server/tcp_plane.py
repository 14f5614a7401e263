"""push_pull's data plane over TCP (:mod:`.tcp`; ``COMMLIB_SERVER_TRANSPORT=tcp``, the default).

One connection per server, opened at the first push to it; one thread sends the queued partitions one
after the other, in the queue's order (a blocking ``sendall`` returns once the kernel holds the data, so
the link stays busy, and the order, one partition per server by turns, is what each link sees); one thread
per server receives its answers, each straight into the memory its partition was sent from (the server
answers only after it has received the whole push, so that memory is no longer being sent). Nothing
polls: blocking sockets release the GIL and use no CPU while they wait.

A server whose connection fails or closes (its process died), or that sends a frame the protocol does not
allow, fails every tensor with a partition on it at once, naming the server; a server that stops
answering but keeps its connection is caught by the client's deadline (``COMMLIB_SERVER_TIMEOUT``), and
one that stops taking pushes (the sending thread blocked on it) is given up after the same time.
"""

from __future__ import annotations

import socket
import threading
import time

import numpy as np

from . import protocol, tcp
from .plane import DataPlane, Part, PushPull


class TcpPlane(DataPlane):
    """push_pull's partitions over one TCP connection per server (its connections with ``congestion``
    and ``rcvbuf``, see :func:`.tcp.tune`)."""

    depth = protocol.TCP_DEPTH

    def __init__(self, congestion: str = tcp.CONGESTION, rcvbuf: int = tcp.RCVBUF):
        self.congestion, self.rcvbuf = congestion, rcvbuf

    def attach(self, client) -> None:
        super().attach(client)
        self.parts: dict[int, Part] = {}  # by slot, under the lock: sent, awaiting their answer
        self.wake = threading.Condition(client.lock)
        self.conns: list[socket.socket | None] = [None] * len(client.servers)
        self.dead: dict[int, str] = {}  # server -> why it cannot be reached
        self.current: Part | None = None  # the partition the sending thread is sending
        self.sender: threading.Thread | None = None
        self.receivers: list[threading.Thread] = []

    def launch(self) -> None:
        """Partitions were queued: wake the sending thread (started at the first)."""
        if self.sender is None:
            self.sender = threading.Thread(target=self._send_loop, name="commlib-push-send", daemon=True)
            self.sender.start()
        self.wake.notify()

    # -- the sending thread -----------------------------------------------------------------------------
    def _send_loop(self) -> None:
        client = self.client
        while True:
            with client.lock:
                while not client.queue and not client.stopping:
                    self.wake.wait(0.1)
                if client.stopping:
                    return
                part = client.queue.popleft()
                if part.job.failed:
                    continue
                why = self.dead.get(part.server)
                if why is not None:
                    client.unreachable(part.server, why, [part])
                    continue
                part.since = time.monotonic()
                self.parts[part.slot] = part
                if client.trace is not None:  # taken from the queue: stamped under the lock that orders it
                    client.trace.append((part.since, "post", part.server, part.slot))
            conn = self._connection(part.server)
            if conn is None:
                continue  # the connection failed: _lost failed the partition's tensor
            self.current = part
            try:
                tcp.send_frame(conn, tcp.PUSH, part.header, part.data)
            except OSError as exc:
                self._lost(part.server, f"sending failed: {exc}")
                continue
            finally:
                self.current = None
            now = client.heard[part.server] = time.monotonic()
            if client.trace is not None:
                client.trace.append((now, "sent", part.server, part.slot))

    def _connection(self, server: int) -> socket.socket | None:
        """The connection to ``server``, opened (and its receiving thread started) at first use."""
        conn = self.conns[server]
        if conn is not None:
            return conn
        client = self.client
        try:
            conn = tcp.connect(client.job.endpoints[client.servers[server]], client.worker, server,
                               self.congestion, self.rcvbuf)
        except ConnectionError as exc:
            self._lost(server, f"cannot connect: {exc}")
            return None
        self.conns[server] = conn
        thread = threading.Thread(target=self._receive_loop, args=(server, conn), daemon=True,
                                  name=f"commlib-push-recv-{server}")
        self.receivers.append(thread)
        thread.start()
        return conn

    # -- the receiving threads --------------------------------------------------------------------------
    def _receive_loop(self, server: int, conn: socket.socket) -> None:
        client = self.client
        try:
            while True:
                message, size = tcp.recv_head(conn, (protocol.Answer, protocol.Refusal))
                now = time.monotonic()
                if isinstance(message, protocol.Answer):
                    with client.lock:
                        client.heard[server] = now
                        part = self.parts.pop(message.slot, None)
                    if part is None or part.job.failed:
                        tcp.discard(conn, size)  # its tensor failed meanwhile
                        continue
                    if part.server != server or part.wire.nbytes != size:
                        raise protocol.ProtocolError(f"an answer of {size} bytes on slot {message.slot} (push_pull "
                                                     f"{part.job.key!r} partition {part.index} of {part.wire.nbytes} "
                                                     f"bytes on server {part.server})")
                    tcp.recv_exact(conn, memoryview(part.wire.view(np.uint8)))
                    if client.trace is not None:
                        client.trace.append((time.monotonic(), "answered", server, part.slot))
                    client.answered(part)
                else:
                    tcp.discard(conn, size)
                    with client.lock:
                        client.refused(server, message)
        except protocol.ProtocolError as exc:  # the connection is out of step: unusable
            client.malformed(client.job.describe_server(server), str(exc))
            self._lost(server, f"it sent a malformed frame ({exc})")
        except OSError as exc:
            if not client.stopping:
                self._lost(server, f"its connection closed ({exc})")

    def _lost(self, server: int, why: str) -> None:
        """``server`` cannot be reached: fail every tensor with a partition on it, now and later."""
        with self.client.lock:
            self.dead.setdefault(server, why)
            self.client.unreachable(server, why)
        conn, self.conns[server] = self.conns[server], None
        if conn is not None:  # shut down first: that ends a send or receive blocked on it in another thread
            for end in (lambda: conn.shutdown(socket.SHUT_RDWR), conn.close):
                try:
                    end()
                except OSError:
                    pass

    # -- what the client asks ---------------------------------------------------------------------------
    def sent(self) -> list[Part]:
        return list(self.parts.values())

    def stage(self, part: Part) -> str:
        return "answered" if part.slot in self.parts and part is not self.current else "taken its push"

    def forget(self, job: PushPull) -> None:
        for slot in [slot for slot, part in self.parts.items() if part.job is job]:
            del self.parts[slot]

    def check(self, now: float) -> None:
        """A server that has not taken a push for the timeout (its connection full, the server stopped)
        holds the sending thread; it is given up, so that the partitions queued for the other servers go
        on."""
        part, timeout = self.current, self.client.timeout_s
        if part is not None and timeout and now - part.since > timeout:
            self._lost(part.server, f"it has not taken a push for {now - part.since:.1f} s")

    def close(self) -> None:
        """Shut the connections down (which also ends a send blocked on a server that stopped) and join the
        threads."""
        with self.client.lock:
            self.wake.notify_all()
        conns = [conn for conn in self.conns if conn is not None]
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in ([self.sender] if self.sender is not None else []) + self.receivers:
            thread.join(timeout=5.0)
        for conn in conns:
            conn.close()
