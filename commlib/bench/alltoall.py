"""Alltoall: block d of rank s's buffer ends as block s of rank d's output.

The size is one rank's whole buffer, as in nccl-tests; it is split into n equal blocks."""

from __future__ import annotations

import numpy as np

from ..ops import ReduceOp
from .collective import Collective, Layout, cast_into, cyclic


def _block(source: int, dest: int, count: int, limit: int) -> np.ndarray:
    return cyclic(count, 3 * source + 7 * dest, min(64, limit + 1))


class Alltoall(Collective):
    name = "alltoall"

    def layout(self, nbytes: int, itemsize: int, nranks: int) -> Layout:
        per_rank = max(1, nbytes // itemsize // nranks)
        count = per_rank * nranks
        return Layout(nbytes=count * itemsize, count=count, nranks=nranks, send_count=count, recv_count=count)

    def fill(self, send: np.ndarray, rank: int, nranks: int, op: ReduceOp, root: int, limit: int) -> None:
        per_rank = send.size // nranks
        cast_into(send, np.concatenate([_block(rank, d, per_rank, limit) for d in range(nranks)]))

    def expected(self, layout: Layout, rank: int, nranks: int, op: ReduceOp, root: int,
                 limit: int) -> np.ndarray:
        per_rank = layout.count // nranks
        return np.concatenate([_block(s, rank, per_rank, limit) for s in range(nranks)])

    def bus_factor(self, nranks: int) -> float:
        # Each rank sends the (n-1)/n of its buffer that belongs to other ranks.
        return (nranks - 1) / nranks

    def run(self, engine, send: np.ndarray, layout: Layout, op: ReduceOp, algorithm: str, codec,
            root: int) -> np.ndarray:
        received, _ = engine.alltoall(send, [layout.count // layout.nranks] * layout.nranks)
        return received
