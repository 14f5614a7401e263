"""``Compression`` for TensorFlow: Horovod's ``none``/``fp16`` (plus ``bf16``) and commlib's lossy ones.

``fp16`` and ``bf16`` are commlib's wire codecs: a float32 tensor travels in half precision and is summed in
float32 inside commlib's collective. They also have Horovod's ``compress``/``decompress`` on tensors
(cast floating tensors to half, and back), which is what other floating dtypes get.
"""

from __future__ import annotations

import tensorflow as tf

from .. import compression as _compression
from ..compression import collective as _collective
from ..compression.wire import NONE, NoCompression, WireCodec
from ..dtypes import BFLOAT16, FLOAT16


class _HalfCompressor(WireCodec):
    """A half-precision wire codec that also casts TensorFlow tensors (Horovod's ``compress``)."""

    def __init__(self, name, wire_dtype, tf_dtype):
        super().__init__(name, wire_dtype)
        self.tf_dtype = tf_dtype

    def compress(self, tensor):
        tensor = tf.convert_to_tensor(tensor)
        if tensor.dtype.is_floating and tensor.dtype != self.tf_dtype:
            return tf.cast(tensor, self.tf_dtype), tensor.dtype
        return tensor, None

    def decompress(self, tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression(_compression.Compression):
    """Compression choices for TensorFlow collectives and ``DistributedGradientTape``/``DistributedOptimizer``."""

    none = NONE
    fp16 = _HalfCompressor("fp16", FLOAT16, tf.float16)
    bf16 = _HalfCompressor("bf16", BFLOAT16, tf.bfloat16)


def split(compression, dtype: tf.DType):
    """``(around, wire)`` for a tensor of ``dtype``: what runs in TensorFlow around the collective (a
    Horovod-style ``compress``/``decompress``, or None) and what commlib's collective gets."""
    if compression is None or isinstance(compression, NoCompression):
        return None, None
    if isinstance(compression, _HalfCompressor):
        if dtype == tf.float32:
            return None, compression
        return (compression if dtype.is_floating else None), None
    if isinstance(compression, WireCodec):
        return None, (compression if dtype == tf.float32 else None)
    if _collective.horovod_style(compression):
        return compression, None
    return None, compression
