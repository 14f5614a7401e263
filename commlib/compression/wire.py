"""Wire compression for allreduce: float32 buffers travel as float16 or bfloat16 and accumulate in float32.

A :class:`WireCodec` wraps any allreduce algorithm: the algorithm sends ``encode``-d chunks, and on receipt
``accumulate``-s them into its float32 buffer (or ``decode``-s a finished chunk). Reduction therefore
always happens in float32; only the bytes on the wire are half precision. ``round_trip`` and
``accumulate_round_trip`` fuse the owner's steps (finish, encode, keep the decoded value) into one pass, and
the ``scale``/``dst_scale``/``postscale`` arguments let algorithms fold scaling into these passes.

Overflow rule (float16 only, whose largest value is 65504): before encoding, values are divided by the
number of ranks, so no partial sum of in-range inputs can exceed the range; the result is multiplied back
for ``Sum`` (``Average`` needs no multiply). An input whose magnitude divided by the number of ranks still
exceeds 65504 becomes inf; the rank that saw it is warned (:class:`CompressionOverflowWarning`) naming
the tensor. Use ``Compression.bf16`` (float32's range) for such values.
"""

from __future__ import annotations

import warnings

import numpy as np

from .. import kernels
from ..dtypes import FLOAT16
from ..ops import ReduceOp
from ..validation import codec_dtype

FLOAT32 = np.dtype(np.float32)


class CompressionOverflowWarning(RuntimeWarning):
    """A finite float32 value overflowed float16 on the wire."""


class WireCodec:
    """float32 on the host, ``wire_dtype`` on the wire. ``scale`` multiplies values as they are encoded."""

    def __init__(self, name: str, wire_dtype: np.dtype):
        self.name = name
        self.wire_dtype = np.dtype(wire_dtype)

    def encode(self, src: np.ndarray, dst: np.ndarray, scale: float = 1.0) -> int:
        """``dst = wire(src * scale)``; returns how many finite values overflowed to inf."""
        return kernels.to_half(src, dst, scale) or 0

    def decode(self, src: np.ndarray, dst: np.ndarray, scale: float = 1.0) -> None:
        """``dst = float32(src) * scale``."""
        kernels.from_half(src, dst, scale)

    def accumulate(self, dst: np.ndarray, src: np.ndarray, op: ReduceOp, dst_scale: float = 1.0) -> None:
        """``dst = (dst * dst_scale) op float32(src)``, accumulating in float32 (``dst_scale`` lets an
        algorithm scale its own not-yet-sent data in the same pass)."""
        kernels.reduce_widened_(dst, src, op, dst_scale=dst_scale)

    def round_trip(self, buf: np.ndarray, wire: np.ndarray, scale: float = 1.0, postscale: float = 1.0) -> int:
        """``wire = wire(buf * scale)`` and ``buf = float32(wire) * postscale`` in one pass: the sender keeps
        exactly what receivers ``decode`` with ``postscale``. Returns how many values overflowed."""
        return kernels.round_trip_(buf, wire, scale, postscale)

    def accumulate_round_trip(self, dst: np.ndarray, src: np.ndarray, wire: np.ndarray, op: ReduceOp,
                              dst_scale: float = 1.0, postscale: float = 1.0) -> int:
        """``accumulate(dst, src, op, dst_scale)`` then ``round_trip(dst, wire, 1.0, postscale)`` in one pass:
        a chunk's last reduction step, its encoding for the allgather, and the value its owner keeps."""
        return kernels.reduce_round_trip_(dst, src, wire, op, dst_scale=dst_scale, postscale=postscale)

    # Horovod's Compressor interface, for code that calls it directly. commlib's own collectives do not
    # use it for fp16/bf16: they keep float32 accumulation and only encode what travels.
    def compress(self, tensor):
        """Horovod's ``compress``: ``(tensor cast to the wire type, its original dtype)``; floating tensors
        only are cast (numpy arrays, or torch tensors in commlib.torch)."""
        return _cast(tensor, self.wire_dtype)

    def decompress(self, tensor, ctx):
        """Horovod's ``decompress``: ``tensor`` cast back to the dtype ``compress`` recorded."""
        return _restore(tensor, ctx)

    def __repr__(self) -> str:
        return f"Compression.{self.name}"


class NoCompression:
    """``Compression.none``: tensors travel as they are. ``compress``/``decompress`` are Horovod's
    identity functions; commlib's collectives treat this object like ``None``."""

    name = "none"

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor

    def __repr__(self) -> str:
        return "Compression.none"


NONE = NoCompression()


def _cast(tensor, wire_dtype: np.dtype):
    if isinstance(tensor, np.ndarray):
        if tensor.dtype.kind != "f" or tensor.dtype == wire_dtype:
            return tensor, None
        return tensor.astype(wire_dtype), tensor.dtype
    import torch  # a torch tensor (commlib.torch)

    if not tensor.is_floating_point():
        return tensor, None
    target = torch.float16 if wire_dtype == FLOAT16 else torch.bfloat16
    return (tensor, None) if tensor.dtype == target else (tensor.to(target), tensor.dtype)


def _restore(tensor, ctx):
    if ctx is None:
        return tensor
    return tensor.astype(ctx) if isinstance(tensor, np.ndarray) else tensor.to(ctx)


def codec_for(compression, dtype: np.dtype, name: str) -> WireCodec | None:
    """The codec to use for a buffer of ``dtype``, or None when it travels as it is.

    A half-precision buffer already is on the wire in half precision, so compression changes nothing for
    it; other non-float32 dtypes cannot be compressed and raise."""
    if compression is None or isinstance(compression, NoCompression):
        return None
    if not isinstance(compression, WireCodec):
        raise TypeError(f"{name}: compression must be Compression.none, .fp16 or .bf16, not {compression!r}")
    message = codec_dtype(compression, dtype, name)
    if message:
        raise TypeError(message)
    return compression if np.dtype(dtype) == FLOAT32 else None


def warn_overflow(name: str, count: int, codec: WireCodec) -> None:
    """Tell the user that ``count`` values of tensor ``name`` overflowed the wire format."""
    warnings.warn(
        f"{name}: {count} finite value(s) overflowed {codec.name} on the wire and became inf "
        "(|value| / ranks > 65504); use Compression.bf16 or scale the values down",
        CompressionOverflowWarning,
        stacklevel=3,
    )
