"""Checked entry points of the C loops in csrc/compression.c (``commlib._compression``)."""

from __future__ import annotations

import numpy as np

from .. import _compression

_F32 = np.dtype(np.float32)
_I32 = np.dtype(np.int32)


def _check(array: np.ndarray, dtype: np.dtype, what: str, writable: bool = False) -> None:
    if not isinstance(array, np.ndarray) or array.dtype != dtype or not array.flags.c_contiguous:
        raise TypeError(f"{what}: expected a C-contiguous {dtype} array, got "
                        f"{getattr(array, 'dtype', type(array).__name__)}")
    if writable and not array.flags.writeable:
        raise ValueError(f"{what}: the array is read-only")


def topk(x: np.ndarray, k: int) -> np.ndarray:
    """Positions (int32, ascending) of the ``k`` largest ``|x|`` of the float32 ``x``; ties go to lower
    positions, NaN counts as larger than any number. The same values give the same positions everywhere."""
    _check(x, _F32, "topk")
    flat = x.reshape(-1)
    k = int(k)
    if not 0 <= k <= flat.size:
        raise ValueError(f"topk: k={k} is outside 0..{flat.size}")
    idx = np.empty(k, _I32)
    _compression.topk(flat, k, idx)
    return idx


def scatter_add(dst: np.ndarray, idx: np.ndarray, val: np.ndarray) -> None:
    """``dst[idx[i]] += val[i]`` for i in order (duplicates add up; float32 ``dst``/``val``, int32 ``idx``)."""
    _check(dst, _F32, "scatter_add dst", writable=True)
    _check(idx, _I32, "scatter_add idx")
    _check(val, _F32, "scatter_add val")
    _compression.scatter_add(dst.reshape(-1), idx.reshape(-1), val.reshape(-1))


def momentum_accumulate(u: np.ndarray, v: np.ndarray, g: np.ndarray, m: float) -> None:
    """``u = m*u + g; v += u`` in one pass (DGC's momentum correction; float32, equal sizes)."""
    _check(u, _F32, "momentum_accumulate u", writable=True)
    _check(v, _F32, "momentum_accumulate v", writable=True)
    _check(g, _F32, "momentum_accumulate g")
    _compression.momentum_accumulate(u.reshape(-1), v.reshape(-1), g.reshape(-1), float(m))
