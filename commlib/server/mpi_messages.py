"""The MPI side of the servers' messages, received without trusting their sender.

A header is taken with a matched probe, so its size is known before anything is allocated: one longer
than its kind's layout allows is received truncated (MPI consumes it and reports the truncation) and
dropped. The values that follow a header are received into a buffer of the size the checked header
declared, and :func:`test_some` reports how many bytes each receive took: a message longer than its
buffer fails that receive, not the poll of the others, and a shorter one shows in its count.
"""

from __future__ import annotations

from mpi4py import MPI

from .protocol import Message, ProtocolError


def receive(comm: "MPI.Comm", tag: int, status: "MPI.Status", limit: int,
            source: int = MPI.ANY_SOURCE) -> tuple[int, bytes | None] | None:
    """The next message on ``tag`` (from ``source``), if one is in: ``(its sender, its bytes)``, or
    ``(its sender, None)`` when it was longer than ``limit`` bytes (received truncated and dropped)."""
    message = comm.improbe(source, tag, status)
    if message is None:
        return None
    sender, size = status.Get_source(), status.Get_count(MPI.BYTE)
    buf = bytearray(min(size, limit))
    try:
        message.Recv([buf, MPI.BYTE])
    except MPI.Exception:  # longer than ``limit``: MPI has consumed it
        return sender, None
    return sender, (bytes(buf) if size <= limit else None)


def take(comm: "MPI.Comm", tag: int, status: "MPI.Status", kind: type,
         source: int = MPI.ANY_SOURCE) -> tuple[int, Message | ProtocolError] | None:
    """The next message on ``tag`` (from ``source``), if one is in, decoded as ``kind`` (a
    :class:`.protocol.Message`): ``(its sender, the message)``, or ``(its sender, the ProtocolError that
    says why it is not one)``."""
    got = receive(comm, tag, status, kind.LAYOUT.max_size, source)
    if got is None:
        return None
    sender, data = got
    try:
        if data is None:
            raise ProtocolError(f"a {kind.__name__} longer than its {kind.LAYOUT.max_size} bytes")
        return sender, kind.decode(data)
    except ProtocolError as exc:
        return sender, exc


def arrived(comm: "MPI.Comm", tag: int, status: "MPI.Status", kind: type):
    """Every message on ``tag`` that is in, one after the other, as :func:`take` gives them."""
    while True:
        got = take(comm, tag, status, kind)
        if got is None:
            return
        yield got


def post(comm: "MPI.Comm", data: bytes, dest: int, tag: int, synchronous: bool = False) -> "MPI.Request":
    """Post the send of ``data`` (a header, or b"" for a notice); mpi4py keeps ``data`` alive until the
    request completes. ``synchronous``: completes only once the receiver has matched it."""
    return (comm.Issend if synchronous else comm.Isend)([data, MPI.BYTE], dest=dest, tag=tag)


def test_some(requests: list) -> list[tuple[int, int]]:
    """The requests of ``requests`` (all active) that have completed, as ``(index, bytes received)``;
    -1 bytes for a receive that failed (a message longer than its buffer). Sends count 0 bytes."""
    statuses: list = []
    try:
        done = MPI.Request.Testsome(requests, statuses)
    except MPI.Exception:  # a receive was truncated: the requests this call completed are null now
        done = [i for i, request in enumerate(requests) if not request]
        out = []
        for k, i in enumerate(done):
            status = statuses[k] if k < len(statuses) else None
            whole = status is not None and status.Get_error() == MPI.SUCCESS
            out.append((i, status.Get_count(MPI.BYTE) if whole else -1))
        return out
    if not done:
        return []
    return [(i, status.Get_count(MPI.BYTE)) for i, status in zip(done, statuses)]
