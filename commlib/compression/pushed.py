"""Lossy compressors through summation servers: what a worker pushes for one partition, and how the
server reads it back (BytePS's compressed push_pull). Nothing here imports MPI.

A worker encodes each partition of a float32 tensor with an :class:`~.base.Encoder` (top-k, random-k,
one-bit, with error feedback or momentum around them: state per tensor name and partition) and pushes
the encoded bytes; the server decodes every push to float32, sums them in float32 and answers every
worker with the dense float32 sum (see :func:`decode_into`). The answer is not compressed again: the
sum of several workers' sparse or sign vectors is neither sparse nor signs, so recompressing it would
need a second lossy step with error feedback at the server; the dense answer is exact (the same as
summing the decoded pushes) and the same bytes reach every worker.

Payload formats (``Push.codec`` names them; ``Push.count`` stays the partition's dense element count):

- ``"sparse"``: ``k`` int32 indices (ascending, unique) then ``k`` float32 values;
- ``"onebit"``: the float32 scale, then the signs packed 8 per byte (``np.packbits``; set: +scale).

A partition below the encoder's ``min_elements``, or one whose sparse form would not be smaller than
the dense float32 values (2k >= n), travels dense as an uncompressed push (its values as the encoder
left them, so that error feedback stays exact).
"""

from __future__ import annotations

import numpy as np

from .base import FLOAT32, DenseMessage, Encoder, SparseMessage
from .onebit import OneBitMessage

SPARSE, ONEBIT = "sparse", "onebit"

#: Why a compressor that is not an :class:`Encoder` cannot go through the servers.
NOT_AN_ENCODER = (
    "does not apply to summation servers: a server decodes each worker's push of one partition and sums "
    "them, which fits per-partition encoders (Compression.topk, .randomk, .onebit, with error_feedback or "
    "momentum around them) and the wire codecs (.fp16, .bf16); DGC and PowerSGD run their own collectives "
    "(PowerSGD two dependent rounds), and a Horovod-style compress()/decompress() object's output cannot be "
    "decoded by the server. Use one of those, or an allreduce algorithm for this compressor")


def why_not(compressor, dtype: np.dtype, op_name: str, name: str) -> str:
    """'' when ``compressor`` can push ``name`` (``dtype``, reduced with ``op_name``), else why not."""
    if not isinstance(compressor, Encoder):
        return f"{name}: {compressor!r} {NOT_AN_ENCODER}"
    if dtype != FLOAT32:
        return f"{name}: {compressor!r} compresses float32 tensors, not {dtype}; pass compression=None"
    if op_name not in ("SUM", "AVERAGE"):
        return f"{name}: {compressor!r} reduces with Sum or Average, not {op_name}"
    return ""


class PushEncoder:
    """Encodes the partitions of one push_pull with ``encoder`` (the user's object, which keeps the
    state: residuals under ``"<key>.<partition>"``)."""

    def __init__(self, encoder: Encoder):
        self.encoder = encoder

    def encode(self, key: str, part: int, flat: np.ndarray) -> tuple[np.ndarray | None, str]:
        """``(payload, codec)`` for partition ``part`` of ``key`` (``flat``: its float32 values, which the
        encoder may modify); ``(None, "")``: push ``flat`` itself, dense."""
        if flat.size < self.encoder.min_elements:
            return None, ""
        message = self.encoder.encode(f"{key}.{part}", flat)
        return payload(message, flat)


def payload(message, flat: np.ndarray) -> tuple[np.ndarray | None, str]:
    """The bytes that carry ``message`` (for the partition ``flat``) to a server, and their format."""
    if isinstance(message, SparseMessage):  # top-k, random-k (their positions travel too)
        k = message.indices.size
        if 2 * k >= flat.size:  # (index, value) pairs would be no smaller than the values: dense
            flat[...] = 0.0
            flat[message.indices] = message.values
            return None, ""
        out = np.empty(8 * k, np.uint8)
        out[:4 * k].view(np.int32)[:] = message.indices
        out[4 * k:].view(np.float32)[:] = message.values
        return out, SPARSE
    if isinstance(message, OneBitMessage):
        out = np.empty(4 + message.bits.size, np.uint8)
        out[:4].view(np.float32)[0] = message.scale
        out[4:] = message.bits
        return out, ONEBIT
    if isinstance(message, DenseMessage):
        if message.values is not flat:
            np.copyto(flat, message.values)
        return None, ""
    raise TypeError(f"a {type(message).__name__} cannot be pushed to a summation server")


def decode_into(codec: str, data: np.ndarray, out: np.ndarray, add: bool) -> None:
    """Decode a pushed partition (``data``: its bytes, uint8) into the float32 ``out`` (its dense
    length): ``out = values`` or, with ``add``, ``out += values``. Raises ValueError on a malformed
    payload (the server refuses the round, naming the worker)."""
    n = out.size
    if codec == SPARSE:
        if data.size % 8:
            raise ValueError(f"{data.size} bytes are not whole (int32 index, float32 value) pairs")
        k = data.size // 8
        indices = data[:4 * k].view(np.int32)
        values = data[4 * k:].view(np.float32)
        if k and (int(indices.min()) < 0 or int(indices.max()) >= n):
            raise ValueError(f"indices outside the partition's {n} elements")
        if not add:
            out[...] = 0.0
            out[indices] = values
        else:
            np.add.at(out, indices, values)  # indices are unique from a well-behaved worker; exact either way
        return
    if codec == ONEBIT:
        if data.size != 4 + (n + 7) // 8:
            raise ValueError(f"{data.size} bytes, not a scale and {n} packed signs ({4 + (n + 7) // 8} bytes)")
        scale = data[:4].view(np.float32)[0]
        signs = np.unpackbits(data[4:], count=n).astype(FLOAT32) * np.float32(2.0) - np.float32(1.0)
        if add:
            out += scale * signs
        else:
            np.multiply(signs, scale, out=out)
        return
    raise ValueError(f"unknown compressed format {codec!r}")
