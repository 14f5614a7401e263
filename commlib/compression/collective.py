"""allreduce with a lossy compressor or a Horovod-style one: what ``allreduce(..., compression=c)`` runs
when ``c`` is not a wire codec.

- A :class:`~.base.Compressor` (topk, dgc, powersgd, ...): its ``start`` compresses this rank's tensor and
  submits the collectives; the returned handle's result runs ``finish`` (decode, divide for Average, and
  for in-place calls copy into the caller's array). Compression happens per tensor, before the
  coordinator sees anything, so fusion then packs compressed messages, never compresses a fused buffer.
- Any object with Horovod's ``compress(tensor) -> (tensor, ctx)`` and ``decompress(tensor, ctx)`` (e.g.
  a class with two static methods): the compressed array is allreduced as it is and decompressed after.
"""

from __future__ import annotations

import numpy as np

from ..coordinator.requests import Handle
from ..ops import Average, ReduceOp, Sum
from .base import FLOAT32, Compressor, Exchange
from .wire import NoCompression, WireCodec


def is_special(compression) -> bool:
    """True for a lossy compressor or a Horovod-style compressor (anything but none, fp16, bf16)."""
    return compression is not None and not isinstance(compression, (WireCodec, NoCompression))


def horovod_style(compression) -> bool:
    """An object with Horovod's ``compress``/``decompress`` that is not one of commlib's own codecs."""
    return (is_special(compression) and callable(getattr(compression, "compress", None))
            and callable(getattr(compression, "decompress", None)))


class DeferredHandle(Handle):
    """A handle over the collectives a compressor submitted; its result is computed once, on demand."""

    __slots__ = ("_finish",)

    def __init__(self, name: str, parts: list, finish):
        super().__init__(name, parts=parts)
        self._finish = finish

    def result(self):
        if self._finish is not None:
            finish, self._finish = self._finish, None
            try:
                self._result = finish()
            except BaseException as exc:
                self._error = exc
        if self._error is not None:
            raise self._error
        return self._result


def check(compression, output: np.ndarray, op: ReduceOp, algorithm, name: str) -> str:
    """Why this rank cannot run the request (an empty string when it can)."""
    if isinstance(compression, Compressor):
        if output.dtype != FLOAT32:
            return f"{name}: {compression!r} compresses float32 tensors, not {output.dtype}; pass compression=None"
        if op not in (Sum, Average):
            return f"{name}: {compression!r} reduces with Sum or Average, not {op.name}"
        if algorithm is not None:
            return f"{name}: algorithm= cannot be combined with {compression!r} (it chooses its own collectives)"
        return ""
    if not horovod_style(compression):
        return (f"{name}: compression must be Compression.none/.fp16/.bf16, a commlib compressor "
                f"(Compression.topk(...), ...), or an object with compress() and decompress(), not {compression!r}")
    return ""


def allreduce(compression, exchange: Exchange, array: np.ndarray, output: np.ndarray, inplace: bool,
              op: ReduceOp, name: str, prescale: float, postscale: float, reduce_async) -> Handle:
    """Start the request (validated by :func:`check`); the handle's result is ``output``.

    The caller hands the collectives: ``exchange`` (with a ``handles`` list that collects what it starts,
    the deferred handle's parts) for a commlib compressor, and ``reduce_async(array, op, name, prescale,
    postscale) -> handle`` for a Horovod-style one, whose result ``exchange.wait`` returns."""
    if isinstance(compression, Compressor):
        if prescale != 1.0:
            output *= np.float32(prescale)
        finish = compression.start(name, output, exchange)  # output (the caller's copy or array) is scratch
        scale = np.float32(postscale / (exchange.size if op is Average else 1))

        def done():
            finish()
            if scale != 1.0:
                np.multiply(output, scale, out=output)
            return output

        return DeferredHandle(name, exchange.handles, done)
    compressed, ctx = compression.compress(array)
    handle = reduce_async(np.asarray(compressed), op, name, prescale, postscale)

    def restore():
        result = np.asarray(compression.decompress(exchange.wait(handle), ctx))
        if inplace:
            output[...] = result
            return output
        return result

    return DeferredHandle(name, [handle], restore)
