"""What a tensor is and where it lives: numpy arrays, CuPy arrays, torch tensors on the CPU or on CUDA.

A tensor is recognised by the protocols it offers, never by importing its library: ``__dlpack_device__()``
(DLPack; numpy, CuPy and torch all offer it) says which device holds the memory, and
``__cuda_array_interface__`` (CuPy, torch CUDA, Numba, ...) marks CUDA memory for objects without DLPack.
So ``import commlib`` never imports CuPy or torch; CuPy is imported only when a device tensor arrives.

The device *kind* ("cpu" or "cuda") is part of every request's metadata and must agree between ranks (a
CPU tensor on one rank and a GPU tensor on another fails on every rank). The device *index* may differ:
each rank usually drives its own GPU.

A device tensor goes to the coordinator as a :class:`DeviceTensor`: the tensor, a flat view of its memory,
and an event recorded on the stream that produced it (the stream interface, :mod:`commlib.transport.streams`,
records it), so that the coordinator's lane reads it only once it is there. The lane leaves in ``done`` the
event after which the result is there, and :class:`DeviceHandle` makes the caller's stream wait for it when
the caller synchronizes: no host synchronization on either side, nothing read early.

:class:`Staged` is the older whole-tensor trip through pinned host memory, left for what reduces on the host
only (the lossy compressors of commlib.compression and the summation servers' push_pull).
"""

from __future__ import annotations

import numpy as np

from .coordinator.requests import Handle
from .errors import CommlibError

CPU = "cpu"
CUDA = "cuda"
UNSUPPORTED = "unsupported"  # the device kind of a request whose tensor lives where commlib cannot reach

# DLPack device types (dlpack.h: DLDeviceType).
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13

INSTALL_HINT = ("install CuPy for your CUDA version: pip install 'commlib[cuda12]' (CUDA 12.x) or "
                "'commlib[cuda13]' (CUDA 13.x)")


class DeviceSupportError(CommlibError):
    """A tensor lives on a device that commlib cannot reach in this environment (no CuPy, no GPU visible,
    or a device type commlib has no path for)."""


def placement(obj) -> tuple[str, int]:
    """(kind, device index) of ``obj``'s memory: ("cpu", 0) for host memory (including CUDA pinned host
    memory), ("cuda", i) for CUDA device or managed memory (i = -1 when only ``__cuda_array_interface__``
    says so, which names no device). Raises :class:`DeviceSupportError` for any other device."""
    if isinstance(obj, np.ndarray):
        return CPU, 0
    dlpack_device = getattr(obj, "__dlpack_device__", None)
    if dlpack_device is not None:
        try:
            device_type, index = dlpack_device()
        except (AttributeError, TypeError, RuntimeError, BufferError):
            pass  # e.g. a torch tensor on a device DLPack cannot name: decided below
        else:
            device_type = int(device_type)
            if device_type in (_DL_CPU, _DL_CUDA_HOST):
                return CPU, 0
            if device_type in (_DL_CUDA, _DL_CUDA_MANAGED):
                return CUDA, int(index)
            raise DeviceSupportError(f"{type(obj).__name__} lives on DLPack device type {device_type}; "
                                     "commlib communicates host memory and CUDA device memory only")
    if _cuda_interface(obj) is not None:
        return CUDA, -1
    device = getattr(obj, "device", None)
    device_type = getattr(device, "type", None)  # a torch tensor whose device DLPack did not name
    if isinstance(device_type, str) and device_type != CPU:
        raise DeviceSupportError(f"{type(obj).__name__} lives on {device}; commlib communicates host memory "
                                 "and CUDA device memory only")
    return CPU, 0


def on_device(obj) -> bool:
    """True when ``obj`` is not a numpy array and its memory is not on the host (or on a device commlib
    cannot reach: :class:`Staged` turns that into an error every rank sees)."""
    if isinstance(obj, np.ndarray):
        return False
    try:
        return placement(obj)[0] != CPU
    except DeviceSupportError:
        return True


def _cuda_interface(obj) -> dict | None:
    """``obj.__cuda_array_interface__``, or None (torch raises for CPU tensors and for bfloat16)."""
    try:
        return getattr(obj, "__cuda_array_interface__", None)
    except (AttributeError, TypeError, RuntimeError):
        return None


def is_torch(obj) -> bool:
    """Whether ``obj`` is a torch tensor (read from its type: torch is not imported for it)."""
    return type(obj).__module__.startswith("torch")


def declared_layout(obj) -> tuple[np.dtype, tuple]:
    """(numpy dtype, shape) a device tensor declares, read without touching its memory or importing its
    library. bfloat16 is ``ml_dtypes.bfloat16``."""
    if is_torch(obj):  # torch is loaded already: the object is one of its tensors
        from .dtypes import BFLOAT16
        name = str(obj.dtype).replace("torch.", "")
        return (BFLOAT16 if name == "bfloat16" else np.dtype(name)), tuple(obj.shape)
    interface = _cuda_interface(obj)
    if interface is not None:
        return np.dtype(interface["typestr"]), tuple(interface["shape"])
    return np.dtype(str(obj.dtype)), tuple(obj.shape)


def cupy_module():
    """The ``cupy`` module, or a :class:`DeviceSupportError` saying what to install."""
    try:
        import cupy
    except ImportError as exc:
        raise DeviceSupportError(f"CuPy is not installed ({exc}); {INSTALL_HINT}") from None
    return cupy


def cuda_built() -> bool:
    """True when commlib can communicate CUDA tensors here: CuPy imports and at least one CUDA device is
    visible to this process. (Horovod answers whether it was compiled with CUDA; commlib has nothing to
    compile for CUDA, so it answers whether the GPU path can run now.)"""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: all mean "cannot run here"
        return False


def as_cupy(obj):
    """A CuPy array sharing ``obj``'s device memory (no copy): CuPy arrays as they are, others through
    ``__cuda_array_interface__`` (which also orders CuPy after the producer's stream); torch bfloat16, which
    that interface cannot describe, as its 16-bit pattern, viewed as ``uint16``."""
    cupy = cupy_module()
    if isinstance(obj, cupy.ndarray):
        return obj
    if is_torch(obj):
        obj = obj.detach()  # the interface refuses tensors that require grad; the memory is the same
        if str(obj.dtype) == "torch.bfloat16":
            import torch
            return cupy.asarray(obj.view(torch.int16)).view(cupy.uint16)
    if _cuda_interface(obj) is not None:
        return cupy.asarray(obj)
    return cupy.from_dlpack(obj)


def _like_input(obj, device_array):
    """``device_array`` (CuPy) returned in the input's kind: a torch tensor for torch, else CuPy."""
    if not is_torch(obj):
        return device_array
    import torch
    if device_array.dtype == np.uint16 and str(obj.dtype) == "torch.bfloat16":
        return torch.from_dlpack(device_array.view(np.int16)).view(torch.bfloat16)
    return torch.from_dlpack(device_array)


class DeviceTensor:
    """One device tensor of a request: ``tensor`` as the caller passed it, ``flat`` a 1-D view of its memory
    (in the stream interface's array type), ``dtype`` (numpy; bfloat16 as ``ml_dtypes.bfloat16``) and
    ``shape``, ``streams`` the stream interface of its GPU, ``ready`` the event after which its values are
    there, and, once the collective has been queued, ``done``: the event after which the result is."""

    __slots__ = ("tensor", "streams", "flat", "dtype", "shape", "ready", "done")

    def __init__(self, tensor, streams, flat, dtype: np.dtype, shape: tuple, ready=None):
        self.tensor = tensor
        self.streams = streams
        self.flat = flat
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.ready = ready
        self.done = None

    @classmethod
    def submitted(cls, tensor, streams) -> "DeviceTensor":
        """``tensor`` as submitted now, by this thread: ready once the stream its library queues work on
        in this thread has run what it holds now."""
        dtype, shape = declared_layout(tensor)
        return cls(tensor, streams, streams.flat(tensor), dtype, shape, streams.record(streams.user_stream(tensor)))

    def like(self) -> "DeviceTensor":
        """A new tensor of the same library, dtype, shape and GPU (the output of an out-of-place call)."""
        buffer = self.streams.empty(int(np.prod(self.shape, dtype=np.int64)), self.dtype)
        return DeviceTensor(self.streams.result(self.tensor, buffer, self.shape), self.streams, buffer, self.dtype,
                            self.shape)

    def consumed(self):
        """The caller's tensor, with the stream its library queues work on in this thread ordered after
        ``done``: what the caller queues next sees the result."""
        if self.done is not None:
            self.streams.wait(self.streams.user_stream(self.tensor), self.done)
        return self.tensor


class DeviceHandle(Handle):
    """The handle of a device request: the inner handle's result (a :class:`DeviceTensor`, or alltoall's
    (DeviceTensor, splits)) becomes the caller's tensor, consumed by the caller's stream (see
    :meth:`DeviceTensor.consumed`), once, in the thread that asks for it."""

    __slots__ = ("_finished",)

    def __init__(self, inner: Handle):
        super().__init__(inner.name, parts=[inner])
        self._finished = None

    def result(self):
        if self._finished is None:
            result = self._parts[0].result()
            if isinstance(result, tuple):
                result = (result[0].consumed(),) + result[1:]
            elif isinstance(result, DeviceTensor):
                result = result.consumed()
            self._finished = (result,)
        return self._finished[0]


class Staged:
    """One device tensor's trip through the host for one collective.

    ``host`` is what the host algorithms see: a pinned copy of the tensor (or, when the tensor cannot be
    staged here, a placeholder with the declared dtype and shape, and ``error`` saying why, so that the
    request fails on every rank instead of leaving the others waiting). :meth:`finish` turns the host
    result into the caller's result on the device: written back into the tensor for in-place calls, a new
    tensor of the input's library otherwise."""

    def __init__(self, tensor, name: str):
        self.tensor = tensor
        self.kind, self.index = UNSUPPORTED, -1
        self.error = ""
        self._device = None
        try:
            self.kind, self.index = placement(tensor)
            self._device = as_cupy(tensor)
            if not self._device.flags.c_contiguous:
                raise DeviceSupportError(
                    f"buffer is not contiguous (shape: {self._device.shape}, strides: {self._device.strides}); "
                    "pass cupy.ascontiguousarray(x) or tensor.contiguous()")
            self.host = _pinned_copy(self._device)
            if self._device.dtype == np.uint16 and declared_layout(tensor)[0] != np.uint16:
                from .dtypes import BFLOAT16
                self.host = self.host.view(BFLOAT16)
        except (DeviceSupportError, ImportError, TypeError, ValueError) as exc:
            try:
                dtype, shape = declared_layout(tensor)
            except (AttributeError, TypeError, ValueError):
                dtype, shape = np.dtype(np.uint8), (0,)
            where = f"{self.kind}:{self.index}" if self.index >= 0 else self.kind
            self.error = f"{name}: the tensor lives on {where} and cannot be staged: {exc}"
            self.host = np.zeros(shape, dtype)

    def finish(self, result, inplace: bool):
        """The device result for the host ``result`` (an array, or alltoall's (array, splits))."""
        if isinstance(result, tuple):
            return (self.finish(result[0], inplace),) + result[1:]
        if result is None:
            return None
        device = self._device
        raw = result.view(device.dtype) if result.dtype.itemsize == device.dtype.itemsize else result
        cupy = cupy_module()
        if inplace and raw.shape == device.shape:
            device.set(raw)
            out = self.tensor
        else:
            out = _like_input(self.tensor, cupy.asarray(raw))
        # The copy may run asynchronously from pinned memory: done before the host buffer can be reused.
        cupy.cuda.get_current_stream().synchronize()
        return out

    def handle(self, inner: Handle, inplace: bool) -> Handle:
        return StagedHandle(inner, self, inplace)


class StagedHandle(Handle):
    """A handle whose result is copied back to the device on first access (by ``synchronize``)."""

    __slots__ = ("_staged", "_inplace", "_finished")

    def __init__(self, inner: Handle, staged: Staged, inplace: bool):
        super().__init__(inner.name, parts=[inner])
        self._staged = staged
        self._inplace = inplace
        self._finished = None

    def result(self):
        if self._finished is None:
            self._finished = (self._staged.finish(self._parts[0].result(), self._inplace),)
        return self._finished[0]


def _pinned_copy(device_array) -> np.ndarray:
    """A copy of ``device_array`` in page-locked host memory (from CuPy's pinned pool, so repeated calls
    reuse blocks). Synchronous: the copy is complete when this returns."""
    import cupyx
    host = cupyx.empty_pinned(device_array.shape, device_array.dtype)
    device_array.get(out=host)
    return host
