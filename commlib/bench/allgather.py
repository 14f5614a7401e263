"""Allgather: every rank ends with all ranks' buffers concatenated in rank order.

The size is the gathered (output) size, as in nccl-tests; each rank contributes size / n."""

from __future__ import annotations

import numpy as np

from ..ops import ReduceOp
from .collective import Collective, Layout, cast_into, cyclic


def _chunk(rank: int, count: int, limit: int) -> np.ndarray:
    return cyclic(count, 5 * rank, min(64, limit + 1))


class Allgather(Collective):
    name = "allgather"

    def layout(self, nbytes: int, itemsize: int, nranks: int) -> Layout:
        per_rank = max(1, nbytes // itemsize // nranks)
        count = per_rank * nranks
        return Layout(nbytes=count * itemsize, count=count, nranks=nranks, send_count=per_rank, recv_count=count)

    def fill(self, send: np.ndarray, rank: int, nranks: int, op: ReduceOp, root: int, limit: int) -> None:
        cast_into(send, _chunk(rank, send.size, limit))

    def expected(self, layout: Layout, rank: int, nranks: int, op: ReduceOp, root: int,
                 limit: int) -> np.ndarray:
        return np.concatenate([_chunk(r, layout.send_count, limit) for r in range(nranks)])

    def bus_factor(self, nranks: int) -> float:
        # Each rank receives the (n-1)/n of the output it did not have.
        return (nranks - 1) / nranks

    def run(self, engine, send: np.ndarray, layout: Layout, op: ReduceOp, algorithm: str, codec,
            root: int) -> np.ndarray:
        return engine.allgather(send)
