"""The contract every lossy compressor keeps, and the messages they send.

A :class:`Compressor` is one method (in the spirit of PyTorch's ``hook(state, bucket) -> Future``)::

    finish = compressor.start(name, buf, exchange)   # compress, submit the collective(s)
    finish()                                          # wait, decode: buf holds the float32 SUM over ranks

``buf`` is a float32 array holding this rank's tensor; the compressor may use it as scratch (no copy of
a large gradient is made), and after ``finish()`` it holds the sum over ranks, bit for bit the same on
every rank. ``exchange`` (:class:`Exchange`) gives the collectives a compressor may use. The caller
divides for Average. A compressor keeps its state (residuals, momenta, PowerSGD's P/Q, step counts) in
``self.state[name]``: per tensor name, so the same object serves every tensor of a model, survives a new
DistributedOptimizer around it, and ``reset()`` forgets it.

Most compressors only decide what one rank sends: an :class:`Encoder` turns a flat float32 array into a
:class:`Message` and inherits ``start``, which sends tensors below ``min_elements`` dense and exchanges the
message otherwise. Wrappers (error feedback, momentum: :mod:`.feedback`) are Encoders around an Encoder,
so they compose with any of them. A message knows how it travels:

- :class:`DenseMessage`: an allreduce (Sum).
- :class:`SparseMessage`: (index, value) pairs; one allgather of every rank's pairs, scattered into the
  dense sum in rank order (:mod:`.kernels`). When the pairs would move more bytes than the dense
  allreduce (k * ranks >= n), the message is densified and allreduced instead: same values, fewer bytes.
- :class:`SharedIndexMessage`: values at positions every rank chose identically (random-k with a shared
  seed): an allreduce of the k values only.

Agreement. Every exchange's first collective carries the tensor's own ``name``, so that a rank which
fails before submitting (wrong dtype) submits an error under that name and every rank gets it; later
collectives are named ``name + "." + suffix``. All choices that shape the collectives (dense or sparse,
k, rank r, warm-up phase) depend only on the tensor's size, the number of ranks and the step count, which
every rank shares.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..validation import check_parameter
from . import kernels

FLOAT32 = np.dtype(np.float32)

#: Tensors with fewer elements than this are sent dense by default (as Paddle's DGC and BytePS do):
#: their compression saves nothing worth its latency, and biases and norms are sensitive to it.
MIN_ELEMENTS = 1024

Finish = Callable[[], None]


class Exchange:
    """The collectives a compressor may use, handed to it by the caller (the API hands commlib's own: Sum
    over the ranks of ``process_set``, all by default; ``size`` and ``rank`` are within it), named per
    tensor. Subclasses provide the three methods; a test may hand a local one."""

    def __init__(self, size: int, rank: int, process_set=None):
        self.size = size
        self.rank = rank
        self.process_set = process_set

    def allreduce(self, array: np.ndarray, name: str):
        """Start summing ``array`` in place; returns a handle for :meth:`wait`."""
        raise NotImplementedError

    def allgather(self, array: np.ndarray, name: str):
        """Start concatenating every rank's ``array`` (rank order); returns a handle for :meth:`wait`."""
        raise NotImplementedError

    def wait(self, handle):
        """The handle's result, once every rank has contributed."""
        raise NotImplementedError


def sparse_pays(k: int, n: int, ranks: int) -> bool:
    """Whether an allgather of k (index, value) pairs per rank moves fewer bytes than a ring allreduce of n
    float32: (ranks-1) * 8k received against 2 (ranks-1)/ranks * 4n, i.e. k * ranks < n."""
    return k * ranks < n


class Message:
    """What one rank contributes to a tensor's sum."""

    def subtract_from(self, x: np.ndarray) -> None:
        """``x -= what this message carries`` (densely): error feedback keeps the rest."""
        raise NotImplementedError

    def start(self, name: str, out: np.ndarray, exchange: Exchange) -> Finish:
        """Submit the exchange; the returned function waits and writes the sum into the 1-D ``out``."""
        raise NotImplementedError


class DenseMessage(Message):
    """All of ``values``, allreduced (in place when ``values`` is ``out`` itself)."""

    def __init__(self, values: np.ndarray):
        self.values = values

    def subtract_from(self, x):
        x -= self.values

    def start(self, name, out, exchange):
        handle = exchange.allreduce(self.values, name)

        def finish():
            exchange.wait(handle)
            if self.values is not out:
                np.copyto(out, self.values)

        return finish


class SparseMessage(Message):
    """``values`` at ``indices`` (int32, ascending) of a tensor of ``n`` elements."""

    def __init__(self, n: int, indices: np.ndarray, values: np.ndarray):
        self.n = n
        self.indices = indices
        self.values = values

    def subtract_from(self, x):
        x[self.indices] -= self.values

    def start(self, name, out, exchange):
        k = self.indices.size
        if not sparse_pays(k, self.n, exchange.size):
            out[...] = 0.0
            out[self.indices] = self.values
            return DenseMessage(out).start(name, out, exchange)
        # One allgather of [indices | values] per rank (values viewed as int32): one collective, one name.
        pairs = np.empty(2 * k, np.int32)
        pairs[:k] = self.indices
        pairs[k:] = self.values.view(np.int32)
        handle = exchange.allgather(pairs, name)

        def finish():
            every = exchange.wait(handle).reshape(exchange.size, 2, k)
            out[...] = 0.0
            for r in range(exchange.size):  # rank order: the same float32 sums on every rank
                kernels.scatter_add(out, every[r, 0], every[r, 1].view(np.float32))

        return finish


class SharedIndexMessage(SparseMessage):
    """``values`` at ``indices`` that every rank chose identically: only the values travel."""

    def start(self, name, out, exchange):
        handle = exchange.allreduce(self.values, name)

        def finish():
            summed = exchange.wait(handle)
            out[...] = 0.0
            out[self.indices] = summed

        return finish


class Compressor:
    """The contract (module docstring): ``start(name, grad, exchange) -> finish``; state per name."""

    #: The class's short name, used in ``repr`` and the timeline.
    kind = "compressor"

    #: True when the compressor applies momentum itself, so that what it returns is a velocity (DGC, the
    #: momentum wrapper, and any wrapper around one of them): the optimizer it feeds must then run without
    #: momentum of its own, or momentum is applied twice (framework optimizers refuse the combination).
    applies_momentum = False

    def __init__(self):
        self.state: dict[str, dict] = {}

    def start(self, name: str, buf: np.ndarray, exchange: Exchange) -> Finish:
        raise NotImplementedError

    def state_of(self, name: str) -> dict:
        """This tensor's state (created empty on first use)."""
        state = self.state.get(name)
        if state is None:
            state = self.state[name] = {}
        return state

    def reset(self) -> None:
        """Forget every tensor's state (residuals, momenta, step counts)."""
        self.state.clear()


def dense_start(name: str, buf: np.ndarray, exchange: Exchange) -> Finish:
    """Allreduce ``buf`` as it is, in place."""
    flat = buf.reshape(-1)
    return DenseMessage(flat).start(name, flat, exchange)


class Encoder(Compressor):
    """A compressor that decides one :class:`Message` per tensor; tensors below ``min_elements`` go dense."""

    def __init__(self, min_elements: int = MIN_ELEMENTS):
        super().__init__()
        self.min_elements = check_parameter(min_elements, "min_elements", self.kind, integer=True, low=0)

    def encode(self, name: str, flat: np.ndarray) -> Message:
        """The message for the 1-D float32 ``flat`` (which the encoder may modify or send as it is)."""
        raise NotImplementedError

    def start(self, name, buf, exchange):
        if buf.size < self.min_elements:
            return dense_start(name, buf, exchange)
        flat = buf.reshape(-1)
        return self.encode(name, flat).start(name, flat, exchange)

    def inner_encoders(self) -> list["Encoder"]:
        return []

    @property
    def applies_momentum(self) -> bool:
        """A wrapper applies momentum when what it wraps does."""
        return any(inner.applies_momentum for inner in self.inner_encoders())

    def reset(self) -> None:
        super().reset()
        for inner in self.inner_encoders():
            inner.reset()
