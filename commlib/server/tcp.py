"""The plain-TCP data plane between workers and summation servers (``COMMLIB_SERVER_TRANSPORT=tcp``).

MPI still finds the servers and carries the control messages (:mod:`.discovery`, ``TAG_BYE``/``TAG_EXIT``,
Geo-SGD); the partitions of push_pull and their answers move over one persistent TCP connection per
worker and server, with blocking ``sendall``/``recv_into`` (which release the GIL) in threads of their
own. Blocking sockets use no CPU while they wait, where MPI's transfers progress only while a thread
polls them; and every link carries one ordered stream per peer.

Each server listens on a port of its own (every address of its host) and reports ``Endpoint`` (its
addresses, the port, a random token) in the job's roll call. A worker connects to each server, trying its
addresses in turn, and both sides check the token, so that a connection that reached another process
(an address that exists on several hosts) is refused and the next address tried.

A frame is ``FRAME`` (kind, length of a pickled header, length of the data that follows), the header,
then the data. Kinds: ``HELLO`` (worker -> server: the token and the worker's index, packed as
``HELLO_BODY``, never pickled: nothing from a peer is unpickled before it has shown the token; the server
answers ``HELLO`` with the token and its own index), ``PUSH`` (worker -> server: a :class:`.protocol.Push`, then the partition's bytes),
``ANSWER`` (server -> worker: the push's slot, then the reduced bytes), ``ERROR`` (server -> worker:
``(slot, message)``, no data).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hmac
import os
import pickle
import socket
import struct

FRAME = struct.Struct("<BIQ")
HELLO_BODY = struct.Struct("<16sq")  # the token (16 hex digits), an index
HELLO, PUSH, ANSWER, ERROR = 1, 2, 3, 4
CONNECT_TIMEOUT_S = 5.0
#: The send buffer of a worker's connections (Linux doubles it): small, so that a blocking ``sendall``
#: returns about when the link has taken the data, and the order in which the worker sends its partitions
#: (one per server by turns, :func:`.protocol.sending_order`) is the order on the wire; with the kernel's
#: own autotuned buffers (up to 4 MiB per connection) several partitions queue per connection and the
#: servers' links take every worker at once. On 4 + 4 emulated hosts at 1 Gbit/s, 64 MiB: 512 KiB 0.60-0.66 s,
#: 256 KiB 0.61-0.72 s, 128 KiB 0.72-0.75 s, the kernel's default 0.61-0.67 s (5 rounds each, alone on
#: the machine). Beside a 1 ms round trip it allows about 8 Gbit/s per connection.
PUSH_SNDBUF = 512 << 10
#: The defaults of ``COMMLIB_SERVER_TCP_CONGESTION`` and ``COMMLIB_SERVER_TCP_RCVBUF`` (docs/configuration.md).
#: On 4 + 4 emulated hosts at 1 Gbit/s (tbf, 64 MiB push_pull), with the kernel's default there, BBR, the
#: links ran below their rate (round trips of 5-10 ms, the shaped queues mostly empty, the pushes' last
#: partitions in at 1.07-1.14x S/B); reno (or cubic: the same) keeps the links full, and a 512 KiB receive
#: buffer on the workers bounds what four servers' answers keep in flight towards one worker, so that its
#: link's queue stays short: see docs/results/servers_trace_1gbit.txt for the figures. Reno is
#: in every Linux kernel and allowed to every user (``net.ipv4.tcp_allowed_congestion_control``); at a
#: cluster's round trips cubic behaves as reno.
CONGESTION = "reno"
RCVBUF = 512 << 10
_SIOCGIFADDR = 0x8915


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where a server listens: its host's IPv4 addresses (loopback last), a port, and the token that
    proves a connection reached this server."""

    addresses: tuple[str, ...]
    port: int
    token: str


def local_addresses() -> tuple[str, ...]:
    """This host's IPv4 addresses, one per interface that has one, loopback last (Linux; elsewhere the
    address the host name resolves to, then loopback)."""
    found = []
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
            found.append(socket.inet_ntoa(packed[20:24]))
    except (OSError, AttributeError):
        pass
    finally:
        probe.close()
    if not found:
        try:
            found.append(socket.gethostbyname(socket.gethostname()))
        except OSError:
            pass
    found = list(dict.fromkeys(found))
    return tuple([a for a in found if not a.startswith("127.")] + [a for a in found if a.startswith("127.")]
                 or ["127.0.0.1"])


def tune(sock: socket.socket, congestion: str = "", rcvbuf: int = 0) -> None:
    """Set ``sock``'s congestion control (a name; "" keeps the kernel's) and receive buffer (0 keeps the
    kernel's autotuning), before ``connect()`` or ``listen()``: the window scale is agreed at the
    handshake, and accepted connections inherit both from their listener. Raises ``OSError`` saying which
    setting the kernel refused."""
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    if congestion and hasattr(socket, "TCP_CONGESTION"):  # Linux only; elsewhere the kernel's
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, congestion.encode())
        except OSError as exc:
            raise OSError(exc.errno, f"the kernel refused the TCP congestion control {congestion!r} "
                          f"({exc.strerror}): set COMMLIB_SERVER_TCP_CONGESTION to one of "
                          f"/proc/sys/net/ipv4/tcp_allowed_congestion_control, or to 'default'") from exc


def listen(congestion: str = CONGESTION) -> tuple[socket.socket, Endpoint]:
    """A listening socket on every address of this host (its connections with ``congestion``, see
    :func:`tune`), and the endpoint to report."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        tune(listener, congestion)
    except OSError:
        listener.close()
        raise
    listener.bind(("0.0.0.0", 0))
    listener.listen(256)
    return listener, Endpoint(local_addresses(), listener.getsockname()[1], os.urandom(8).hex())


def send_frame(conn: socket.socket, kind: int, header, data=None) -> None:
    """One frame: ``header`` pickled, then ``data`` (a buffer, or None)."""
    head = pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL)
    size = 0 if data is None else memoryview(data).nbytes
    conn.sendall(FRAME.pack(kind, len(head), size) + head)
    if size:
        conn.sendall(data)


def recv_exact(conn: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``conn``; ``ConnectionError`` when the peer closed the connection first."""
    got, total = 0, view.nbytes
    while got < total:
        n = conn.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("the connection was closed by the other side")
        got += n


def recv_head(conn: socket.socket) -> tuple[int, object, int]:
    """The next frame's ``(kind, header, data length)``; the caller then receives the data."""
    fixed = bytearray(FRAME.size)
    recv_exact(conn, memoryview(fixed))
    kind, hlen, size = FRAME.unpack(fixed)
    head = bytearray(hlen)
    recv_exact(conn, memoryview(head))
    return kind, pickle.loads(head), size


def discard(conn: socket.socket, size: int) -> None:
    """Receive and drop ``size`` bytes."""
    scratch = bytearray(min(size, 1 << 20))
    view = memoryview(scratch)
    while size:
        n = min(size, len(scratch))
        recv_exact(conn, view[:n])
        size -= n


def connect(endpoint: Endpoint, worker: int, server: int, congestion: str = CONGESTION,
            rcvbuf: int = RCVBUF) -> socket.socket:
    """A connection to the server at ``endpoint`` (its index ``server``), introduced as ``worker``, with
    ``congestion`` and ``rcvbuf`` (:func:`tune`); tries each address in turn. Raises ``ConnectionError``
    saying what each address answered."""
    tried = []
    for address in endpoint.addresses:
        conn = None
        try:
            conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            tune(conn, congestion, rcvbuf)
            conn.settimeout(CONNECT_TIMEOUT_S)
            conn.connect((address, endpoint.port))
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            send_hello(conn, endpoint.token, worker)
            if recv_hello(conn, endpoint.token) == server:
                conn.settimeout(None)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PUSH_SNDBUF)
                return conn
            tried.append(f"{address}:{endpoint.port} is another process")
        except OSError as exc:
            tried.append(f"{address}:{endpoint.port}: {exc}")
        if conn is not None:
            conn.close()
    raise ConnectionError("; ".join(tried))


def accept_hello(conn: socket.socket, endpoint: Endpoint, server: int) -> int | None:
    """The worker index a new connection introduces itself as, after answering it; None (connection
    closed) when it is not a worker of this job."""
    try:
        conn.settimeout(CONNECT_TIMEOUT_S)
        worker = recv_hello(conn, endpoint.token)
        if worker is None:
            conn.close()
            return None
        send_hello(conn, endpoint.token, server)
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return worker
    except OSError:
        conn.close()
        return None


def send_hello(conn: socket.socket, token: str, index: int) -> None:
    """The introduction: ``token`` and ``index`` in a fixed binary frame."""
    conn.sendall(FRAME.pack(HELLO, HELLO_BODY.size, 0) + HELLO_BODY.pack(token.encode(), index))


def recv_hello(conn: socket.socket, token: str) -> int | None:
    """The index a peer's introduction gives, or None when it is not one bearing ``token`` (read as fixed
    binary fields, never unpickled, and at most ``FRAME.size + HELLO_BODY.size`` bytes of it)."""
    fixed = bytearray(FRAME.size)
    recv_exact(conn, memoryview(fixed))
    kind, hlen, size = FRAME.unpack(fixed)
    if kind != HELLO or hlen != HELLO_BODY.size or size != 0:
        return None
    body = bytearray(HELLO_BODY.size)
    recv_exact(conn, memoryview(body))
    theirs, index = HELLO_BODY.unpack(body)
    return index if hmac.compare_digest(theirs, token.encode().ljust(16, b"\0")[:16]) else None


__all__ = ["Endpoint", "tune", "listen", "connect", "accept_hello", "send_hello", "recv_hello", "send_frame", "recv_head", "recv_exact", "discard",
           "local_addresses", "FRAME", "HELLO", "PUSH", "ANSWER", "ERROR"]
