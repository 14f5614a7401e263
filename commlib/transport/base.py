"""The Transport interface: the only thing allreduce algorithms talk to.

A transport moves 1-D C-contiguous numpy arrays between the ranks of one group. Counts are in elements
of the buffer's dtype; any fixed-size dtype can be moved (float16 and bfloat16 included). Only
``allreduce_native_`` reduces, and only for the dtypes of ``commlib.dtypes.REDUCIBLE``.

Requests returned by ``isend``/``irecv`` are opaque: pass them to ``waitall`` of the same transport.
Point-to-point calls between the same pair of ranks with the same tag match in the order they were posted.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Sequence

import numpy as np

from ..ops import ReduceOp

#: Color for :meth:`Transport.split` meaning "this rank joins no group" (the call returns None).
UNDEFINED = None


class Transport(abc.ABC):
    """A group of ``size`` ranks; this process is ``rank``."""

    @property
    @abc.abstractmethod
    def rank(self) -> int:
        """This process's index in the group, 0 <= rank < size."""

    @property
    @abc.abstractmethod
    def size(self) -> int:
        """Number of ranks in the group."""

    # -- point to point ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def send(self, buf: np.ndarray, dest: int, tag: int = 0) -> None:
        """Send all of ``buf`` to ``dest``; returns when ``buf`` may be reused."""

    @abc.abstractmethod
    def recv(self, buf: np.ndarray, source: int, tag: int = 0) -> None:
        """Receive exactly ``buf.size`` elements from ``source`` into ``buf``."""

    @abc.abstractmethod
    def sendrecv(self, sendbuf: np.ndarray, dest: int, recvbuf: np.ndarray, source: int, tag: int = 0) -> None:
        """Send ``sendbuf`` to ``dest`` while receiving ``recvbuf`` from ``source`` (deadlock-free)."""

    @abc.abstractmethod
    def isend(self, buf: np.ndarray, dest: int, tag: int = 0) -> Any:
        """Start sending ``buf``; do not modify it before the request completes."""

    @abc.abstractmethod
    def irecv(self, buf: np.ndarray, source: int, tag: int = 0) -> Any:
        """Start receiving into ``buf``; do not read it before the request completes."""

    @abc.abstractmethod
    def waitall(self, requests: Sequence[Any]) -> None:
        """Wait until every request in ``requests`` has completed."""

    # -- collectives ------------------------------------------------------------------------------------
    @abc.abstractmethod
    def allreduce_native_(self, buf: np.ndarray, op: ReduceOp) -> None:
        """Reduce ``buf`` across the group in place with the underlying library's own allreduce."""

    def native_allreducer(self, dtype: np.dtype, op: ReduceOp) -> Callable[[np.ndarray], None]:
        """A function doing ``allreduce_native_(buf, op)`` for 1-D C-contiguous buffers of ``dtype``; a
        transport may return one that has done its lookups (datatype, op) once, for calls on a hot path."""
        def run(buf: np.ndarray) -> None:
            self.allreduce_native_(buf, op)
        return run

    @abc.abstractmethod
    def allgatherv(self, sendbuf: np.ndarray, recvbuf: np.ndarray, counts: Sequence[int]) -> None:
        """Rank i contributes ``counts[i]`` elements; ``recvbuf`` receives them concatenated in rank order."""

    @abc.abstractmethod
    def bcast_(self, buf: np.ndarray, root: int) -> None:
        """Overwrite ``buf`` on every rank with ``root``'s ``buf``."""

    @abc.abstractmethod
    def alltoallv(self, sendbuf: np.ndarray, sendcounts: Sequence[int], recvbuf: np.ndarray,
                  recvcounts: Sequence[int]) -> None:
        """Send ``sendcounts[i]`` consecutive elements to rank i; receive ``recvcounts[i]`` from rank i.
        Both buffers are packed in rank order."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Return once every rank of the group has entered the barrier."""

    # -- groups -----------------------------------------------------------------------------------------
    @abc.abstractmethod
    def split(self, color: int | None, key: int) -> "Transport | None":
        """Collective: ranks with equal ``color`` form a new transport, ordered by ``key`` (then rank).
        A rank passing ``UNDEFINED`` (None) joins no group and gets None. Free the result with ``free``."""

    @abc.abstractmethod
    def free(self) -> None:
        """Release what this transport holds. Idempotent; the transport is unusable afterwards."""
