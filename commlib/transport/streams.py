"""Streams and events: the interface the device path orders its work with, and its CUDA implementation.

The device path (:mod:`commlib.coordinator.device_path`, :mod:`.staged`, :mod:`.nccl`) never calls CUDA
itself. It asks a *streams* object, one per GPU, for these operations; every one that takes a stream is
queued on that stream and returns at once, unless it says otherwise:

- ``activate()``: a context manager making this GPU current in the calling thread (lane threads need it);
- ``new_stream()``: a stream of its own (each lane has a compute stream and two copy streams);
- ``user_stream(tensor)``: the stream ``tensor``'s library queues work on now, in the calling thread
  (torch's current stream for a torch tensor, CuPy's current stream otherwise): what produced the
  tensor's values, and what will read the result;
- ``record(stream) -> event``; ``wait(stream, event)`` (later work on ``stream`` waits for ``event``, on
  the GPU); ``synchronize(event)`` (the host waits; the only blocking call);
- ``flat(tensor)``: a 1-D view of a contiguous device tensor (no copy; bfloat16 as its 16-bit pattern);
  ``empty(count, dtype)`` on the device; ``pinned(count, dtype)``: page-locked host memory, a numpy array
  of ``dtype``; ``result(like, buffer, shape)``: ``buffer`` as a tensor of ``like``'s library;
- ``pack(stream, sources, factor, fused)``: every source, times ``factor`` and cast to ``fused``'s dtype,
  one after another into ``fused``, in one kernel; ``unpack(stream, fused, factor, targets)`` the reverse;
  ``fill(stream, buffer, value)``;
- ``to_host(stream, device, host)``, ``to_device(stream, host, device)``, ``copy(stream, source, target)``;
- ``pointer(buffer)`` and ``handle(stream)``: the raw addresses NCCL takes; ``identity()``: which physical
  GPU this is (PCI domain, bus, device), equal for two ranks that share it.

:class:`CudaStreams` implements them with CuPy. ``commlib.testing.streams.HostStreams`` implements the
same interface on numpy arrays, with streams that run only when something waits for them, so that the
CPU tests can check the grouping, the segment schedule and every event the device path relies on; it is
for the tests only, and nothing in the package imports it.

One ``CudaStreams`` per GPU per process (:func:`cuda_streams`), made on first use: it holds no state of
a job (streams belong to the lanes that make them), only CuPy and the compiled kernels.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ..device import as_cupy, cupy_module, declared_layout, is_torch
from ..dtypes import BFLOAT16
from .device_kernels import DeviceKernels, device_dtype


class CudaStreams:
    """The stream interface (module docstring) on CuPy, for GPU ``index`` of this process."""

    def __init__(self, cupy, index: int):
        self.cupy = cupy
        self.index = index
        self.kernels = DeviceKernels(cupy)

    def activate(self):
        return self.cupy.cuda.Device(self.index)

    # ---- streams and events ------------------------------------------------------------------------------

    def new_stream(self):
        with self.cupy.cuda.Device(self.index):
            return self.cupy.cuda.Stream(non_blocking=True)

    def user_stream(self, tensor):
        if is_torch(tensor):
            import torch

            current = torch.cuda.current_stream(tensor.device)
            return self.cupy.cuda.ExternalStream(current.cuda_stream, self.index)
        with self.cupy.cuda.Device(self.index):
            return self.cupy.cuda.get_current_stream()

    def record(self, stream):
        event = self.cupy.cuda.Event(disable_timing=True)
        stream.record(event)
        return event

    def wait(self, stream, event) -> None:
        stream.wait_event(event)

    def synchronize(self, event) -> None:
        event.synchronize()

    # ---- memory ------------------------------------------------------------------------------------------

    def flat(self, tensor):
        """A 1-D CuPy view of ``tensor``'s memory. A torch tensor is viewed from its data pointer (not
        through ``__cuda_array_interface__``, whose stream handshake would block the caller until the
        producing stream is done: the device path waits for it with an event instead)."""
        if is_torch(tensor):
            dtype = np.dtype(np.uint16) if str(tensor.dtype) == "torch.bfloat16" else declared_layout(tensor)[0]
            count = tensor.numel()
            memory = self.cupy.cuda.UnownedMemory(tensor.data_ptr(), count * dtype.itemsize, tensor, self.index)
            return self.cupy.ndarray((count,), dtype, self.cupy.cuda.MemoryPointer(memory, 0))
        return as_cupy(tensor).reshape(-1)

    def empty(self, count: int, dtype: np.dtype):
        with self.cupy.cuda.Device(self.index):
            return self.cupy.empty(count, device_dtype(dtype))

    def pinned(self, count: int, dtype: np.dtype) -> np.ndarray:
        import cupyx

        host = cupyx.empty_pinned(count, device_dtype(dtype))
        return host.view(BFLOAT16) if np.dtype(dtype) == BFLOAT16 else host

    def result(self, like, buffer, shape: tuple):
        """``buffer`` (CuPy, 1-D) reshaped to ``shape``, as a tensor of ``like``'s library (no copy)."""
        shaped = buffer.reshape(shape)
        if not is_torch(like):
            return shaped
        import torch

        if str(like.dtype) == "torch.bfloat16":
            return torch.from_dlpack(shaped.view(np.int16)).view(torch.bfloat16)
        return torch.from_dlpack(shaped)

    # ---- work on a stream ----------------------------------------------------------------------------------

    def pack(self, stream, sources, factor: float, fused) -> None:
        with stream:
            self.kernels.pack(sources, factor, fused)

    def unpack(self, stream, fused, factor: float, targets) -> None:
        with stream:
            self.kernels.unpack(fused, factor, targets)

    def fill(self, stream, buffer, value) -> None:
        with stream:
            buffer.fill(value)

    def to_host(self, stream, device, host: np.ndarray) -> None:
        if device.nbytes:
            device.data.copy_to_host_async(ctypes.c_void_p(host.ctypes.data), device.nbytes, stream)

    def to_device(self, stream, host: np.ndarray, device) -> None:
        if device.nbytes:
            device.data.copy_from_host_async(ctypes.c_void_p(host.ctypes.data), device.nbytes, stream)

    def copy(self, stream, source, target) -> None:
        if source.nbytes:
            target.data.copy_from_device_async(source.data, source.nbytes, stream)

    # ---- what NCCL takes ----------------------------------------------------------------------------------

    def pointer(self, buffer) -> int:
        return int(buffer.data.ptr)

    def handle(self, stream) -> int:
        return int(stream.ptr)

    def identity(self) -> tuple[int, int, int]:
        props = self.cupy.cuda.runtime.getDeviceProperties(self.index)
        return int(props["pciDomainID"]), int(props["pciBusID"]), int(props["pciDeviceID"])


@functools.lru_cache(maxsize=None)
def cuda_streams(index: int) -> CudaStreams:
    """The :class:`CudaStreams` of GPU ``index`` (CuPy must be installed: else the error says what to
    install)."""
    return CudaStreams(cupy_module(), index)
