"""Sparsifying encoders: top-k (largest magnitudes) and random-k (positions from a seed every rank shares).

Neither keeps what it does not send; wrap them in :class:`~.feedback.ErrorFeedback` (``Compression.topk``
and ``Compression.randomk`` do by default) so that the rest is added to the next step's gradient.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from . import kernels
from ..validation import check_parameter
from .base import MIN_ELEMENTS, Encoder, SharedIndexMessage, SparseMessage


def count_for(ratio: float, n: int) -> int:
    """How many of ``n`` values a ``ratio`` keeps: at least one, at most all."""
    return min(n, max(1, math.ceil(ratio * n)))


def check_ratio(ratio: float, what: str) -> float:
    return check_parameter(ratio, "ratio", what, low=0.0, high=1.0, low_open=True)


def name_seed(name: str) -> int:
    """A number derived from the tensor name, the same in every process (``hash`` is salted per process)."""
    return zlib.crc32(name.encode())


class TopK(Encoder):
    """Send the ``ratio`` share of values with the largest magnitudes, as (index, value) pairs."""

    kind = "topk"

    def __init__(self, ratio: float, min_elements: int = MIN_ELEMENTS):
        super().__init__(min_elements)
        self.ratio = check_ratio(ratio, "topk")

    def encode(self, name, flat):
        idx = kernels.topk(flat, count_for(self.ratio, flat.size))
        return SparseMessage(flat.size, idx, flat[idx])

    def __repr__(self):
        return f"TopK({self.ratio})"


class RandomK(Encoder):
    """Send the ``ratio`` share of values at random positions. The positions come from ``seed``, the
    tensor name and its step count, so every rank picks the same ones and only the values are allreduced
    (no indices travel)."""

    kind = "randomk"

    def __init__(self, ratio: float, seed: int = 0, min_elements: int = MIN_ELEMENTS):
        super().__init__(min_elements)
        self.ratio = check_ratio(ratio, "randomk")
        self.seed = check_parameter(seed, "seed", "randomk", integer=True)

    def encode(self, name, flat):
        state = self.state_of(name)
        step = state.get("step", 0)
        state["step"] = step + 1
        rng = np.random.default_rng([self.seed, name_seed(name), step])
        idx = np.sort(rng.choice(flat.size, count_for(self.ratio, flat.size), replace=False)).astype(np.int32)
        return SharedIndexMessage(flat.size, idx, flat[idx])

    def __repr__(self):
        return f"RandomK({self.ratio}, seed={self.seed})"
