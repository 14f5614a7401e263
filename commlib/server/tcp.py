"""The plain-TCP data plane between workers and summation servers (``COMMLIB_SERVER_TRANSPORT=tcp``).

MPI still finds the servers and carries the control messages (:mod:`.discovery`, ``TAG_BYE``/``TAG_EXIT``,
Geo-SGD); the partitions of push_pull and their answers move over one persistent TCP connection per
worker and server, with blocking ``sendall``/``recv_into`` (which release the GIL) in threads of their
own. Blocking sockets use no CPU while they wait, where MPI's transfers progress only while a thread
polls them; and every link carries one ordered stream per peer.

Each server listens on the job's interface only (:func:`job_addresses`: the one
``COMMLIB_NETWORK_INTERFACE`` names, else the address its host name resolves to, else the one that
routes to the other hosts of the job; loopback when the whole job is on one host), on a port of its own,
and reports an :class:`Endpoint` (where it listens, and a random token) in the job's roll call. A worker
connects to each server, and both sides check the token, so that a connection that reached another
process is refused.

A frame is ``FRAME`` (kind, length of the header, length of the data that follows), the header (one of
:mod:`.protocol`'s binary messages, of that kind), then the data: ``Hello`` (both ways, first: the token
and the sender's index; nothing else is read from a peer before it has shown the token), ``Push``
(worker -> server, then the partition's bytes), ``Answer`` (server -> worker, then the reduced bytes),
``Refusal`` (server -> worker, no data). :func:`recv_head` reads a frame's header only when its kind is
one the reader expects and its lengths are within that kind's bounds: nothing from a peer is unpickled,
and nothing is allocated for more than a message can be.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hmac
import ipaddress
import os
import socket
import struct

from . import protocol

FRAME = struct.Struct("<BIQ")
HELLO, PUSH, ANSWER, REFUSAL = (m.LAYOUT.kind for m in (protocol.Hello, protocol.Push, protocol.Answer,
                                                        protocol.Refusal))
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
    """Where a server listens: ``places``, ``(address, port)`` pairs (one per address of the job's
    interface), and the token that proves a connection reached this server."""

    places: tuple[tuple[str, int], ...]
    token: str

    def listening(self) -> protocol.Listening:
        """This endpoint as the roll call carries it."""
        return protocol.Listening(",".join(f"{a}:{p}" for a, p in self.places), self.token)

    @classmethod
    def of(cls, listening: protocol.Listening) -> "Endpoint | None":
        """The endpoint a roll call's ``listening`` names (None: it names none)."""
        if not listening.places:
            return None
        places = tuple((a, int(p)) for a, _, p in (place.rpartition(":") for place in listening.places.split(",")))
        return cls(places, listening.token)


def interfaces() -> dict[str, str]:
    """This host's IPv4 addresses by interface name (Linux; elsewhere empty)."""
    found = {}
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
            found[name] = socket.inet_ntoa(packed[20:24])
    except (OSError, AttributeError):
        pass
    finally:
        probe.close()
    return found


def local_addresses() -> tuple[str, ...]:
    """This host's IPv4 addresses, one per interface that has one, loopback last (Linux; elsewhere the
    address the host name resolves to, then loopback)."""
    found = list(interfaces().values())
    if not found:
        resolved = resolve(socket.gethostname())
        if resolved:
            found.append(resolved)
    found = list(dict.fromkeys(found))
    return tuple([a for a in found if not _loopback(a)] + [a for a in found if _loopback(a)] or ["127.0.0.1"])


def _loopback(address: str) -> bool:
    return ipaddress.IPv4Address(address).is_loopback


def resolve(host: str) -> str | None:
    """The IPv4 address ``host`` resolves to here, or None."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return None


def route_source(destination: str) -> str | None:
    """The local address this host sends from to reach ``destination`` (the kernel's route; no packet is
    sent), or None when there is no route."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((destination, 9))
        return probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()


class NoInterface(OSError):
    """The job's interface cannot be found on this host; the message says what to set."""


def job_addresses(interface: str, host: str, hosts: list[str], addresses: list[tuple[str, ...]]) -> tuple[str, ...]:
    """The addresses a server on ``host`` listens on: the job's interface.

    - ``interface`` (``COMMLIB_NETWORK_INTERFACE``, commlib-run's ``--network-interface``; comma-separated
      names): those interfaces' addresses;
    - every process of the job on this host (``hosts``: each process's host name): loopback;
    - the address this host's name resolves to, when it is one of this host's own and not loopback (the
      name MPI reports as the processor name: how the hosts find each other);
    - the address this host routes from to the other hosts' processes (``addresses``: each process's
      addresses, as its roll call report gave them), the one most of them route through; an address that
      is also one of this host's own (a container bridge present on every host) is not another host's.

    Raises :class:`NoInterface` saying what to set when none of these gives an address."""
    own = interfaces()
    mine = set(own.values())
    if interface:
        names = [n.strip() for n in interface.split(",") if n.strip()]
        missing = [n for n in names if n not in own]
        if missing:
            raise NoInterface(errno.ENODEV, f"COMMLIB_NETWORK_INTERFACE={interface}: this host ({host}) has no "
                              f"interface {', '.join(missing)} with an IPv4 address (it has "
                              f"{', '.join(f'{n} {a}' for n, a in own.items()) or 'none'})")
        return tuple(dict.fromkeys(own[n] for n in names))
    others = [a for h, found in zip(hosts, addresses) if h != host for a in found]
    if not others:
        return ("127.0.0.1",)
    named = resolve(host)
    if named is not None and named in mine and not _loopback(named):
        return (named,)
    votes: dict[str, int] = {}
    for address in others:
        if address in mine or _loopback(address):
            continue
        source = route_source(address)
        if source is not None and not _loopback(source):
            votes[source] = votes.get(source, 0) + 1
    if not votes:
        raise NoInterface(errno.EADDRNOTAVAIL, f"{host}: cannot tell which interface reaches the job's other hosts "
                          f"(their addresses {sorted(set(others))}, this host's {sorted(mine)}); set "
                          "COMMLIB_NETWORK_INTERFACE (commlib-run --network-interface) to the interface the "
                          "job's MPI traffic uses")
    return (max(votes, key=votes.get),)


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


def listen(addresses: tuple[str, ...] = ("127.0.0.1",), congestion: str = CONGESTION
           ) -> tuple[list[socket.socket], Endpoint]:
    """Listening sockets on ``addresses`` only (one each, on a port the kernel picks; their connections
    with ``congestion``, see :func:`tune`), and the endpoint to report."""
    listeners = []
    try:
        for address in addresses:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listeners.append(listener)
            tune(listener, congestion)
            listener.bind((address, 0))
            listener.listen(256)
    except OSError:
        for listener in listeners:
            listener.close()
        raise
    places = tuple(listener.getsockname() for listener in listeners)
    return listeners, Endpoint(places, os.urandom(8).hex())


def send_frame(conn: socket.socket, kind: int, header: bytes, data=None) -> None:
    """One frame: ``header`` (an encoded message of ``kind``), then ``data`` (a buffer, or None)."""
    size = 0 if data is None else memoryview(data).nbytes
    conn.sendall(FRAME.pack(kind, len(header), size) + header)
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


def recv_head(conn: socket.socket, expected: tuple[type, ...]) -> tuple[protocol.Message, int]:
    """The next frame's header, decoded as one of the message kinds ``expected``, and the length of the
    data that follows (the caller then receives it). Raises :class:`.protocol.ProtocolError` (the
    connection is then out of step: close it) for a frame of another kind, a header longer than its kind
    allows or that does not decode, or more data than a push may carry."""
    fixed = bytearray(FRAME.size)
    recv_exact(conn, memoryview(fixed))
    kind, hlen, size = FRAME.unpack(fixed)
    message = next((m for m in expected if m.LAYOUT.kind == kind), None)
    if message is None:
        raise protocol.ProtocolError(f"a frame of kind {kind} where {' or '.join(m.__name__ for m in expected)} "
                                     "belongs")
    if hlen > message.LAYOUT.max_size or size > protocol.MAX_PUSH_BYTES:
        raise protocol.ProtocolError(f"a {message.__name__} frame declares a {hlen}-byte header and {size} bytes of "
                                     f"data (at most {message.LAYOUT.max_size} and {protocol.MAX_PUSH_BYTES})")
    head = bytearray(hlen)
    recv_exact(conn, memoryview(head))
    return message.decode(head), size


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
    ``congestion`` and ``rcvbuf`` (:func:`tune`); tries each place in turn. Raises ``ConnectionError``
    saying what each place answered."""
    tried = []
    for address, port in endpoint.places:
        conn = None
        try:
            conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            tune(conn, congestion, rcvbuf)
            conn.settimeout(CONNECT_TIMEOUT_S)
            conn.connect((address, port))
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            send_hello(conn, endpoint.token, worker)
            if recv_hello(conn, endpoint.token) == server:
                conn.settimeout(None)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PUSH_SNDBUF)
                return conn
            tried.append(f"{address}:{port} is another process")
        except (OSError, protocol.ProtocolError) as exc:
            tried.append(f"{address}:{port}: {exc}")
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
    except (OSError, protocol.ProtocolError):
        conn.close()
        return None


def send_hello(conn: socket.socket, token: str, index: int) -> None:
    """The introduction: ``token`` and ``index`` in a fixed binary frame."""
    send_frame(conn, HELLO, protocol.Hello(token.encode(), index).encode())


def recv_hello(conn: socket.socket, token: str) -> int | None:
    """The index a peer's introduction gives, or None when it is not one bearing ``token`` (read as fixed
    binary fields, never unpickled, and at most ``FRAME.size`` plus a Hello's bytes of it)."""
    fixed = bytearray(FRAME.size)
    recv_exact(conn, memoryview(fixed))
    kind, hlen, size = FRAME.unpack(fixed)
    if kind != HELLO or hlen != protocol.Hello.LAYOUT.max_size or size != 0:
        return None
    body = bytearray(hlen)
    recv_exact(conn, memoryview(body))
    hello = protocol.Hello.decode(body)
    return hello.index if hmac.compare_digest(hello.token, token.encode().ljust(16, b"\0")[:16]) else None


__all__ = ["Endpoint", "tune", "listen", "connect", "accept_hello", "send_hello", "recv_hello", "send_frame",
           "recv_head", "recv_exact", "discard", "interfaces", "local_addresses", "job_addresses", "NoInterface",
           "FRAME", "HELLO", "PUSH", "ANSWER", "REFUSAL"]
