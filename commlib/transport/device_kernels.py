"""The CUDA kernels of the device paths (CuPy elementwise kernels), compiled on first use.

One pass each, so that scaling and casting cost one read and one write of the tensor:
- ``scale_cast(src, factor, dst)``: ``dst = Dst(src * factor)``, any float/int source, any destination
  numpy CuPy knows (float16 included); arithmetic in float32, or float64 when either side is float64.
- ``to_bfloat16(src_f32, factor, dst_u16)``: round to nearest even of ``src * factor`` to bfloat16, kept
  as its 16-bit pattern (CuPy before v14 has no bfloat16 dtype); NaN stays NaN, overflow gives inf.
- ``from_bfloat16(src_u16, factor, dst_f32)``: the exact widening, times ``factor``;
  ``scale_bfloat16``: both, for bfloat16 tensors scaled in place.
- ``pack(sources, factor, fused)`` and ``unpack(fused, factor, targets)``: the same conversions for many
  tensors in one kernel launch (the fused buffer of a response), each element finding its tensor by a
  binary search over the tensors' offsets; the tensors' addresses travel in a small device array.
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


# The conversions of the batched kernels: (statements, expression) computing the value stored from ``v``
# (the element read, type X) and ``s`` (the factor, float64); each matches a single-tensor kernel above.
_BF16_ROUND = """
    unsigned int b = {bits};
    unsigned short rounded = (unsigned short)(((b & 0x7fffffffu) > 0x7f800000u)
        ? ((b >> 16) | 0x40u) : ((b + 0x7fffu + ((b >> 16) & 1u)) >> 16));"""
_CONVERT = {
    "copy": ("", "v"),
    "f32": ("", "(Y)((float)v * (float)s)"),
    "f64": ("", "(Y)((double)v * s)"),
    "to_bf16": (_BF16_ROUND.format(bits="__float_as_uint((float)v * (float)s)"), "rounded"),
    "from_bf16": ("", "__uint_as_float(((unsigned int)v) << 16) * (float)s"),
    "bf16_scale": (_BF16_ROUND.format(bits="__float_as_uint(__uint_as_float(((unsigned int)v) << 16) * (float)s)"),
                   "rounded"),
}
# The tensor holding fused element i: the last t with offsets[t] <= i (empty tensors are skipped that way).
_FIND = """
    long long lo = 0, hi = tensors - 1;
    while (lo < hi) {
        long long mid = (lo + hi + 1) >> 1;
        if (offsets[mid] <= i) lo = mid; else hi = mid - 1;
    }
    long long j = i - offsets[lo];"""
# pack: one thread per element of the fused buffer ``y``, reading element j of source tensor lo (X is
# bound by ``like``, the first source).
_PACK = ("raw X like, raw uint64 pointers, raw int64 offsets, int64 tensors, float64 s", "Y y",
         _FIND + "\n    X v = ((const X*)pointers[lo])[j];", "\n    y = ({});\n")
# unpack: one thread per element of the fused buffer ``x``, writing element j of target tensor lo (Y is
# bound by ``like``, the first target).
_UNPACK = ("X x, raw uint64 pointers, raw int64 offsets, int64 tensors, float64 s", "raw Y like",
           _FIND + "\n    X v = x;", "\n    ((Y*)pointers[lo])[j] = ({});\n")


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
        self._batched: dict = {}  # (pack or unpack, conversion) -> kernel, made on first use

    def _batch_kernel(self, direction: str, conversion: str):
        kernel = self._batched.get((direction, conversion))
        if kernel is None:
            inputs, outputs, head, store = _PACK if direction == "pack" else _UNPACK
            statements, value = _CONVERT[conversion]
            body = head + statements + store.format(value)
            kernel = self._batched[(direction, conversion)] = self.cupy.ElementwiseKernel(
                inputs, outputs, body, name=f"commlib_{direction}_{conversion}")
        return kernel

    def pack(self, sources, factor: float, fused) -> None:
        """``fused`` = every source (contiguous, one dtype) times ``factor``, cast to ``fused``'s dtype, one
        after another: one kernel (one ``scale_cast`` for a single source)."""
        sources = [_bits(s) for s in sources]
        fused = _bits(fused)
        if len(sources) == 1:
            self.scale_cast(sources[0], factor, fused)
            return
        if fused.size == 0:
            return
        pointers, offsets = self._table(sources)
        kernel = self._batch_kernel("pack", _conversion(sources[0].dtype, fused.dtype, factor))
        kernel(sources[0], pointers, offsets, len(sources), float(factor), fused)

    def unpack(self, fused, factor: float, targets) -> None:
        """The inverse of :meth:`pack`: each target = its part of ``fused`` times ``factor``, cast."""
        targets = [_bits(t) for t in targets]
        fused = _bits(fused)
        if len(targets) == 1:
            self.scale_cast(fused, factor, targets[0])
            return
        if fused.size == 0:
            return
        pointers, offsets = self._table(targets)
        kernel = self._batch_kernel("unpack", _conversion(fused.dtype, targets[0].dtype, factor))
        kernel(fused, pointers, offsets, len(targets), float(factor), targets[0])

    def _table(self, arrays):
        """(device array of the arrays' addresses, device array of their offsets in the fused buffer),
        copied on the current stream."""
        counts = np.fromiter((a.size for a in arrays), np.int64, len(arrays))
        offsets = np.zeros(len(arrays) + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        pointers = np.fromiter((a.data.ptr for a in arrays), np.uint64, len(arrays))
        return self.cupy.asarray(pointers), self.cupy.asarray(offsets)

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
        elif np.float64 in (src.dtype, dst.dtype) or src.dtype.kind in "iu" or dst.dtype.kind in "iu":
            self._cast_f64(src, np.float64(factor), dst)
        else:
            self._cast_f32(src, np.float32(factor), dst)


def _conversion(source: np.dtype, target: np.dtype, factor: float) -> str:
    """Which body of :data:`_CONVERT` takes ``source`` to ``target``, as :meth:`DeviceKernels.scale_cast`
    decides (``uint16`` is bfloat16's bits: commlib reduces no uint16 tensors)."""
    source, target = np.dtype(source), np.dtype(target)
    if target == np.uint16 and source == np.float32:
        return "to_bf16"
    if source == np.uint16 and target == np.float32:
        return "from_bf16"
    if source == target and (factor == 1.0 or source.kind == "b"):
        return "copy"
    if source == target == np.uint16:
        return "bf16_scale"
    if np.float64 in (source, target) or source.kind in "iu" or target.kind in "iu":
        return "f64"
    return "f32"


def _bits(array):
    """A CuPy (v14+) bfloat16 array as its 16-bit pattern, which the kernels above take."""
    return array.view(np.uint16) if array.dtype == BFLOAT16 else array


def device_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a device buffer uses for ``dtype``: bfloat16 travels as its bits (``uint16``)."""
    return np.dtype(np.uint16) if dtype == BFLOAT16 else np.dtype(dtype)
