"""Transport over an mpi4py communicator. The only module of commlib's data path that imports MPI.

Data movement ignores element types: a buffer travels as unsigned integers of its item size (float16 and
bfloat16 as MPI_UINT16_T), or as bytes for other item sizes. Only ``allreduce_native_`` needs the real
type: the MPI type of the dtype's row in :mod:`commlib.dtypes`, and for float16, bfloat16 and bool (which
MPI has no standard sum for) user-defined MPI ops that call ``commlib.kernels.reduce_``. Those ops
are created on first use, kept by this transport and freed by :meth:`MPITransport.free`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from mpi4py import MPI

from .. import kernels
from ..dtypes import BY_NUMPY
from ..errors import CommlibError
from ..ops import ReduceOp
from .base import Transport

# Pure data movement: unsigned integers of the element's size.
_MOVE = {
    1: (np.dtype(np.uint8), MPI.UINT8_T),
    2: (np.dtype(np.uint16), MPI.UINT16_T),
    4: (np.dtype(np.uint32), MPI.UINT32_T),
    8: (np.dtype(np.uint64), MPI.UINT64_T),
}

_MPI_OPS = {ReduceOp.SUM: MPI.SUM, ReduceOp.MIN: MPI.MIN, ReduceOp.MAX: MPI.MAX, ReduceOp.PRODUCT: MPI.PROD}


def _raw(buf: np.ndarray) -> tuple[np.ndarray, MPI.Datatype, int]:
    """``buf`` as (array of unsigned ints, MPI type, elements of that type per element of ``buf``)."""
    if not buf.flags.c_contiguous or buf.ndim != 1:
        raise CommlibError(
            f"transport buffers must be 1-D and C-contiguous (shape: {buf.shape}, strides: {buf.strides})"
        )
    move = _MOVE.get(buf.dtype.itemsize)
    if move is not None and not buf.dtype.hasobject:
        return buf.view(move[0]), move[1], 1
    if buf.dtype.hasobject:
        raise CommlibError(f"cannot move arrays of Python objects (dtype {buf.dtype})")
    return buf.view(np.uint8), MPI.BYTE, buf.dtype.itemsize


def _spec(buf: np.ndarray) -> list:
    view, mpitype, _ = _raw(buf)
    return [view, mpitype]


def _vspec(buf: np.ndarray, counts: Sequence[int]) -> list:
    view, mpitype, factor = _raw(buf)
    counts = [int(c) * factor for c in counts]
    displs = np.concatenate(([0], np.cumsum(counts[:-1], dtype=np.int64))).tolist() if counts else []
    return [view, (counts, displs), mpitype]


def _half_op(dtype: np.dtype, op: ReduceOp) -> MPI.Op:
    def reduce_half(inbuf, inoutbuf, datatype):
        kernels.reduce_(np.frombuffer(inoutbuf, dtype=dtype), np.frombuffer(inbuf, dtype=dtype), op)

    return MPI.Op.Create(reduce_half, commute=True)


class MPITransport(Transport):
    """A :class:`Transport` over ``comm``, which it owns: :meth:`free` frees it (never a predefined
    communicator such as COMM_WORLD). Pass ``owns_comm=False`` to keep the communicator alive.

    Give each transport a communicator of its own (``MPITransport.duplicate(comm)``) so that its traffic
    never matches the application's or another lane's messages."""

    def __init__(self, comm: MPI.Comm, owns_comm: bool = True):
        self._comm = comm
        self._owns_comm = owns_comm
        self._rank = comm.Get_rank()
        self._size = comm.Get_size()
        self._half_ops: dict[tuple[np.dtype, ReduceOp], MPI.Op] = {}   # to free at the end
        self._native: dict = {}   # (dtype, op) -> function running MPI's Allreduce

    @classmethod
    def duplicate(cls, comm: MPI.Comm) -> "MPITransport":
        """A transport on a private duplicate of ``comm``, so its traffic never meets the caller's."""
        return cls(comm.Dup(), owns_comm=True)

    @property
    def comm(self) -> MPI.Comm:
        return self._comm

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def send(self, buf, dest, tag=0):
        self._comm.Send(_spec(buf), dest, tag)

    def recv(self, buf, source, tag=0):
        self._comm.Recv(_spec(buf), source, tag)

    def sendrecv(self, sendbuf, dest, recvbuf, source, tag=0):
        self._comm.Sendrecv(_spec(sendbuf), dest, tag, _spec(recvbuf), source, tag)

    def isend(self, buf, dest, tag=0):
        return self._comm.Isend(_spec(buf), dest, tag)

    def irecv(self, buf, source, tag=0):
        return self._comm.Irecv(_spec(buf), source, tag)

    def waitall(self, requests):
        MPI.Request.Waitall(list(requests))

    def allreduce_native_(self, buf, op):
        if buf.ndim != 1 or not buf.flags.c_contiguous:
            _raw(buf)  # raises the contiguity error
        self.native_allreducer(buf.dtype, ReduceOp(op).kernel_op)(buf)

    def native_allreducer(self, dtype, op):
        key = (dtype, op)
        run = self._native.get(key)
        if run is not None:
            return run
        allreduce, in_place = self._comm.Allreduce, MPI.IN_PLACE
        row = BY_NUMPY.get(dtype)
        if row is None:
            raise CommlibError(f"native allreduce cannot reduce dtype {dtype}")
        if row.mpi is None:  # reduced by commlib's C kernels, registered as an MPI op
            kernel_op = self._half_ops[key] = _half_op(dtype, op)
            move_dtype, move_type = _MOVE[dtype.itemsize]

            def run(buf):
                allreduce(in_place, [buf.view(move_dtype), move_type], kernel_op)
        else:
            mpitype = getattr(MPI, row.mpi)
            mpi_op = _MPI_OPS[op]

            def run(buf):
                allreduce(in_place, [buf, mpitype], mpi_op)
        self._native[key] = run
        return run

    def allgatherv(self, sendbuf, recvbuf, counts):
        if len(counts) != self._size:
            raise CommlibError(f"allgatherv needs one count per rank ({self._size}), got {len(counts)}")
        self._comm.Allgatherv(_spec(sendbuf), _vspec(recvbuf, counts))

    def bcast_(self, buf, root):
        self._comm.Bcast(_spec(buf), root)

    def alltoallv(self, sendbuf, sendcounts, recvbuf, recvcounts):
        if len(sendcounts) != self._size or len(recvcounts) != self._size:
            raise CommlibError(f"alltoallv needs one send and one receive count per rank ({self._size})")
        self._comm.Alltoallv(_vspec(sendbuf, sendcounts), _vspec(recvbuf, recvcounts))

    def barrier(self):
        self._comm.Barrier()

    def split(self, color, key):
        comm = self._comm.Split(MPI.UNDEFINED if color is None else int(color), int(key))
        if comm == MPI.COMM_NULL:
            return None
        return MPITransport(comm, owns_comm=True)

    def free(self):
        self._native.clear()
        if MPI.Is_finalized():  # nothing left to release
            self._half_ops.clear()
            return
        for mpi_op in self._half_ops.values():
            mpi_op.Free()
        self._half_ops.clear()
        predefined = self._comm in (MPI.COMM_NULL, MPI.COMM_WORLD, MPI.COMM_SELF)
        if self._owns_comm and not predefined:
            self._comm.Free()
        self._comm = MPI.COMM_NULL

    def __repr__(self):
        return f"MPITransport(rank={self._rank}, size={self._size})"
