"""The CUDA kernels of the device paths (CuPy elementwise kernels), compiled on first use.

One pass each, so that scaling and casting cost one read and one write of the tensor:
- ``scale_cast(src, factor, dst)``: ``dst = Dst(src * factor)``, any float/int source, any destination
  numpy CuPy knows (float16 included); arithmetic in float32, or float64 when either side is float64.
- ``to_bfloat16(src_f32, factor, dst_u16)``: round to nearest even of ``src * factor`` to bfloat16, kept
  as its 16-bit pattern (CuPy before v14 has no bfloat16 dtype); NaN stays NaN, overflow gives inf.
- ``from_bfloat16(src_u16, factor, dst_f32)``: the exact widening, times ``factor``;
  ``scale_bfloat16``: both, for bfloat16 tensors scaled in place.
The host kernels (:mod:`commlib.kernels`) round the same way, so a value crosses either path identically.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import BFLOAT16

_SCALE_CAST_F32 = ("X x, float32 s", "Y y", "y = (Y)((float)x * s)")
_SCALE_CAST_F64 = ("X x, float64 s", "Y y", "y = (Y)((double)x * s)")
_TO_BF16 = ("float32 x, float32 s", "uint16 y", """
    unsigned int b = __float_as_uint(x * s);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        y = (unsigned short)((b >> 16) | 0x40u);          // NaN: keep it a (quiet) NaN
    } else {
        y = (unsigned short)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);   // nearest, ties to even
    }""")
_FROM_BF16 = ("uint16 h, float32 s", "float32 y", "y = __uint_as_float(((unsigned int)h) << 16) * s")
_SCALE_BF16 = ("uint16 h, float32 s", "uint16 y", """
    unsigned int b = __float_as_uint(__uint_as_float(((unsigned int)h) << 16) * s);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        y = (unsigned short)((b >> 16) | 0x40u);
    } else {
        y = (unsigned short)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
    }""")


class DeviceKernels:
    """The kernels above for one CuPy module (CuPy caches the compiled code per device)."""

    def __init__(self, cupy):
        self.cupy = cupy
        kernel = cupy.ElementwiseKernel
        self._cast_f32 = kernel(*_SCALE_CAST_F32, name="commlib_scale_cast_f32")
        self._cast_f64 = kernel(*_SCALE_CAST_F64, name="commlib_scale_cast_f64")
        self._to_bf16 = kernel(*_TO_BF16, name="commlib_to_bfloat16")
        self._from_bf16 = kernel(*_FROM_BF16, name="commlib_from_bfloat16")
        self._scale_bf16 = kernel(*_SCALE_BF16, name="commlib_scale_bfloat16")

    def scale_cast(self, src, factor: float, dst) -> None:
        """``dst[...] = src * factor`` in ``dst``'s dtype (a plain copy when nothing changes). ``dst`` may
        hold bfloat16 as ``uint16`` next to a float32 ``src`` (or the reverse); ``uint16`` on both sides
        with a factor is bfloat16 scaled (integer buffers are never scaled)."""
        if src.size == 0:
            return
        src, dst = _bits(src), _bits(dst)
        if dst.dtype == np.uint16 and src.dtype == np.float32:
            self._to_bf16(src, np.float32(factor), dst)
        elif src.dtype == np.uint16 and dst.dtype == np.float32:
            self._from_bf16(src, np.float32(factor), dst)
        elif factor == 1.0 and src.dtype == dst.dtype:
            dst[...] = src
        elif src.dtype == dst.dtype == np.uint16:
            self._scale_bf16(src, np.float32(factor), dst)
        elif np.float64 in (src.dtype, dst.dtype):
            self._cast_f64(src, np.float64(factor), dst)
        else:
            self._cast_f32(src, np.float32(factor), dst)


def _bits(array):
    """A CuPy (v14+) bfloat16 array as its 16-bit pattern, which the kernels above take."""
    return array.view(np.uint16) if array.dtype == BFLOAT16 else array


def device_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a device buffer uses for ``dtype``: bfloat16 travels as its bits (``uint16``)."""
    return np.dtype(np.uint16) if dtype == BFLOAT16 else np.dtype(dtype)
