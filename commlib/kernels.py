"""Elementwise kernels: in-place reduction, scaling and float32 <-> float16/bfloat16 conversion.

TEMPORARY numpy implementation with the final signatures; replaced by the C extension
``commlib._kernels`` (csrc/). Callers depend only on these signatures.
"""

import numpy as np

from .dtypes import BFLOAT16, FLOAT16
from .ops import ReduceOp

_NUMPY_OPS = {
    ReduceOp.SUM: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}


def reduce_(dst: np.ndarray, src: np.ndarray, op: ReduceOp) -> None:
    """``dst = dst op src`` elementwise, in place; same dtype and size. Average reduces as Sum."""
    _NUMPY_OPS[op.kernel_op](dst, src, out=dst)


def reduce_widened_(dst: np.ndarray, src: np.ndarray, op: ReduceOp) -> None:
    """``dst = dst op float32(src)`` for float32 ``dst`` and float16/bfloat16 ``src``."""
    _NUMPY_OPS[op.kernel_op](dst, src.astype(np.float32), out=dst)


def scale_(buf: np.ndarray, factor: float) -> None:
    """``buf *= factor`` in place (floating dtypes)."""
    np.multiply(buf, buf.dtype.type(factor), out=buf)


def to_half(src: np.ndarray, dst: np.ndarray, scale: float = 1.0) -> None:
    """``dst = half(src * scale)``: float32 to float16 or bfloat16, round to nearest even."""
    dst[...] = (src * np.float32(scale)).astype(dst.dtype)


def from_half(src: np.ndarray, dst: np.ndarray, scale: float = 1.0) -> None:
    """``dst = float32(src) * scale``: float16 or bfloat16 to float32."""
    np.multiply(src.astype(np.float32), np.float32(scale), out=dst)
