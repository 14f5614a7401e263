"""Elementwise kernels: in-place reduction, scaling and float32 <-> float16/bfloat16 conversion.

A checked front end to the C extension ``commlib._kernels`` (csrc/, documented in docs/kernels.md).
Every function takes C-contiguous numpy arrays with the same number of elements (any shape), writes
into the destination in place, and releases the GIL while it loops.

Half types (float16, ``ml_dtypes.bfloat16``) are computed in float32 and rounded once, to nearest even;
conversions keep inf and NaN (a NaN stays a NaN, made quiet). Integer sums and products wrap around like
numpy's. Min and Max propagate NaN like ``np.minimum``/``np.maximum``.

Each function takes a keyword-only ``portable=False``: ``True`` runs the portable C loops instead of the
AVX2/F16C ones (the results are bit-identical, up to which payload NaN + NaN keeps; tests check this).
:func:`cpu_features` tells what the CPU offers and whether the SIMD loops are in use.

Example::

    >>> import numpy as np
    >>> from commlib import kernels
    >>> from commlib.ops import ReduceOp
    >>> a = np.ones(4, np.float16); kernels.reduce_(a, np.full(4, 2, np.float16), ReduceOp.SUM); a
    array([3., 3., 3., 3.], dtype=float16)
"""

from __future__ import annotations

import numpy as np

from . import _kernels
from .dtypes import BY_NUMPY, CODES as _CODES, FLOAT32, HALF
from .errors import UnsupportedDtypeError
from .validation import check_contiguous
from .ops import ReduceOp, as_op

_HALF_CODES = {dt: code for dt, code in _CODES.items() if dt in HALF}
_SCALABLE_CODES = {dt: code for dt, code in _CODES.items() if BY_NUMPY[dt].kind != "bool"}


def _array(arr, name: str) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array, got {type(arr).__name__}")
    check_contiguous(arr, name)
    return arr


def _writable(arr, name: str) -> np.ndarray:
    _array(arr, name)
    if not arr.flags.writeable:
        raise ValueError(f"{name}: array is read-only; the kernels write into it in place (pass a copy)")
    return arr


def _same_size(dst: np.ndarray, src: np.ndarray, names: tuple[str, str] = ("dst", "src")) -> None:
    if dst.size != src.size:
        raise ValueError(
            f"{names[0]} has {dst.size} elements (shape {dst.shape}) but {names[1]} has {src.size} "
            f"(shape {src.shape}); they must match"
        )


def _code(table: dict, arr: np.ndarray, name: str, what: str) -> int:
    code = table.get(arr.dtype)
    if code is None:
        supported = ", ".join(str(d) for d in table)
        raise UnsupportedDtypeError(f"{name}: dtype {arr.dtype} is not supported by {what}; use one of: {supported}")
    return code


def _half_code(arr: np.ndarray, name: str, what: str) -> int:
    return _code(_HALF_CODES, arr, name, what)


def _f32(arr: np.ndarray, name: str, what: str) -> None:
    if arr.dtype != FLOAT32:
        raise UnsupportedDtypeError(f"{name}: {what} needs a float32 array, got {arr.dtype}")


# Each function first tries the C call with nothing but the dtype lookups (the extension itself checks
# contiguity, writability, alignment and sizes, before it touches memory): a third of the cost per call,
# which matters for the many small chunks of a ring allreduce (docs/results/design_choices.md). When that fails, the _check_*
# function finds what is wrong and raises a clear error; if it finds nothing (an op given by name, or a
# problem only the C side detects), the call is repeated with the op normalised, so the C error shows.
_KERNEL_OPS = {op: int(op.kernel_op) for op in ReduceOp}
_FAST_FAILURES = (AttributeError, KeyError, TypeError, ValueError, BufferError)


def reduce_(dst: np.ndarray, src: np.ndarray, op: ReduceOp, *, portable: bool = False) -> None:
    """``dst = dst op src`` elementwise, in place; same dtype and size. Average reduces as Sum."""
    try:
        if dst.dtype == src.dtype:
            return _kernels.reduce(dst, src, _CODES[dst.dtype], _KERNEL_OPS[op], portable)
    except _FAST_FAILURES:
        pass
    _writable(dst, "dst")
    _array(src, "src")
    code = _code(_CODES, dst, "dst", "reduce_")
    if src.dtype != dst.dtype:
        raise TypeError(f"reduce_: dst is {dst.dtype} but src is {src.dtype}; they must have the same dtype")
    _same_size(dst, src)
    _kernels.reduce(dst, src, code, int(as_op(op).kernel_op), portable)


def reduce_widened_(dst: np.ndarray, src: np.ndarray, op: ReduceOp, *, dst_scale: float = 1.0,
                    portable: bool = False) -> None:
    """``dst = (dst * float32(dst_scale)) op float32(src)`` for float32 ``dst`` and float16/bfloat16 ``src``.

    The product is rounded to float32 before the operation, so the result is bit for bit that of
    ``scale_(dst, dst_scale)`` followed by the reduction, in one pass instead of two."""
    try:
        if dst.dtype == FLOAT32:
            return _kernels.reduce_widened(dst, src, _HALF_CODES[src.dtype], _KERNEL_OPS[op], portable,
                                           dst_scale)
    except _FAST_FAILURES:
        pass
    _writable(dst, "dst")
    _array(src, "src")
    _f32(dst, "dst", "reduce_widened_")
    code = _half_code(src, "src", "reduce_widened_")
    _same_size(dst, src)
    _kernels.reduce_widened(dst, src, code, int(as_op(op).kernel_op), portable, float(dst_scale))


def scale_(buf: np.ndarray, factor: float, *, portable: bool = False) -> None:
    """``buf *= factor`` in place (numeric dtypes).

    float64 multiplies by ``factor``; float32, float16 and bfloat16 by ``float32(factor)``, the half types
    in float32 and rounded once. Integers as Horovod scales them on the CPU: ``float64(factor) * x``,
    truncated toward zero (saturating at the int64 range, then wrapping to narrower types like numpy's
    astype). bool raises :class:`UnsupportedDtypeError` (a TypeError)."""
    try:
        return _kernels.scale(buf, _SCALABLE_CODES[buf.dtype], factor, portable)
    except _FAST_FAILURES:
        pass
    _writable(buf, "buf")
    code = _code(_SCALABLE_CODES, buf, "buf", "scale_ (numeric dtypes only)")
    _kernels.scale(buf, code, float(factor), portable)


def to_half(src: np.ndarray, dst: np.ndarray, scale: float = 1.0, *, portable: bool = False) -> int:
    """``dst = half(src * float32(scale))``: float32 to float16 or bfloat16 (by ``dst.dtype``), rounded to
    nearest even. Returns how many finite products ``src * scale`` became inf (0 for bfloat16 unless they
    exceed its largest finite value, about 3.39e38)."""
    try:
        if src.dtype == FLOAT32:
            return _kernels.to_half(src, dst, _HALF_CODES[dst.dtype], scale, portable)
    except _FAST_FAILURES:
        pass
    _array(src, "src")
    _writable(dst, "dst")
    _f32(src, "src", "to_half")
    code = _half_code(dst, "dst", "to_half")
    _same_size(dst, src)
    return _kernels.to_half(src, dst, code, float(scale), portable)


def from_half(src: np.ndarray, dst: np.ndarray, scale: float = 1.0, *, portable: bool = False) -> None:
    """``dst = float32(src) * float32(scale)``: float16 or bfloat16 to float32 (exact when scale is 1)."""
    try:
        if dst.dtype == FLOAT32:
            return _kernels.from_half(src, dst, _HALF_CODES[src.dtype], scale, portable)
    except _FAST_FAILURES:
        pass
    _array(src, "src")
    _writable(dst, "dst")
    code = _half_code(src, "src", "from_half")
    _f32(dst, "dst", "from_half")
    _same_size(dst, src)
    _kernels.from_half(src, dst, code, float(scale), portable)


def round_trip_(buf: np.ndarray, wire: np.ndarray, scale: float = 1.0, postscale: float = 1.0, *,
                portable: bool = False) -> int:
    """``wire = half(buf * float32(scale))`` and ``buf = float32(wire) * float32(postscale)`` in one pass:
    ``buf`` (float32) becomes what a receiver of ``wire`` (float16 or bfloat16) decodes. Bit for bit
    ``to_half(buf, wire, scale)`` followed by ``from_half(wire, buf, postscale)``; returns the same overflow
    count as ``to_half``."""
    try:
        if buf.dtype == FLOAT32:
            return _kernels.round_trip(buf, wire, _HALF_CODES[wire.dtype], scale, postscale, portable)
    except _FAST_FAILURES:
        pass
    _writable(buf, "buf")
    _writable(wire, "wire")
    _f32(buf, "buf", "round_trip_")
    code = _half_code(wire, "wire", "round_trip_")
    _same_size(buf, wire, ("buf", "wire"))
    return _kernels.round_trip(buf, wire, code, float(scale), float(postscale), portable)


def reduce_round_trip_(dst: np.ndarray, src: np.ndarray, wire: np.ndarray, op: ReduceOp, *,
                       dst_scale: float = 1.0, postscale: float = 1.0, round_dst: bool = False,
                       portable: bool = False) -> int:
    """A widened reduction whose result goes straight through the wire round trip, in one pass:
    ``dst = (dst * float32(dst_scale)) op float32(src)``, then ``wire = half(dst)`` and
    ``dst = float32(wire) * float32(postscale)``. Bit for bit ``reduce_widened_`` followed by
    ``round_trip_(dst, wire, 1.0, postscale)``; returns that overflow count. With ``round_dst``,
    ``dst * dst_scale`` is first rounded through the half dtype as well (``round_trip_(dst, wire,
    dst_scale)`` before an unscaled reduction; its overflows count too): both operands then are what a
    wire would have carried. ``src`` and ``wire`` have the same half dtype and may be the same array."""
    try:
        if dst.dtype == FLOAT32 and src.dtype == wire.dtype:
            return _kernels.reduce_round_trip(dst, src, wire, _HALF_CODES[src.dtype], _KERNEL_OPS[op],
                                              dst_scale, postscale, round_dst, portable)
    except _FAST_FAILURES:
        pass
    _writable(dst, "dst")
    _array(src, "src")
    _writable(wire, "wire")
    _f32(dst, "dst", "reduce_round_trip_")
    code = _half_code(src, "src", "reduce_round_trip_")
    if wire.dtype != src.dtype:
        raise TypeError(f"reduce_round_trip_: src is {src.dtype} but wire is {wire.dtype}; they must match")
    _same_size(dst, src)
    _same_size(dst, wire, ("dst", "wire"))
    return _kernels.reduce_round_trip(dst, src, wire, code, int(as_op(op).kernel_op), float(dst_scale),
                                      float(postscale), bool(round_dst), portable)


def dtype_code(dtype) -> int:
    """The C extensions' number for ``dtype`` (one of the reducible dtypes of :mod:`commlib.dtypes`)."""
    code = _CODES.get(np.dtype(dtype))
    if code is None:
        raise UnsupportedDtypeError(f"dtype {dtype} has no kernels; use one of: {', '.join(map(str, _CODES))}")
    return code


def cpu_features() -> dict:
    """What the CPU offers (``f16c``, ``avx2``, ``avx512f``) and whether the SIMD loops run (``simd``)."""
    return _kernels.cpu_features()
