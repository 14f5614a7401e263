"""The NCCL transport: allreduce of CuPy device arrays with NCCL, one GPU per rank (``cupy.cuda.nccl``).

Set up over MPI: rank 0 of the MPI communicator makes a unique id per lane, ``bcast`` gives it to every
rank, and each rank joins an ``NcclCommunicator`` on its GPU. Lanes are CUDA streams, ``num_streams`` of them (the
coordinator's ``COMMLIB_NUM_STREAMS`` lanes, once it drives this transport): lane i has its own
communicator and stream, so collectives on different lanes overlap. Each call orders its lane after the caller's current stream, and the caller's
stream after the lane (an event each way): the call returns at once, and kernels queued later on the
caller's stream see the result.

- :meth:`NcclTransport.allreduce_` reduces several arrays in one NCCL group call (the fused buffers of
  one response); ``wire=float16`` casts float32 on the device and reduces in float16. NCCL accumulates
  in the wire type (it has no float32 accumulation for float16 data), so each reduction step rounds to
  float16: the prescale divides first for Average so that the sum cannot overflow.
- :meth:`NcclTransport.hierarchical_allreduce_` follows Horovod's hierarchical allreduce: NCCL
  reduce-scatter among the ranks of a host, MPI allreduce of each rank's shard among the ranks with the
  same local rank (staged through pinned memory: MPI here is not CUDA-aware), NCCL allgather in the host.

``nccl_built()`` says whether this can run here. NCCL refuses two ranks of one communicator on the same
GPU, so with one GPU only the 1-rank path can be run; the multi-rank path is the same code.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..device import DeviceSupportError, cupy_module
from ..dtypes import BFLOAT16
from ..errors import CommlibError
from ..ops import ReduceOp
from .device_kernels import DeviceKernels, device_dtype
from .staged import check_request, scaling

# NCCL's ncclDataType_t and ncclRedOp_t (nccl.h); CuPy exports the same numbers as nccl.NCCL_*.
_NCCL_TYPES = {np.dtype(np.int8): 0, np.dtype(np.uint8): 1, np.dtype(np.int32): 2, np.dtype(np.int64): 4,
               np.dtype(np.float16): 6, np.dtype(np.float32): 7, np.dtype(np.float64): 8, BFLOAT16: 9}
_NCCL_OPS = {ReduceOp.SUM: 0, ReduceOp.PRODUCT: 1, ReduceOp.MAX: 2, ReduceOp.MIN: 3,
             ReduceOp.AVERAGE: 0}  # Average: a Sum, divided by the size on the device


def nccl_module():
    """``cupy.cuda.nccl`` when CuPy has NCCL, else a :class:`DeviceSupportError` saying what to install."""
    cupy_module()
    from cupy.cuda import nccl
    if not getattr(nccl, "available", True):
        raise DeviceSupportError("CuPy cannot load NCCL; install the NCCL wheel for your CUDA version: "
                                 "pip install 'commlib[cuda12]' or 'commlib[cuda13]' (nvidia-nccl-cu12/-cu13)")
    return nccl


def nccl_built() -> int:
    """NCCL's version code (e.g. 22703 for 2.27.3) when the NCCL transport can run here: CuPy imports,
    ``cupy.cuda.nccl`` loads NCCL, and a CUDA device is visible; else 0 (as Horovod's ``nccl_built``)."""
    try:
        nccl = nccl_module()
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return 0
        return int(nccl.get_version())
    except Exception:  # noqa: BLE001 - no CuPy, no NCCL, no driver: all mean "cannot run here"
        return 0


class NcclTransport:
    """NCCL communicators (one per lane) over the ranks of an MPI communicator, one GPU per rank."""

    def __init__(self, comm, num_streams: int = 1, device: int | None = None, local_comm=None):
        """``comm``: an mpi4py communicator (set-up and the cross-host step of the hierarchical
        allreduce). ``device``: this rank's GPU, by default its rank within its host modulo the number
        of GPUs. ``local_comm``: the ranks of this host (default: MPI's shared-memory split)."""
        from mpi4py import MPI

        self.cupy = cupy = cupy_module()
        self.nccl = nccl_module()
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._own_local = local_comm is None
        self.local_comm = comm.Split_type(MPI.COMM_TYPE_SHARED) if local_comm is None else local_comm
        self.local_rank, self.local_size = self.local_comm.Get_rank(), self.local_comm.Get_size()
        self.cross_comm = comm.Split(self.local_rank, self.rank)   # the ranks with this local rank
        count = cupy.cuda.runtime.getDeviceCount()
        if count < 1:
            raise DeviceSupportError("no CUDA device is visible to this process (CUDA_VISIBLE_DEVICES?)")
        self.device = cupy.cuda.Device(self.local_rank % count if device is None else device)
        self.kernels = DeviceKernels(cupy)
        self.lanes, self.local_lanes = [], []
        with self.device:
            for _ in range(num_streams):
                self.lanes.append(self._communicator(comm))
                self.local_lanes.append(self._communicator(self.local_comm))

    def _communicator(self, comm):
        uid = self.nccl.get_unique_id() if comm.Get_rank() == 0 else None
        uid = comm.bcast(uid, root=0)
        return (self.nccl.NcclCommunicator(comm.Get_size(), uid, comm.Get_rank()),
                self.cupy.cuda.Stream(non_blocking=True))

    def close(self) -> None:
        for nccl_comm, _ in self.lanes + self.local_lanes:
            nccl_comm.destroy()
        self.lanes, self.local_lanes = [], []
        self.cross_comm.Free()
        if self._own_local:
            self.local_comm.Free()

    # ---- stream ordering ------------------------------------------------------------------------------

    def _enter(self, stream) -> None:
        stream.wait_event(self.cupy.cuda.get_current_stream().record())

    def _leave(self, stream) -> None:
        self.cupy.cuda.get_current_stream().wait_event(stream.record())

    # ---- collectives ------------------------------------------------------------------------------------

    def allreduce_(self, arrays, op: ReduceOp = ReduceOp.AVERAGE, lane: int = 0, prescale: float = 1.0,
                   postscale: float = 1.0, wire: np.dtype | None = None) -> None:
        """Reduce CuPy arrays (contiguous, on this rank's GPU) in place across ranks, in one group call."""
        if not arrays:
            return
        _, sent_dtype = check_request("NCCL allreduce", arrays, op, prescale, postscale, wire)
        nccl_comm, stream = self.lanes[lane % len(self.lanes)]
        before, after = scaling(op, self.size, prescale, postscale, sent_dtype)
        self._enter(stream)
        with stream:
            sent = [self._wire_buffer(a, before, wire) for a in arrays]
            self.nccl.groupStart()
            try:
                for buf, ntype in sent:
                    if buf.size:
                        nccl_comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, ntype, _NCCL_OPS[op], stream.ptr)
            finally:
                self.nccl.groupEnd()
            for array, (buf, _) in zip(arrays, sent):
                if buf.data.ptr != array.data.ptr or after != 1.0:
                    self.kernels.scale_cast(buf, after, array.reshape(-1))
        self._leave(stream)

    def _wire_buffer(self, array, factor: float, wire):
        """(the buffer NCCL reduces for ``array``, its NCCL type): the array itself, or a scaled/cast copy."""
        _check(array, self.device.id)
        flat = array.reshape(-1)
        target = np.dtype(array.dtype) if wire is None else np.dtype(wire)
        ntype = _nccl_type(target)
        if target == array.dtype and factor == 1.0:
            return flat, ntype
        buf = self.cupy.empty(flat.size, device_dtype(target))
        self.kernels.scale_cast(flat, factor, buf)
        return buf, ntype

    def hierarchical_allreduce_(self, array, op: ReduceOp = ReduceOp.AVERAGE, lane: int = 0) -> None:
        """Reduce one CuPy array in place: NCCL inside the host, MPI between hosts (see the module)."""
        from mpi4py import MPI

        _check(array, self.device.id)
        check_request("hierarchical NCCL allreduce", [array], op, 1.0, 1.0, None)
        if np.dtype(array.dtype).kind == "f" and np.dtype(array.dtype).itemsize < 4:
            raise CommlibError(f"hierarchical NCCL allreduce: {array.dtype} cannot cross MPI here (no 16-bit "
                               "float MPI type); use float32/float64, or allreduce_ with wire=float16")
        nccl_comm, stream = self.local_lanes[lane % len(self.local_lanes)]
        flat = array.reshape(-1)
        shard = -(-flat.size // self.local_size)          # padded so that every local rank gets a shard
        padded = self.cupy.zeros(shard * self.local_size, flat.dtype)
        mine = self.cupy.empty(shard, flat.dtype)
        ntype, nop = _nccl_type(np.dtype(flat.dtype)), _NCCL_OPS[op]
        self._enter(stream)
        with stream:
            padded[:flat.size] = flat
            if shard:
                nccl_comm.reduceScatter(padded.data.ptr, mine.data.ptr, shard, ntype, nop, stream.ptr)
            if self.cross_comm.Get_size() > 1 and shard:
                host = self._pinned(shard, flat.dtype)
                mine.data.copy_to_host_async(ctypes.c_void_p(host.ctypes.data), mine.nbytes, stream)
                stream.synchronize()
                self.cross_comm.Allreduce(MPI.IN_PLACE, host, op=_MPI_OPS[op]())
                mine.data.copy_from_host_async(ctypes.c_void_p(host.ctypes.data), mine.nbytes, stream)
            if shard:
                nccl_comm.allGather(mine.data.ptr, padded.data.ptr, shard, ntype, stream.ptr)
            if op is ReduceOp.AVERAGE:
                self.kernels.scale_cast(padded[:flat.size], 1.0 / self.size, flat)
            else:
                flat[...] = padded[:flat.size]
            stream.synchronize()  # the pinned buffer and the temporaries stay valid until here
        self._leave(stream)

    def _pinned(self, count: int, dtype) -> np.ndarray:
        import cupyx
        return cupyx.empty_pinned(count, dtype)


def _mpi_op(name):
    def get():
        from mpi4py import MPI
        return getattr(MPI, name)
    return get


_MPI_OPS = {ReduceOp.SUM: _mpi_op("SUM"), ReduceOp.AVERAGE: _mpi_op("SUM"), ReduceOp.PRODUCT: _mpi_op("PROD"),
            ReduceOp.MAX: _mpi_op("MAX"), ReduceOp.MIN: _mpi_op("MIN")}


def _nccl_type(dtype: np.dtype) -> int:
    try:
        return _NCCL_TYPES[dtype]
    except KeyError:
        raise CommlibError(f"NCCL cannot reduce {dtype}; supported: "
                           f"{', '.join(str(d) for d in _NCCL_TYPES)}") from None


def _check(array, device_id: int) -> None:
    if not array.flags.c_contiguous:
        raise CommlibError(f"NCCL allreduce: array is not contiguous (shape: {array.shape}, strides: "
                           f"{array.strides}); pass cupy.ascontiguousarray(x)")
    if array.device.id != device_id:
        raise CommlibError(f"NCCL allreduce: array is on GPU {array.device.id}, this rank's communicator on "
                           f"GPU {device_id}")
