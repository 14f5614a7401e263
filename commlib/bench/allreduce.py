"""Allreduce: every rank ends with the reduction of all ranks' buffers, in place."""

from __future__ import annotations

import numpy as np

from ..ops import ReduceOp
from .collective import Collective, Layout, cast_into, reduction_input, reduction_result


class Allreduce(Collective):
    name = "allreduce"
    reduces = True

    def layout(self, nbytes: int, itemsize: int, nranks: int) -> Layout:
        count = max(1, nbytes // itemsize)
        return Layout(nbytes=count * itemsize, count=count, nranks=nranks, send_count=count, recv_count=count)

    def fill(self, send: np.ndarray, rank: int, nranks: int, op: ReduceOp, root: int, limit: int) -> None:
        cast_into(send, reduction_input(0, send.size, rank, nranks, op, limit))

    def expected(self, layout: Layout, rank: int, nranks: int, op: ReduceOp, root: int,
                 limit: int) -> np.ndarray:
        return reduction_result(0, layout.recv_count, nranks, op, limit)

    def bus_factor(self, nranks: int) -> float:
        # Each rank must send and receive (n-1)/n of the buffer twice: once to reduce its share (the
        # reduce-scatter half) and once to spread the reduced shares (the allgather half).
        return 2.0 * (nranks - 1) / nranks

    def run(self, engine, send: np.ndarray, layout: Layout, op: ReduceOp, algorithm: str, codec,
            root: int) -> np.ndarray:
        engine.allreduce_(send, op, algorithm=algorithm, codec=codec)
        return send
