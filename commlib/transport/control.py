"""The coordinator's control channel: small pickled messages between ranks, never blocking.

Kept apart from the data communicators so that negotiation traffic can never match a collective's
messages."""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

_TAG = 7
_END_TAG = 8  # the empty message each rank sends every other rank at shutdown, after all others


class ControlChannel:
    """Non-blocking object messages over a communicator of its own."""

    def __init__(self, comm: "MPI.Comm"):
        self._comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._sends: list[MPI.Request] = []
        self._ends: list[MPI.Request] = []
        self._status = MPI.Status()

    def post(self, dest: int, message: Any) -> None:
        """Send ``message`` to ``dest`` without waiting for it to be received."""
        self._sends.append(self._comm.isend(message, dest, _TAG))
        if len(self._sends) > 64:
            self._reap()

    def receive_all(self) -> list[tuple[int, Any]]:
        """Every message that has arrived, as (source, message), in arrival order per source."""
        received = []
        status = self._status
        while True:
            msg = self._comm.improbe(source=MPI.ANY_SOURCE, tag=_TAG, status=status)
            if msg is None:
                return received
            received.append((status.Get_source(), msg.recv()))

    def send_end(self) -> None:
        """Tell every other rank that this rank sends nothing more, by synchronous sends: each completes
        only once its receiver has taken it, and so (messages between two ranks keep their order) every
        message this rank sent it before. Without that, a message still in flight when the communicator
        is freed can reach the next session's: MPI reuses the context id of a freed communicator."""
        self._ends = [self._comm.issend(None, peer, _END_TAG) for peer in range(self.size) if peer != self.rank]

    def ended(self) -> bool:
        """Whether every rank has taken this rank's end message (see :meth:`send_end`)."""
        return MPI.Request.Testall(self._ends)

    def discard_all(self) -> None:
        """Receive and drop every message that has arrived, of any tag, in order (used at shutdown)."""
        while (message := self._comm.improbe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)) is not None:
            message.recv()

    def ibarrier(self) -> "MPI.Request":
        """A non-blocking barrier over the channel's ranks."""
        return self._comm.Ibarrier()

    def _reap(self) -> None:
        self._sends = [r for r in self._sends if not r.Test()]

    def flush(self) -> None:
        """Wait until every posted message has been delivered (used at shutdown)."""
        if self._sends:
            MPI.Request.Waitall(self._sends)
            self._sends = []

    def close(self) -> None:
        self._reap()
        for request in self._sends + self._ends:  # undeliverable at shutdown: a peer already left
            try:
                request.Cancel()
            except MPI.Exception:
                pass
        self._sends, self._ends = [], []
        self._comm.Free()
