"""Broadcast: every rank's buffer is overwritten, in place, with the root's."""

from __future__ import annotations

import numpy as np

from ..ops import ReduceOp
from .collective import Collective, Layout, cast_into, cyclic


def _values(count: int, start: int, limit: int) -> np.ndarray:
    return cyclic(count, start, min(64, limit + 1))


class Broadcast(Collective):
    name = "broadcast"

    def layout(self, nbytes: int, itemsize: int, nranks: int) -> Layout:
        count = max(1, nbytes // itemsize)
        return Layout(nbytes=count * itemsize, count=count, nranks=nranks, send_count=count, recv_count=count)

    def fill(self, send: np.ndarray, rank: int, nranks: int, op: ReduceOp, root: int, limit: int) -> None:
        # Non-root ranks start from values that differ from the root's at every element.
        cast_into(send, _values(send.size, 0 if rank == root else 1, limit))

    def expected(self, layout: Layout, rank: int, nranks: int, op: ReduceOp, root: int,
                 limit: int) -> np.ndarray:
        return _values(layout.recv_count, 0, limit)

    def bus_factor(self, nranks: int) -> float:
        # A pipelined broadcast moves the whole buffer over each link once, whatever the rank count.
        return 1.0

    def run(self, engine, send: np.ndarray, layout: Layout, op: ReduceOp, algorithm: str, codec,
            root: int) -> np.ndarray:
        engine.broadcast_(send, root)
        return send
