"""The host-staged allreduce: device buffers through pinned host memory and the existing MPI algorithms.

MPI here is not CUDA-aware, so device memory reaches the network through the host. One call reduces a
list of device arrays of one dtype in place, as one fused buffer:

1. pack: every array into one device buffer, multiplied by the prescale factor and cast to the wire dtype
   by one kernel each (float16/bfloat16 on the wire halves the device-to-host copy as well);
2. copy the fused buffer to pinned host memory segment by segment on a copy stream, each segment with an
   event; the host waits for segment i's event and reduces it across ranks with the host algorithms
   (``reduce_host``, e.g. an :class:`~commlib.engine.Engine`) while the copies of the next segments run,
   then queues the copy of the reduced segment back on a second stream (the two directions use the GPU's
   two copy engines);
3. unpack: each array back from the fused buffer, multiplied by the postscale factor and cast back.

The operations of the pipeline sit behind a small interface: :class:`CudaOps` (CuPy: streams, events,
kernels) on a GPU; :class:`HostOps` runs the same pipeline on numpy arrays, synchronously. HostOps is what
the CPU tests run (packing, segmenting, scaling, casting and the MPI reduction are checked there); the
streams, events and kernels of CudaOps run only on a machine with a GPU.
"""

from __future__ import annotations

import ctypes
from typing import Callable, Sequence

import numpy as np

from ..dtypes import BFLOAT16, FLOAT16
from ..errors import CommlibError
from ..ops import ReduceOp
from .device_kernels import DeviceKernels, device_dtype

ReduceHost = Callable[[np.ndarray, ReduceOp], None]

DEFAULT_SEGMENT_BYTES = 4 << 20
_HALVES = (FLOAT16, BFLOAT16)


class HostOps:
    """The pipeline's operations on numpy arrays: every copy completes at once, so nothing overlaps."""

    def empty(self, count: int, dtype: np.dtype) -> np.ndarray:
        return np.empty(count, dtype)

    pinned = empty

    def scale_cast(self, src: np.ndarray, factor: float, dst: np.ndarray) -> None:
        """Like the device kernel: arithmetic in float32 (float64 if either side is), one rounding."""
        src = src.reshape(-1)
        if factor == 1.0 and src.dtype == dst.dtype:
            np.copyto(dst, src)
            return
        wide = np.float64 if np.float64 in (src.dtype, dst.dtype) else np.float32
        dst[...] = (src.astype(wide) * wide(factor)).astype(dst.dtype)

    def packed(self) -> None:
        pass

    def to_host(self, device: np.ndarray, host: np.ndarray):
        np.copyto(host, device)

    def to_device(self, host: np.ndarray, device: np.ndarray) -> None:
        np.copyto(device, host)

    def wait(self, token) -> None:
        pass

    def finish(self) -> None:
        pass

    def host_view(self, host: np.ndarray, dtype: np.dtype) -> np.ndarray:
        return host


class CudaOps:
    """The pipeline's operations on CuPy arrays of the current device: kernels on the current stream,
    device-to-host copies on one stream and host-to-device copies on another, ordered by events."""

    def __init__(self, cupy):
        import cupyx

        self.cupy = cupy
        self._cupyx = cupyx
        self.kernels = DeviceKernels(cupy)
        self._d2h = cupy.cuda.Stream(non_blocking=True)
        self._h2d = cupy.cuda.Stream(non_blocking=True)

    def empty(self, count: int, dtype: np.dtype):
        return self.cupy.empty(count, device_dtype(dtype))

    def pinned(self, count: int, dtype: np.dtype) -> np.ndarray:
        return self._cupyx.empty_pinned(count, device_dtype(dtype))

    def scale_cast(self, src, factor: float, dst) -> None:
        self.kernels.scale_cast(src.reshape(-1), factor, dst)

    def packed(self) -> None:
        """The copy stream waits for the packing kernels queued so far on the current stream."""
        self._d2h.wait_event(self.cupy.cuda.get_current_stream().record())

    def to_host(self, device, host: np.ndarray):
        device.data.copy_to_host_async(ctypes.c_void_p(host.ctypes.data), device.nbytes, self._d2h)
        return self._d2h.record()

    def to_device(self, host: np.ndarray, device) -> None:
        device.data.copy_from_host_async(ctypes.c_void_p(host.ctypes.data), device.nbytes, self._h2d)

    def wait(self, event) -> None:
        event.synchronize()

    def finish(self) -> None:
        """Wait until every copy back has landed (the pinned buffer may then be reused), and order the
        current stream (the unpacking kernels) after them."""
        done = self._h2d.record()
        done.synchronize()
        self.cupy.cuda.get_current_stream().wait_event(done)

    def host_view(self, host: np.ndarray, dtype: np.dtype) -> np.ndarray:
        return host.view(dtype)  # bfloat16 travels as uint16 on the device: the host reduces it as bfloat16


def segments(count: int, itemsize: int, segment_bytes: int) -> list[tuple[int, int]]:
    """[start, stop) element ranges of at most ``segment_bytes`` (at least one element) covering
    ``count`` elements; none for an empty buffer."""
    step = max(1, segment_bytes // itemsize)
    return [(start, min(start + step, count)) for start in range(0, count, step)]


def check_request(what: str, arrays: Sequence, op: ReduceOp, prescale: float, postscale: float,
                  wire) -> tuple[np.dtype, np.dtype]:
    """(dtype, wire dtype) of a fused allreduce of ``arrays``, or a clear error: one dtype for all, a
    half-precision wire only for float32, scaling and Average only for floating types."""
    dtype = np.dtype(arrays[0].dtype)
    if any(np.dtype(a.dtype) != dtype for a in arrays):
        raise CommlibError(f"{what}: the arrays of one call must share a dtype, got "
                           f"{sorted({str(a.dtype) for a in arrays})}")
    wire = dtype if wire is None else np.dtype(wire)
    if wire != dtype and (dtype != np.float32 or wire not in _HALVES):
        raise CommlibError(f"{what}: a {wire} wire needs float32 arrays, not {dtype}")
    if (prescale != 1.0 or postscale != 1.0 or op is ReduceOp.AVERAGE) and dtype.kind in "iub":
        raise CommlibError(f"{what}: scaling and Average need a floating dtype, not {dtype}")
    return dtype, wire


def scaling(op: ReduceOp, size: int, prescale: float, postscale: float, wire: np.dtype) -> tuple[float, float]:
    """(factor applied before, factor applied after) the reduction. Average becomes a Sum divided by
    ``size``: before the reduction when a half-precision wire could overflow, after it otherwise."""
    if op is not ReduceOp.AVERAGE:
        return prescale, postscale
    if wire in _HALVES:
        return prescale / size, postscale
    return prescale, postscale / size


class StagedAllreduce:
    """The host-staged allreduce of device arrays (see the module docstring).

    ``reduce_host(buffer, op)`` reduces a 1-D host buffer in place across ranks (e.g.
    ``engine.allreduce_``); it is called once per segment, in the same order on every rank. ``size`` is
    the number of ranks (for Average)."""

    def __init__(self, ops, reduce_host: ReduceHost, size: int, segment_bytes: int = DEFAULT_SEGMENT_BYTES):
        if segment_bytes < 1:
            raise CommlibError(f"segment_bytes must be positive, got {segment_bytes}")
        self.ops = ops
        self.reduce_host = reduce_host
        self.size = size
        self.segment_bytes = segment_bytes

    def allreduce_(self, arrays: Sequence, op: ReduceOp = ReduceOp.AVERAGE, prescale: float = 1.0,
                   postscale: float = 1.0, wire: np.dtype | None = None) -> None:
        """Reduce ``arrays`` (contiguous, one dtype) in place across ranks. ``wire`` (float16 or bfloat16)
        sends float32 arrays in half precision; the host then reduces the half-precision buffer."""
        if not arrays:
            return
        dtype, wire = check_request("staged allreduce", arrays, op, prescale, postscale, wire)
        before, after = scaling(op, self.size, prescale, postscale, wire)
        host_op = ReduceOp.SUM if op is ReduceOp.AVERAGE else op
        ops = self.ops
        counts = [int(a.size) for a in arrays]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(int).tolist()
        total = offsets[-1]
        direct = len(arrays) == 1 and wire == dtype and before == 1.0
        fused = arrays[0].reshape(-1) if direct else ops.empty(total, wire)
        if not direct:
            for array, start, stop in zip(arrays, offsets, offsets[1:]):
                ops.scale_cast(array, before, fused[start:stop])
        ops.packed()
        host = ops.pinned(total, wire)
        parts = segments(total, wire.itemsize, self.segment_bytes)
        copied = [ops.to_host(fused[a:b], host[a:b]) for a, b in parts]  # all queued: they run meanwhile
        for (a, b), token in zip(parts, copied):
            ops.wait(token)
            self.reduce_host(ops.host_view(host[a:b], wire), host_op)
            ops.to_device(host[a:b], fused[a:b])
        ops.finish()
        if not direct or after != 1.0:
            for array, start, stop in zip(arrays, offsets, offsets[1:]):
                ops.scale_cast(fused[start:stop], after, array.reshape(-1))


def for_engine(engine, ops=None, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> StagedAllreduce:
    """A staged allreduce whose host reductions run on ``engine`` (its algorithm choice, its lane).
    ``ops`` defaults to :class:`CudaOps` on CuPy (which must be installed)."""
    if ops is None:
        from ..device import cupy_module
        ops = CudaOps(cupy_module())
    return StagedAllreduce(ops, lambda buf, op: engine.allreduce_(buf, op), engine.size, segment_bytes)
