"""Compression for allreduce: wire codecs (fp16/bf16, float32 accumulation) and lossy compressors.

``Compression`` names every choice, for ``allreduce(..., compression=)`` and ``DistributedOptimizer``:

- ``Compression.none``, ``.fp16``, ``.bf16``: :mod:`.wire`.
- ``Compression.topk(ratio)``, ``.randomk(ratio, seed)``, ``.onebit()``: sparsifying / quantizing encoders,
  wrapped in error feedback by default (``error_feedback=False`` for the bare encoder).
- ``Compression.dgc(...)``: deep gradient compression (:mod:`.dgc`).
- ``Compression.powersgd(rank, start_step)``: low-rank compression (:mod:`.powersgd`).
- ``Compression.error_feedback(c)``, ``Compression.momentum(c, mu)``: wrappers around any encoder.

A lossy compressor keeps state per tensor name: create one per model (``c = Compression.topk(0.01)``) and
pass the same object on every step. The contract is in :mod:`.base`; docs/compression.md has the design.
"""

from .base import MIN_ELEMENTS, Compressor, Encoder, Exchange, Message
from .dgc import DEFAULT_SPARSITY, DGC
from .feedback import ErrorFeedback, Momentum
from .onebit import OneBit
from .powersgd import PowerSGD
from .sparse import RandomK, TopK
from .wire import (FLOAT32, NONE, CompressionOverflowWarning, NoCompression, WireCodec, codec_for,
                   warn_overflow)
from ..dtypes import BFLOAT16, FLOAT16


class Compression:
    """Compression choices for ``allreduce(..., compression=)``, named as in horovod.torch (plus lossy ones)."""

    none = NONE
    fp16 = WireCodec("fp16", FLOAT16)
    bf16 = WireCodec("bf16", BFLOAT16)

    @staticmethod
    def topk(ratio: float, error_feedback: bool = True, min_elements: int = MIN_ELEMENTS) -> Encoder:
        """Send the largest-magnitude ``ratio`` share of each tensor; with error feedback by default."""
        c = TopK(ratio, min_elements)
        return ErrorFeedback(c) if error_feedback else c

    @staticmethod
    def randomk(ratio: float, seed: int = 0, error_feedback: bool = True,
                min_elements: int = MIN_ELEMENTS) -> Encoder:
        """Send a random ``ratio`` share (positions shared by all ranks via ``seed``); with error feedback
        by default."""
        c = RandomK(ratio, seed, min_elements)
        return ErrorFeedback(c) if error_feedback else c

    @staticmethod
    def onebit(error_feedback: bool = True, min_elements: int = MIN_ELEMENTS) -> Encoder:
        """Send signs and the mean magnitude; with error feedback by default."""
        c = OneBit(min_elements)
        return ErrorFeedback(c) if error_feedback else c

    @staticmethod
    def dgc(momentum: float = 0.9, sparsity=DEFAULT_SPARSITY, rampup_begin_step: int = 0,
            rampup_step: int = 1, clip_norm: float | None = None, min_elements: int = MIN_ELEMENTS) -> DGC:
        """Deep gradient compression; the optimizer must then run without momentum (see :mod:`.dgc`)."""
        return DGC(momentum, sparsity, rampup_begin_step, rampup_step, clip_norm, min_elements)

    @staticmethod
    def powersgd(rank: int = 1, start_step: int = 10, **options) -> PowerSGD:
        """PowerSGD of rank ``rank``, dense before ``start_step`` (options: see :class:`PowerSGD`)."""
        return PowerSGD(rank, start_step, **options)

    @staticmethod
    def error_feedback(compressor: Encoder) -> ErrorFeedback:
        """Error feedback around any encoder (what it does not send is added to the next step)."""
        return ErrorFeedback(compressor)

    @staticmethod
    def momentum(compressor: Encoder, mu: float = 0.9, nesterov: bool = False) -> Momentum:
        """Momentum applied before ``compressor``; use an optimizer without momentum of its own."""
        return Momentum(compressor, mu, nesterov)


__all__ = [
    "Compression", "Compressor", "CompressionOverflowWarning", "DGC", "Encoder", "ErrorFeedback", "Exchange",
    "FLOAT32", "Message", "Momentum", "NoCompression", "OneBit", "PowerSGD", "RandomK", "TopK", "WireCodec",
    "codec_for", "warn_overflow",
]
