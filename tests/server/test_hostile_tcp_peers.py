"""A summation server's TCP data plane against a peer that knows the job's token and sends what the
protocol does not allow, in one process: a real ``Server`` (commlib.server.loop) with its listeners,
two honest workers on raw connections, and one hostile connection per case. Whatever the hostile peer
sends, nothing is unpickled, nothing is allocated for what a header merely declares, the server closes
that connection saying why, and the honest workers' rounds are answered with the right sums."""

import logging
import select
import socket
import threading
import time

import numpy as np
import pytest
from mpi4py import MPI

from commlib.server import protocol, tcp
from commlib.server.client import ServerClient, ServerError
from commlib.server.discovery import Job
from commlib.server.loop import Server
from commlib.server.tcp_plane import TcpPlane
from planted import planted

SLOTS = iter(range(protocol.FIRST_SLOT, 1 << 30))


@pytest.fixture
def server():
    """A server (rank 0 of a 3-process layout: itself, then workers 0 and 1) listening on loopback."""
    listeners, endpoint = tcp.listen(("127.0.0.1",))
    job = Job(MPI.COMM_SELF, MPI.COMM_SELF, ("server", "worker", "worker"), ("here",) * 3, (endpoint, None, None))
    served = Server(job, listeners=listeners)
    yield served
    served.close()


def connect(server, worker):
    return tcp.connect(server.endpoint, worker, 0)


def push(conn, key, values, worker, slot=None, contributors=2, data=None):
    header = protocol.Push(key, 0, values.size, "float32", values.size, 0, contributors, worker,
                           next(SLOTS) if slot is None else slot)
    tcp.send_frame(conn, tcp.PUSH, header.encode(), values if data is None else data)
    return header.slot


def answer(conn):
    message, size = tcp.recv_head(conn, (protocol.Answer, protocol.Refusal))
    data = np.empty(size // 4, np.float32)
    tcp.recv_exact(conn, memoryview(data.view(np.uint8)))
    return message, data


def honest_round(server, key):
    """Workers 0 and 1 push ``key`` on fresh connections and both receive the sum."""
    a, b = connect(server, 0), connect(server, 1)
    try:
        x, y = np.arange(5, dtype=np.float32), np.full(5, 10, np.float32)
        push(a, key, x, 0)
        push(b, key, y, 1)
        for conn in (a, b):
            message, data = answer(conn)
            assert isinstance(message, protocol.Answer) and np.array_equal(data, x + y), (message, data)
    finally:
        a.close()
        b.close()


def closed_by_server(conn, within=30.0):
    """Whether the server closes ``conn`` within ``within`` seconds (reading what it may still send)."""
    conn.settimeout(within)
    try:
        while conn.recv(1 << 16):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False



def frames(tmp_path):
    """(what, the bytes a token-bearing worker 1 sends): each one the server must refuse."""
    pickled = planted(tmp_path / "ran")
    fields = dict(key="k", part=0, total=4, wire="float32", count=4, op=0, contributors=2, worker=1, slot=16)

    def framed(kind, header, size=0):
        return tcp.FRAME.pack(kind, len(header), size) + header

    yield "a pickled push header", framed(tcp.PUSH, pickled)
    yield "a pickle in a frame of another kind", framed(7, pickled)
    yield "a 1 GiB header", tcp.FRAME.pack(tcp.PUSH, 1 << 30, 0)
    yield "a push of 1 TiB", framed(tcp.PUSH, protocol.Push(**fields).encode(), 1 << 40)
    yield "a server's frame sent to the server", framed(tcp.ANSWER, protocol.Answer(16).encode(), 16)
    yield "a header naming another worker", framed(tcp.PUSH, protocol.Push(**dict(fields, worker=0)).encode(), 16)
    yield "more contributors than the job's workers", framed(tcp.PUSH, protocol.Push(**dict(fields, contributors=3)).encode(), 16)
    huge = 1 << 40
    yield "a header declaring 1 TiB of elements", framed(tcp.PUSH, protocol.Push(**dict(fields, total=huge, count=huge)).encode())
    yield "a header cut short", tcp.FRAME.pack(tcp.PUSH, 40, 16) + protocol.Push(**fields).encode()[:20]
    yield "garbage", b"\xff" * 64


def test_hostile_frames_are_dropped_and_the_honest_workers_served(server, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="commlib.server")
    cases = list(frames(tmp_path))
    for i, (what, data) in enumerate(cases):
        hostile = connect(server, 1)
        try:
            hostile.sendall(data)
            if what == "a header cut short":
                hostile.shutdown(socket.SHUT_WR)  # and it says no more: the server's reader ends, nothing waits
            assert closed_by_server(hostile), f"{what}: the server kept the connection open"
        finally:
            hostile.close()
        honest_round(server, f"after {i}")  # the server goes on serving
    dropped = [r.getMessage() for r in caplog.records if "dropped a malformed message" in r.getMessage()]
    assert len(dropped) == len(cases) - 1, "\n".join(dropped)  # a header cut short reads as a closed stream
    assert not (tmp_path / "ran").exists()
    assert not server.rounds, server.rounds  # no round left open by what was refused


def test_a_push_whose_data_is_not_as_long_as_its_header_refuses_its_round(server):
    a, b = connect(server, 0), connect(server, 1)
    try:
        push(a, "short", np.ones(10, np.float32), 0)
        push(b, "short", np.ones(10, np.float32), 1, data=np.ones(9, np.float32))  # 36 bytes, declared 40
        for conn in (a, b):
            message, data = answer(conn)
            assert isinstance(message, protocol.Refusal) and "worker 1's push carried 36 bytes" in message.text, message
        # both connections are still in step: the next round is answered
        x = np.arange(10, dtype=np.float32)
        push(a, "next", x, 0)
        push(b, "next", x, 1)
        for conn in (a, b):
            message, data = answer(conn)
            assert isinstance(message, protocol.Answer) and np.array_equal(data, 2 * x)
    finally:
        a.close()
        b.close()


def closed_among(conns, count, within):
    """The connections of ``conns`` the server closes, once ``count`` of them are, or ``within`` seconds
    have passed (reading what it may still send)."""
    closed = set()
    deadline = time.monotonic() + within
    while len(closed) < count and time.monotonic() < deadline:
        readable, _, _ = select.select([c for c in conns if c not in closed], [], [], 0.1)
        for conn in readable:
            try:
                if not conn.recv(1 << 16):
                    closed.add(conn)
            except ConnectionResetError:
                closed.add(conn)
    return closed


def test_connections_beyond_what_a_worker_may_hold_are_refused(server, caplog):
    """Six connections of worker 1: two are closed (which two depends on the order the server's threads
    take the introductions), and the other four stay open. The 30 s bound only stops a broken server
    from hanging the test; a server that closed a third connection late would pass unseen, never fail
    a correct one."""
    caplog.set_level(logging.ERROR, logger="commlib.server")
    held = [connect(server, 1) for _ in range(6)]
    try:
        closed = closed_among(held, 2, within=30.0)
        assert len(closed) == 2, len(closed)
        assert not closed_among([c for c in held if c not in closed], 1, within=0.2)
        assert sum("beyond the 4" in r.getMessage() for r in caplog.records) == 2
    finally:
        for conn in held:
            conn.close()
    honest_round(server, "after crowding")


def test_a_worker_given_malformed_answers_fails_naming_the_server(tmp_path):
    """A 'server' that answers a push with a pickled header: the worker's tensor fails at once, naming
    the server and what was wrong; nothing is unpickled."""
    listeners, endpoint = tcp.listen(("127.0.0.1",))
    pickled = planted(tmp_path / "ran")

    def serve():
        conn, _ = listeners[0].accept()
        tcp.accept_hello(conn, endpoint, 0)
        message, size = tcp.recv_head(conn, (protocol.Push,))
        tcp.discard(conn, size)
        conn.sendall(tcp.FRAME.pack(tcp.ANSWER, len(pickled), 0) + pickled)
        finished.wait(30)  # the connection stays open: the worker fails on the frame, not on a closed stream
        conn.close()

    finished = threading.Event()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    job = Job(MPI.COMM_SELF, MPI.COMM_SELF, ("worker", "server"), ("here", "there"), (None, endpoint))
    client = ServerClient(job, TcpPlane(), 1 << 20, timeout_s=60.0)  # the frame fails it (its error says so), not the deadline
    try:
        handle = client.push_pull_async(np.ones(16, np.float32), "t")
        client.wait(handle)
        with pytest.raises(ServerError, match=r"server 0 \(rank 1 of the job, on there\) cannot be reached: it sent "
                                              r"a malformed frame"):
            handle.result()
    finally:
        finished.set()
        client.stopping = True
        listeners[0].close()
        thread.join(5)
    assert not (tmp_path / "ran").exists()


def test_the_client_refuses_what_no_server_would_take():
    from commlib.errors import CommlibError, ConfigError

    job = Job(MPI.COMM_SELF, MPI.COMM_SELF, ("worker", "server"), ("here", "there"),
              (None, tcp.Endpoint((("127.0.0.1", 9),), "0" * 16)))
    with pytest.raises(ConfigError, match="COMMLIB_SERVER_PARTITION=536870912 exceeds"):
        ServerClient(job, TcpPlane(), 512 << 20, timeout_s=1.0)
    client = ServerClient(job, TcpPlane(), 1 << 20, timeout_s=1.0)
    with pytest.raises(CommlibError, match="at most 1024: use a shorter name"):
        client.push_pull_async(np.ones(4, np.float32), "n" * 1025)
