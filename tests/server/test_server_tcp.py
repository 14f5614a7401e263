"""The TCP data plane's framing and handshake (commlib.server.tcp), in one process, without MPI."""

import socket
import threading

import numpy as np
import pytest

from commlib.server import protocol, tcp


def serve_one(listener, endpoint, server, seen):
    conn, _ = listener.accept()
    seen.append(tcp.accept_hello(conn, endpoint, server))
    if seen[-1] is None:
        return
    try:
        push, size = tcp.recv_head(conn, (protocol.Push,))
    except ConnectionError:  # a worker that only connected
        conn.close()
        return
    data = np.empty(size, np.uint8)
    tcp.recv_exact(conn, memoryview(data))
    tcp.send_frame(conn, tcp.ANSWER, protocol.Answer(push.slot).encode(), data[::-1].copy())
    tcp.send_frame(conn, tcp.REFUSAL, protocol.Refusal(push.slot, "refused").encode())
    conn.close()


def listen():
    listeners, endpoint = tcp.listen()
    return listeners[0], endpoint


def test_a_push_and_its_answer_travel_whole():
    listener, endpoint = listen()
    seen = []
    thread = threading.Thread(target=serve_one, args=(listener, endpoint, 3, seen))
    thread.start()
    try:
        conn = tcp.connect(endpoint, worker=2, server=3)
        values = np.arange(100_000, dtype=np.uint8)
        push = protocol.Push("k", 0, values.size, "uint8", values.size, 0, 1, 2, 77)
        tcp.send_frame(conn, tcp.PUSH, push.encode(), values)
        expected = (protocol.Answer, protocol.Refusal)
        answer, size = tcp.recv_head(conn, expected)
        back = np.empty(size, np.uint8)
        tcp.recv_exact(conn, memoryview(back))
        assert (answer, size) == (protocol.Answer(77), values.size) and np.array_equal(back, values[::-1])
        assert tcp.recv_head(conn, expected) == (protocol.Refusal(77, "refused"), 0)
        with pytest.raises(ConnectionError):  # the server closed: a clear end, never a hang
            tcp.recv_head(conn, expected)
        conn.close()
    finally:
        thread.join(10)
        listener.close()
    assert seen == [2]


def test_connect_skips_an_address_that_reaches_another_process():
    """An address that answers with another token (the same address on another host, another job) is
    refused and the next one tried; when none is the server, the error says what each address was."""
    listener, endpoint = listen()
    other, other_endpoint = listen()
    seen = []
    threads = [threading.Thread(target=serve_one, args=(other, other_endpoint, 0, [])),
               threading.Thread(target=serve_one, args=(listener, endpoint, 0, seen))]
    for t in threads:
        t.start()
    try:
        # the first address leads to the other process's port: same address, the wrong port
        wrong = tcp.Endpoint(other_endpoint.places, endpoint.token)
        with pytest.raises(ConnectionError, match="127.0.0.1"):
            tcp.connect(wrong, worker=0, server=0)
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        closed.close()  # nothing listens there
        with pytest.raises(ConnectionError, match=str(port)):
            tcp.connect(tcp.Endpoint((("127.0.0.1", port),), "x"), worker=0, server=0)
        conn = tcp.connect(endpoint, worker=1, server=0)
        conn.close()
    finally:
        for t in threads:
            t.join(10)
        listener.close()
        other.close()
    assert seen == [1]


def test_an_introduction_is_never_unpickled(tmp_path):
    """Whoever reaches a server's port before showing the token gets nothing unpickled: a pickled
    introduction (the old framing, or an attacker's) is refused, and so is a wrong token."""
    from planted import planted

    listener, endpoint = listen()
    seen = []
    try:
        for frame in (
                (lambda head: tcp.FRAME.pack(tcp.HELLO, len(head), 0) + head)(planted(tmp_path / "ran")),
                tcp.FRAME.pack(tcp.HELLO, protocol.Hello.LAYOUT.max_size, 0) + protocol.Hello(b"0" * 16, 0).encode(),
                tcp.FRAME.pack(tcp.PUSH, 1 << 30, 0)):  # a huge header length: nothing allocated for it
            server = threading.Thread(target=serve_one, args=(listener, endpoint, 0, seen))
            server.start()
            with socket.create_connection(endpoint.places[0]) as conn:
                conn.sendall(frame)
                server.join(10)
    finally:
        listener.close()
    assert seen == [None, None, None]
    assert not (tmp_path / "ran").exists()


def test_local_addresses_put_loopback_last():
    addresses = tcp.local_addresses()
    assert addresses and all(a.count(".") == 3 for a in addresses)
    loop = [a.startswith("127.") for a in addresses]
    assert loop == sorted(loop)


def test_a_server_that_stops_reading_is_given_up_naming_it():
    """A server that keeps its connection but takes nothing (stopped, hung): the worker's sending thread
    blocks once the connection's buffers are full; after the timeout the tensor fails naming the server,
    the connection is given up (freeing the sending thread) and a later push to it fails at once (its error
    says the server cannot be reached: it did not wait for an answer again)."""
    import time

    from mpi4py import MPI

    from commlib.server.client import ServerClient, ServerError
    from commlib.server.discovery import Job
    from commlib.server.tcp_plane import TcpPlane

    listener, endpoint = listen()
    held = []

    def accept():
        conn, _ = listener.accept()
        tcp.accept_hello(conn, endpoint, 0)
        held.append(conn)  # and never reads

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    # the worker is rank 0 of the job, the server rank 1 (the data plane needs no MPI traffic)
    job = Job(MPI.COMM_SELF, MPI.COMM_SELF, ("worker", "server"), ("here", "there"), (None, endpoint))
    client = ServerClient(job, TcpPlane(), 1 << 20, timeout_s=1.0)
    try:
        start = time.monotonic()
        handle = client.push_pull_async(np.ones(8 << 20, np.float32), "big")  # 32 MiB: more than buffers hold
        client.wait(handle)
        with pytest.raises(ServerError, match=r"server 0 \(rank 1 of the job, on there\) has not (answered|taken its push)"):
            handle.result()
        took = time.monotonic() - start
        # the timeout fired because its deadline passed; the upper bound is the feature (given up, not waited
        # for forever), sixty times the timeout so that no load reaches it
        assert 1.0 <= took < 60, took
        again = client.push_pull_async(np.ones(4, np.float32), "small")
        client.wait(again)
        with pytest.raises(ServerError, match=r"server 0 \(rank 1 of the job, on there\) cannot be reached"):
            again.result()
    finally:
        client.stopping = True
        listener.close()
        for conn in held:
            conn.close()


@pytest.mark.skipif(not hasattr(socket, "TCP_CONGESTION"), reason="TCP_CONGESTION is Linux's")
def test_connections_get_the_congestion_control_and_receive_buffer_asked_for():
    listeners, endpoint = tcp.listen(congestion="reno")
    listener = listeners[0]
    accepted = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True)
    thread.start()
    conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.tune(conn, "reno", 256 << 10)
    conn.connect(endpoint.places[0])
    thread.join(5)
    try:
        for sock in (conn, accepted[0]):  # the accepted connection inherits its listener's
            name = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
            assert name.rstrip(b"\0") == b"reno"
        assert conn.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) >= 256 << 10  # Linux doubles it
    finally:
        for sock in [conn] + accepted:
            sock.close()
        listener.close()


@pytest.mark.skipif(not hasattr(socket, "TCP_CONGESTION"), reason="TCP_CONGESTION is Linux's")
def test_a_congestion_control_the_kernel_refuses_is_an_error_naming_the_setting():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with pytest.raises(OSError, match="COMMLIB_SERVER_TCP_CONGESTION"):
            tcp.tune(sock, "nosuchcc")
    finally:
        sock.close()
