"""The table every collective module fills, and the check data they share.

As in nccl-tests, a collective is described by four things: how a byte count becomes element counts
(:meth:`Collective.layout`), how inputs are filled with values whose exact result is known
(:meth:`Collective.fill`, :meth:`Collective.expected`), the bus-bandwidth factor (:meth:`Collective.bus_factor`)
and how one call runs (:meth:`Collective.run`). The core (``commlib.bench.core``) owns everything else.

Check values are small non-negative integers, chosen so that every partial result the collective can form
is an integer the dtype represents exactly (float16 up to 2048, bfloat16 up to 256, int8 up to 127, ...).
A correct implementation therefore reproduces them bit for bit, whatever order it reduces in.
"""

from __future__ import annotations

import abc
import dataclasses

import numpy as np

from ..dtypes import BFLOAT16, FLOAT16
from ..ops import ReduceOp


@dataclasses.dataclass(frozen=True)
class Layout:
    """Element counts of one size step. ``nbytes`` and ``count`` are what the table prints."""

    nbytes: int
    count: int
    nranks: int
    send_count: int
    recv_count: int


def exact_limit(dtype: np.dtype) -> int:
    """The largest M such that every integer 0..M is exactly representable in ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype == FLOAT16:
        return 2048
    if dtype == BFLOAT16:
        return 256
    if dtype.kind == "f":
        return 2 ** (np.finfo(dtype).nmant + 1)
    return int(np.iinfo(dtype).max)


def cyclic(count: int, start: int, modulus: int) -> np.ndarray:
    """``(start + i) % modulus`` for i in 0..count-1, as int64."""
    return (np.arange(count, dtype=np.int64) + start) % max(modulus, 1)


def cast_into(dst: np.ndarray, values: np.ndarray) -> None:
    """Store integer ``values`` into ``dst`` (any dtype; values are exact in it by construction)."""
    if dst.dtype.kind in "iu":
        dst[...] = values
    else:
        dst[...] = values.astype(np.float64).astype(dst.dtype)


class Collective(abc.ABC):
    """One collective's entry in the benchmark table."""

    #: Name on the command line and in the output.
    name: str = ""
    #: True when ``-o`` matters (the collective reduces).
    reduces: bool = False

    @abc.abstractmethod
    def layout(self, nbytes: int, itemsize: int, nranks: int) -> Layout:
        """Round ``nbytes`` down to whole elements this collective can split over ``nranks`` (at least one
        element per rank)."""

    @abc.abstractmethod
    def fill(self, send: np.ndarray, rank: int, nranks: int, op: ReduceOp, root: int, limit: int) -> None:
        """Write this rank's check input into ``send``: integers such that every partial result stays
        within 0..``limit`` (see :func:`exact_limit`)."""

    @abc.abstractmethod
    def expected(self, layout: Layout, rank: int, nranks: int, op: ReduceOp, root: int,
                 limit: int) -> np.ndarray:
        """The exact result on ``rank``: int64, or float64 for ``Average``."""

    @abc.abstractmethod
    def bus_factor(self, nranks: int) -> float:
        """busbw / algbw: how much of the data each rank's link must carry, relative to the size."""

    @abc.abstractmethod
    def run(self, engine, send: np.ndarray, layout: Layout, op: ReduceOp, algorithm: str, codec,
            root: int) -> np.ndarray:
        """Run the collective once on ``engine`` and return the output array (``send`` when in place)."""


# -- reductions: shared by allreduce and reducescatter ----------------------------------------------------
# Element i (its index in the full, unscattered buffer) on rank r holds:
#   sum, avg, min, max: (i + 3r) % K, with K small enough that n * (K - 1) <= limit, so every partial sum
#                       is exact; the 3r shift makes min and max differ between ranks.
#   prod:               (i % 7) + 1 on rank i % n and 1 on every other rank, so the exact product is
#                       (i % 7) + 1 whatever the number of ranks.

PROD_CYCLE = 7


def _modulus(nranks: int, op: ReduceOp, limit: int) -> int:
    if op in (ReduceOp.SUM, ReduceOp.AVERAGE):
        return max(1, min(64, limit // nranks + 1))
    return max(1, min(64, limit + 1))


def reduction_input(start: int, count: int, rank: int, nranks: int, op: ReduceOp, limit: int) -> np.ndarray:
    """Rank ``rank``'s check values for elements ``start .. start + count - 1``."""
    if op is ReduceOp.PRODUCT:
        index = np.arange(start, start + count, dtype=np.int64)
        return np.where(index % nranks == rank, index % PROD_CYCLE + 1, 1)
    return cyclic(count, start + 3 * rank, _modulus(nranks, op, limit))


def reduction_result(start: int, count: int, nranks: int, op: ReduceOp, limit: int) -> np.ndarray:
    """The exact reduction over all ranks of :func:`reduction_input` (float64 for Average)."""
    if op is ReduceOp.PRODUCT:
        return np.arange(start, start + count, dtype=np.int64) % PROD_CYCLE + 1
    inputs = [reduction_input(start, count, r, nranks, op, limit) for r in range(nranks)]
    if op is ReduceOp.MIN:
        return np.minimum.reduce(inputs)
    if op is ReduceOp.MAX:
        return np.maximum.reduce(inputs)
    total = np.add.reduce(inputs)
    return total / nranks if op is ReduceOp.AVERAGE else total
