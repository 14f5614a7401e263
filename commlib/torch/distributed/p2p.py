"""send, recv and recv from any source for the ``commlib`` backend.

A point-to-point message involves two ranks, so there is nothing for the coordinator to negotiate: each
process group sends on a transport of its own (:func:`.internals.point_to_point`, a private duplicate of
its communicator), whose waits share commlib's deadline, so a peer that stops answering fails the Work
with the same error as a collective. Messages carry torch's ``tag``; MPI keeps the messages of one sender
and tag in order, as torch requires.
"""

from __future__ import annotations

import time

import numpy as np

from ...errors import PeerLostError


class Transfer:
    """One nonblocking send or receive, as a handle a :class:`~.work.Work` can hold."""

    def __init__(self, transport, request, what: str):
        self._transport = transport
        self._request = request
        self._what = what
        self._done = False
        self._error: BaseException | None = None

    def done(self) -> bool:
        if not self._done and self._request.Test():
            self._done = True
        return self._done

    def wait_briefly(self, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while not self.done() and time.monotonic() < end:
            time.sleep(1e-4)
        return self._done

    def wait(self) -> None:
        if self._done:
            return
        try:
            self._transport.waitall([self._request])
        except PeerLostError as exc:
            self._error = exc
        self._done = True

    def result(self):
        if self._error is not None:
            raise self._error
        return None


class AnySourceReceive(Transfer):
    """A receive from whichever rank sends first with ``tag``: probe, then receive that message;
    ``source`` is the sender's rank in the group once done."""

    def __init__(self, transport, buffer: np.ndarray, tag: int, timeout_s: float):
        from mpi4py import MPI

        super().__init__(transport, None, "a receive from any source")
        self._buffer = buffer
        self._tag = tag
        self._limit = time.monotonic() + timeout_s
        self._status = MPI.Status()
        self._any = MPI.ANY_SOURCE
        self.source = -1

    def done(self) -> bool:
        if self._done:
            return True
        if self._request is None:
            message = self._transport.comm.Improbe(self._any, self._tag, self._status)
            if message is None:
                return False
            self.source = self._status.Get_source()
            self._request = message.Irecv(self._buffer)
        if self._request.Test():
            self._done = True
        return self._done

    def wait(self) -> None:
        while not self.done():
            if time.monotonic() > self._limit:
                self._error = PeerLostError(f"no rank sent a message with tag {self._tag} within the timeout",
                                            what=self._what)
                self._done = True
                return
            time.sleep(1e-4)
