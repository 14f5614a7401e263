"""Scaling by passes of their own, for the paths that cannot fold it into a pass they make anyway."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import kernels


def with_scaling_passes(buf: np.ndarray, prescale: float, postscale: float, reduce: Callable[[], int]) -> int:
    """``buf *= prescale``, then ``reduce()`` (returning encode overflows), then ``buf *= postscale``;
    a factor of 1 costs nothing."""
    if prescale != 1.0:
        kernels.scale_(buf, prescale)
    overflow = reduce()
    if postscale != 1.0:
        kernels.scale_(buf, postscale)
    return overflow
