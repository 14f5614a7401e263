"""One-bit compression (Seide et al. 2014; BytePS's ``onebit`` with scaling): each value travels as its
sign, and one float32 per tensor carries the mean magnitude. Use it with error feedback (the default of
``Compression.onebit``): the sign alone loses most of the gradient."""

from __future__ import annotations

import numpy as np

from .base import FLOAT32, MIN_ELEMENTS, DenseMessage, Encoder, Message


def gather_pays(bytes_per_rank: int, n: int, ranks: int) -> bool:
    """An allgather of ``bytes_per_rank`` from each rank against a ring allreduce of n float32:
    (ranks-1) * b received against 2 (ranks-1)/ranks * 4n."""
    return bytes_per_rank * ranks < 8 * n


class OneBitMessage(Message):
    """``scale * (+1 where bits are set, -1 elsewhere)`` for a tensor of ``n`` elements."""

    def __init__(self, n: int, bits: np.ndarray, scale: np.float32):
        self.n = n
        self.bits = bits
        self.scale = np.float32(scale)

    def signs(self) -> np.ndarray:
        return _signs(self.bits, self.n)

    def subtract_from(self, x):
        x -= self.scale * self.signs()

    def start(self, name, out, exchange):
        width = 4 + self.bits.size
        if not gather_pays(width, self.n, exchange.size):
            np.multiply(self.signs(), self.scale, out=out)
            return DenseMessage(out).start(name, out, exchange)
        payload = np.empty(width, np.uint8)
        payload[:4] = np.frombuffer(self.scale.tobytes(), np.uint8)
        payload[4:] = self.bits
        handle = exchange.allgather(payload, name)

        def finish():
            every = exchange.wait(handle).reshape(exchange.size, width)
            out[...] = 0.0
            for r in range(exchange.size):  # rank order: the same sums on every rank
                scale = every[r, :4].copy().view(np.float32)[0]
                np.add(out, scale * _signs(every[r, 4:], self.n), out=out)

        return finish


def _signs(bits: np.ndarray, n: int) -> np.ndarray:
    return np.unpackbits(bits, count=n).astype(FLOAT32) * 2.0 - 1.0


class OneBit(Encoder):
    """Signs plus the mean magnitude (so the message keeps the tensor's L1 norm)."""

    kind = "onebit"

    def __init__(self, min_elements: int = MIN_ELEMENTS):
        super().__init__(min_elements)

    def encode(self, name, flat):
        scale = np.float32(np.abs(flat).mean(dtype=np.float64)) if flat.size else np.float32(0)
        return OneBitMessage(flat.size, np.packbits(flat >= 0), scale)

    def __repr__(self):
        return "OneBit()"
