"""Reduce-scatter: rank r ends with block r of the reduction of all ranks' buffers.

The size is the input size, as in nccl-tests; each rank receives size / n."""

from __future__ import annotations

import numpy as np

from ..ops import ReduceOp
from .collective import Collective, Layout, cast_into, reduction_input, reduction_result


class Reducescatter(Collective):
    name = "reducescatter"
    reduces = True

    def layout(self, nbytes: int, itemsize: int, nranks: int) -> Layout:
        per_rank = max(1, nbytes // itemsize // nranks)
        count = per_rank * nranks
        return Layout(nbytes=count * itemsize, count=count, nranks=nranks, send_count=count, recv_count=per_rank)

    def fill(self, send: np.ndarray, rank: int, nranks: int, op: ReduceOp, root: int, limit: int) -> None:
        cast_into(send, reduction_input(0, send.size, rank, nranks, op, limit))

    def expected(self, layout: Layout, rank: int, nranks: int, op: ReduceOp, root: int,
                 limit: int) -> np.ndarray:
        return reduction_result(rank * layout.recv_count, layout.recv_count, nranks, op, limit)

    def bus_factor(self, nranks: int) -> float:
        # Each rank sends the (n-1)/n of its input that other ranks own.
        return (nranks - 1) / nranks

    def run(self, engine, send: np.ndarray, layout: Layout, op: ReduceOp, algorithm: str, codec,
            root: int) -> np.ndarray:
        return engine.reducescatter(send, op)
