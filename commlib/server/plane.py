"""The data plane's side of push_pull: what a partition in flight is, and what a data plane does.

:class:`~.client.ServerClient` holds the logic of push_pull once (partitions, their order, errors,
deadlines) and is handed a :class:`DataPlane`, one small class per transport that moves the partitions
(:class:`.mpi_plane.MpiPlane`, :class:`.tcp_plane.TcpPlane`). Nothing here imports MPI.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from ..coordinator.requests import Handle
from . import protocol


class Part:
    """One partition in flight: queued, sending, then awaiting its answer. ``wire`` is its memory on the
    wire dtype (sent from, answered into); ``payload`` a lossy compressor's bytes, sent instead;
    ``header`` its encoded :class:`~.protocol.Push`; ``since`` when it last changed stage. A data plane
    keeps what it needs per partition in ``transfer``."""

    __slots__ = ("job", "index", "lo", "hi", "server", "slot", "wire", "header", "since", "payload", "transfer")

    def __init__(self, job: "PushPull", index: int, lo: int, hi: int, server: int, slot: int, wire: np.ndarray,
                 header: bytes, payload: np.ndarray | None):
        self.job = job
        self.index = index
        self.lo, self.hi = lo, hi
        self.server = server
        self.slot = slot
        self.wire = wire
        self.payload = payload
        self.header = header
        self.since = time.monotonic()
        self.transfer = None

    @property
    def data(self) -> np.ndarray:
        """The bytes pushed."""
        return (self.wire if self.payload is None else self.payload).view(np.uint8)


class PushPull:
    """One tensor's push_pull."""

    __slots__ = ("key", "handle", "output", "finish", "remaining", "failed", "priority")

    def __init__(self, key: str, handle: Handle, output: np.ndarray, finish: Callable, parts: int,
                 priority: int = 0):
        self.key = key
        self.handle = handle
        self.output = output
        self.finish = finish  # (part) -> None: decode / postscale one answered partition into output
        self.remaining = parts
        self.failed = False
        self.priority = priority  # higher: its queued partitions are sent sooner (ServerClient.enqueue)


class DataPlane:
    """How partitions travel between this worker and the servers. The client calls these under its
    ``lock`` unless said otherwise; the plane takes partitions from ``client.queue`` (from the left, under
    the lock) and reports back through ``client.answered``, ``client.refused``, ``client.unreachable``
    and ``client.heard``."""

    #: partitions per server of a large tensor (:func:`.protocol.partitions`)
    depth = protocol.DEPTH
    #: whether transfers progress only while :meth:`poll` is called (the client's thread and its waiters
    #: then poll; otherwise the plane runs threads of its own)
    polled = False

    def attach(self, client: "ServerClient") -> None:
        """Start serving ``client`` (once, before anything is queued)."""
        self.client = client

    def launch(self) -> None:
        """Partitions were queued."""

    def poll(self) -> bool:
        """Advance the transfers (not under the lock); whether anything moved."""
        return False

    def sent(self) -> list[Part]:
        """The partitions taken from the queue and not yet answered."""
        raise NotImplementedError

    def stage(self, part: Part) -> str:
        """What ``part``'s server has not done yet, for an error: "taken its push" or "answered"."""
        raise NotImplementedError

    def forget(self, job: PushPull) -> None:
        """``job`` failed: stop awaiting its partitions' answers."""
        raise NotImplementedError

    def check(self, now: float) -> None:
        """Besides the client's deadlines (not under the lock): give up what the plane itself waits on."""

    def close(self) -> None:
        """The client is closing (not under the lock; nothing is in flight any more): end the transfers
        and the plane's threads."""
