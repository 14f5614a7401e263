"""HostStreams: the device path's stream interface on numpy arrays, for the CPU tests only.

commlib's device path (``commlib/coordinator/device_path.py``, ``commlib/transport/staged.py``) orders its
work with streams and events (``commlib/transport/streams.py`` documents the interface; ``CudaStreams``
implements it with CuPy). This module implements the same interface so that the CPU tests can run that
code through the real coordinator, over real MPI, and see whether every wait it relies on is there.
Nothing in the package imports it: it never replaces the CUDA path.

- "Device" memory is numpy arrays, and memory handed out by ``empty`` and ``pinned`` is filled with a
  poison pattern (NaN for floats), so a read of something not yet written shows in the result.
- Streams are lazy: what is queued on a stream runs only when something waits for it (the host through
  ``synchronize``, or another stream running a ``wait`` on one of its events), and then in queue order.
  A wait the device path forgot is therefore a wrong result, deterministically, not a race that a fast
  machine hides; so is a buffer reused while a queued copy still reads it.
- ``log`` lists every operation as it was queued (and ``synchronize`` as it was called), as
  ``(operation, stream name, detail)``, for tests of the schedule: which copies were queued before the
  host waited for the first one, which stream waited for which.

:class:`HostTensor` is a tensor on this simulated GPU: its values and the stream that produces them
(``produce`` queues a write there, the way a framework's kernel would).
"""

from __future__ import annotations

import contextlib
import itertools
import threading

import numpy as np

from ..dtypes import BFLOAT16


class Stream:
    """A queue of work that runs when waited for."""

    def __init__(self, name: str):
        self.name = name
        self.work: list = []   # callables, in queue order
        self.ran = 0           # how many have run

    def __repr__(self) -> str:
        return f"<stream {self.name}: {self.ran}/{len(self.work)} ran>"


class Event:
    """The point of a stream after its first ``position`` pieces of work."""

    def __init__(self, stream: Stream, position: int):
        self.stream = stream
        self.position = position

    @property
    def done(self) -> bool:
        return self.stream.ran >= self.position


class HostTensor:
    """A tensor on the simulated GPU: ``values`` (numpy, C-contiguous) produced on ``stream``."""

    def __init__(self, values: np.ndarray, stream: Stream):
        self.values = values
        self.stream = stream

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def shape(self):
        return self.values.shape


class HostStreams:
    """The stream interface (``commlib/transport/streams.py``) on numpy arrays, with lazy streams.

    ``gpu``: what :meth:`identity` says (the PCI address of "the" GPU), so that tests can give ranks
    GPUs of their own or one to share."""

    def __init__(self, gpu: tuple[int, int, int] = (0, 0, 0), index: int = 0):
        self.gpu = tuple(gpu)
        self.index = index
        self.log: list[tuple] = []
        self._names = itertools.count()
        self._lock = threading.RLock()  # lane threads and the test's thread run streams
        self._arrays: dict[int, np.ndarray] = {}   # address -> array (for a stand-in NCCL)
        self._streams: dict[int, Stream] = {}      # handle -> stream

    # ---- what the tests use ----------------------------------------------------------------------------

    def tensor(self, values, stream: Stream | None = None) -> HostTensor:
        """A tensor whose values are written by work queued on ``stream`` (a new one by default): until
        that stream runs, the memory holds poison."""
        values = np.asarray(values)
        stream = stream if stream is not None else self.new_stream("user")
        memory = _poisoned(values.shape, values.dtype)
        self.produce(stream, memory, values)
        return HostTensor(memory, stream)

    def produce(self, stream: Stream, target: np.ndarray, values) -> None:
        """Queue, on ``stream``, writing ``values`` into ``target`` (a framework's kernel)."""
        values = np.array(values, dtype=target.dtype, copy=True)
        self._queue(stream, ("produce", target.size), lambda: np.copyto(target, values))

    def read(self, tensor: HostTensor) -> np.ndarray:
        """What the framework would see reading ``tensor`` on its stream now (a copy)."""
        self.synchronize(self.record(tensor.stream))
        return tensor.values.copy()

    def array_at(self, pointer: int) -> np.ndarray:
        return self._arrays[pointer]

    def stream_at(self, handle: int) -> Stream:
        return self._streams[handle]

    def enqueue(self, stream: Stream, what: tuple, work) -> None:
        """Queue ``work`` (a callable) on ``stream``: for stand-ins of libraries that queue on streams."""
        self._queue(stream, what, work)

    # ---- the interface ----------------------------------------------------------------------------------

    def activate(self):
        return contextlib.nullcontext()

    def new_stream(self, name: str | None = None) -> Stream:
        return Stream(f"{name or 'stream'}{next(self._names)}")

    def user_stream(self, tensor: HostTensor) -> Stream:
        return tensor.stream

    def record(self, stream: Stream) -> Event:
        with self._lock:
            self.log.append(("record", stream.name, len(stream.work)))
            return Event(stream, len(stream.work))

    def wait(self, stream: Stream, event: Event) -> None:
        self._queue(stream, ("wait", event.stream.name, event.position),
                    lambda: self._run(event.stream, event.position))

    def synchronize(self, event: Event) -> None:
        with self._lock:
            self.log.append(("synchronize", event.stream.name, event.position))
            self._run(event.stream, event.position)

    def flat(self, tensor: HostTensor) -> np.ndarray:
        return tensor.values.reshape(-1)

    def empty(self, count: int, dtype) -> np.ndarray:
        return _poisoned((count,), _device_dtype(dtype))

    def pinned(self, count: int, dtype) -> np.ndarray:
        return _poisoned((count,), np.dtype(dtype))

    def result(self, like: HostTensor, buffer: np.ndarray, shape: tuple) -> HostTensor:
        values = buffer.reshape(shape)
        if np.dtype(like.dtype) == BFLOAT16 and values.dtype == np.uint16:
            values = values.view(BFLOAT16)
        return HostTensor(values, like.stream)

    def pack(self, stream: Stream, sources, factor: float, fused: np.ndarray) -> None:
        sources = list(sources)

        def run():
            offset = 0
            for source in sources:
                _convert(source, factor, fused[offset:offset + source.size])
                offset += source.size
        self._queue(stream, ("pack", len(sources), fused.size), run)

    def unpack(self, stream: Stream, fused: np.ndarray, factor: float, targets) -> None:
        targets = list(targets)

        def run():
            offset = 0
            for target in targets:
                _convert(fused[offset:offset + target.size], factor, target)
                offset += target.size
        self._queue(stream, ("unpack", len(targets), fused.size), run)

    def fill(self, stream: Stream, buffer: np.ndarray, value) -> None:
        self._queue(stream, ("fill", buffer.size), lambda: buffer.fill(value))

    def to_host(self, stream: Stream, device: np.ndarray, host: np.ndarray) -> None:
        self._queue(stream, ("to_host", device.nbytes), lambda: _copy_bytes(device, host))

    def to_device(self, stream: Stream, host: np.ndarray, device: np.ndarray) -> None:
        self._queue(stream, ("to_device", device.nbytes), lambda: _copy_bytes(host, device))

    def copy(self, stream: Stream, source: np.ndarray, target: np.ndarray) -> None:
        self._queue(stream, ("copy", source.nbytes), lambda: _copy_bytes(source, target))

    def pointer(self, buffer: np.ndarray) -> int:
        address = int(buffer.ctypes.data)
        self._arrays[address] = buffer
        return address

    def handle(self, stream: Stream) -> int:
        self._streams[id(stream)] = stream
        return id(stream)

    def identity(self) -> tuple[int, int, int]:
        return self.gpu

    # ---- running streams --------------------------------------------------------------------------------

    def _queue(self, stream: Stream, what: tuple, work) -> None:
        with self._lock:
            self.log.append((what[0], stream.name) + tuple(what[1:]))
            stream.work.append(work)

    def _run(self, stream: Stream, position: int) -> None:
        with self._lock:
            while stream.ran < position:
                work = stream.work[stream.ran]
                stream.ran += 1  # before running: a wait inside cannot come back to it
                work()


def _device_dtype(dtype) -> np.dtype:
    return np.dtype(np.uint16) if np.dtype(dtype) == BFLOAT16 else np.dtype(dtype)


def _poisoned(shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    array = np.empty(shape, dtype)
    if dtype.kind == "f" or dtype == BFLOAT16:
        array.fill(np.nan)
    else:
        array.view(np.uint8).fill(0xAB)
    return array


def _copy_bytes(source: np.ndarray, target: np.ndarray) -> None:
    if source.nbytes != target.nbytes:
        raise ValueError(f"copy of {source.nbytes} bytes into {target.nbytes}")
    target.reshape(-1).view(np.uint8)[...] = source.reshape(-1).view(np.uint8)


def _values(array: np.ndarray) -> np.ndarray:
    """The values of a device buffer (``uint16`` holds bfloat16's bits, as on the GPU)."""
    return array.view(BFLOAT16) if array.dtype == np.uint16 else array


def _convert(source: np.ndarray, factor: float, target: np.ndarray) -> None:
    """What the device kernels do: ``target = cast(source * factor)``, arithmetic in float32 (float64
    when either side is float64 or an integer), one rounding; a plain copy when nothing changes."""
    src, dst = _values(source.reshape(-1)), _values(target.reshape(-1))
    if factor == 1.0 and src.dtype == dst.dtype:
        np.copyto(dst, src)
        return
    wide = np.float64 if (np.float64 in (src.dtype, dst.dtype) or src.dtype.kind in "iub"
                          or dst.dtype.kind in "iub") else np.float32
    dst[...] = (src.astype(wide) * wide(factor)).astype(dst.dtype)
