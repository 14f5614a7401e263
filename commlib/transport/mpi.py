"""Transport over an mpi4py communicator. The only module of commlib's data path that imports MPI.

Data movement ignores element types: a buffer travels as unsigned integers of its item size (float16 and
bfloat16 as MPI_UINT16_T), or as bytes for other item sizes. Only ``allreduce_native_`` needs the real
type: the MPI type of the dtype's row in :mod:`commlib.dtypes` (bool with MPI's logical ops), and for
float16 and bfloat16 (which MPI has no standard reduction for) user-defined MPI ops that call
``commlib.kernels.reduce_``. Those ops
are created on first use, kept by this transport and freed by :meth:`MPITransport.free`.

Nothing here blocks inside MPI: every call is MPI's nonblocking variant, waited for by the transport's
:class:`~.deadline.Deadline` (a timeout, after which it raises ``PeerLostError`` naming the peers; see
:mod:`.deadline`).
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
from .deadline import Deadline

# Pure data movement: unsigned integers of the element's size.
_MOVE = {
    1: (np.dtype(np.uint8), MPI.UINT8_T),
    2: (np.dtype(np.uint16), MPI.UINT16_T),
    4: (np.dtype(np.uint32), MPI.UINT32_T),
    8: (np.dtype(np.uint64), MPI.UINT64_T),
}

_MPI_OPS = {ReduceOp.SUM: MPI.SUM, ReduceOp.MIN: MPI.MIN, ReduceOp.MAX: MPI.MAX, ReduceOp.PRODUCT: MPI.PROD}
# bool reduces as numpy reduces it: Sum and Max are a logical or, Product and Min a logical and.
_BOOL_OPS = {ReduceOp.SUM: MPI.LOR, ReduceOp.MIN: MPI.LAND, ReduceOp.MAX: MPI.LOR, ReduceOp.PRODUCT: MPI.LAND}


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


class KernelOps:
    """User-defined MPI ops that reduce with commlib's kernels (the half types), one per (dtype, op),
    shared by every transport of a runtime: mpi4py allows only 32 user-defined ops at once, and each
    process set and lane has transports of its own. ``free`` releases them."""

    def __init__(self):
        self._ops: dict[tuple[np.dtype, ReduceOp], MPI.Op] = {}

    def get(self, dtype: np.dtype, op: ReduceOp) -> MPI.Op:
        mpi_op = self._ops.get((dtype, op))
        if mpi_op is None:
            def reduce_half(inbuf, inoutbuf, datatype):
                kernels.reduce_(np.frombuffer(inoutbuf, dtype=dtype), np.frombuffer(inbuf, dtype=dtype), op)

            mpi_op = self._ops[(dtype, op)] = MPI.Op.Create(reduce_half, commute=True)
        return mpi_op

    def free(self) -> None:
        if not MPI.Is_finalized():
            for mpi_op in self._ops.values():
                mpi_op.Free()
        self._ops.clear()


class MPITransport(Transport):
    """A :class:`Transport` over ``comm``, which it owns: :meth:`free` frees it (never a predefined
    communicator such as COMM_WORLD). Pass ``owns_comm=False`` to keep the communicator alive.

    Give each transport a communicator of its own (``MPITransport.duplicate(comm)``) so that its traffic
    never matches the application's or another lane's messages."""

    def __init__(self, comm: MPI.Comm, owns_comm: bool = True, kernel_ops: KernelOps | None = None,
                 deadline: Deadline | None = None):
        self._comm = comm
        self.deadline = deadline if deadline is not None else Deadline()
        self._owns_comm = owns_comm
        self._rank = comm.Get_rank()
        self._size = comm.Get_size()
        self._owns_ops = kernel_ops is None   # else shared: the runtime frees them
        self._kernel_ops = kernel_ops if kernel_ops is not None else KernelOps()
        self._native: dict = {}   # (dtype, op) -> function running MPI's Allreduce
        self._peer_of: dict[int, int] = {}   # id of a pending isend/irecv request -> its peer

    @classmethod
    def duplicate(cls, comm: MPI.Comm, kernel_ops: KernelOps | None = None,
                  deadline: Deadline | None = None) -> "MPITransport":
        """A transport on a private duplicate of ``comm``, so its traffic never meets the caller's."""
        return cls(comm.Dup(), owns_comm=True, kernel_ops=kernel_ops, deadline=deadline)

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
        comm = self._comm
        self.deadline.wait([comm.Isend(_spec(buf), dest, tag)], comm, "a send", (dest,))

    def recv(self, buf, source, tag=0):
        comm = self._comm
        self.deadline.wait([comm.Irecv(_spec(buf), source, tag)], comm, "a receive", (source,))

    def sendrecv(self, sendbuf, dest, recvbuf, source, tag=0):
        comm = self._comm
        requests = [comm.Irecv(_spec(recvbuf), source, tag), comm.Isend(_spec(sendbuf), dest, tag)]
        self.deadline.wait(requests, comm, "a send/receive", (source, dest))

    def isend(self, buf, dest, tag=0):
        request = self._comm.Isend(_spec(buf), dest, tag)
        self._note_peer(request, dest)
        return request

    def irecv(self, buf, source, tag=0):
        request = self._comm.Irecv(_spec(buf), source, tag)
        self._note_peer(request, source)
        return request

    def _note_peer(self, request, peer: int) -> None:
        """Remember whom ``request`` talks to (MPI does not say), for the error of a wait that times out."""
        peers = self._peer_of
        if len(peers) > 4096:  # requests completed elsewhere than waitall: forget them all
            peers.clear()
        peers[id(request)] = peer

    def waitall(self, requests):
        requests = list(requests)
        pop = self._peer_of.pop
        peers = [pop(id(r), None) for r in requests]  # still referenced by the caller: the ids are theirs
        self.deadline.wait(requests, self._comm, "point-to-point transfers", peers)

    def allreduce_native_(self, buf, op):
        if buf.ndim != 1 or not buf.flags.c_contiguous:
            _raw(buf)  # raises the contiguity error
        self.native_allreducer(buf.dtype, ReduceOp(op).kernel_op)(buf)

    def native_allreducer(self, dtype, op):
        key = (dtype, op)
        run = self._native.get(key)
        if run is not None:
            return run
        comm, wait, in_place = self._comm, self.deadline.wait, MPI.IN_PLACE
        allreduce = comm.Iallreduce
        what = "MPI's allreduce"
        row = BY_NUMPY.get(dtype)
        if row is None:
            raise CommlibError(f"native allreduce cannot reduce dtype {dtype}")
        if row.mpi is None:  # reduced by commlib's C kernels, registered as an MPI op
            kernel_op = self._kernel_ops.get(dtype, op)
            move_dtype, move_type = _MOVE[dtype.itemsize]

            def run(buf):
                wait([allreduce(in_place, [buf.view(move_dtype), move_type], kernel_op)], comm, what)
        else:
            mpitype = getattr(MPI, row.mpi)
            mpi_op = (_BOOL_OPS if row.kind == "bool" else _MPI_OPS)[op]

            def run(buf):
                wait([allreduce(in_place, [buf, mpitype], mpi_op)], comm, what)
        self._native[key] = run
        return run

    def allgatherv(self, sendbuf, recvbuf, counts):
        if len(counts) != self._size:
            raise CommlibError(f"allgatherv needs one count per rank ({self._size}), got {len(counts)}")
        comm = self._comm
        self.deadline.wait([comm.Iallgatherv(_spec(sendbuf), _vspec(recvbuf, counts))], comm, "MPI's allgather")

    def bcast_(self, buf, root):
        comm = self._comm
        self.deadline.wait([comm.Ibcast(_spec(buf), root)], comm, "MPI's broadcast",
                           None if root == self._rank else (root,))

    def alltoallv(self, sendbuf, sendcounts, recvbuf, recvcounts):
        if len(sendcounts) != self._size or len(recvcounts) != self._size:
            raise CommlibError(f"alltoallv needs one send and one receive count per rank ({self._size})")
        comm = self._comm
        self.deadline.wait([comm.Ialltoallv(_vspec(sendbuf, sendcounts), _vspec(recvbuf, recvcounts))], comm,
                           "MPI's alltoall")

    def barrier(self):
        comm = self._comm
        self.deadline.wait([comm.Ibarrier()], comm, "a barrier")

    def split(self, color, key):
        comm = self._comm.Split(MPI.UNDEFINED if color is None else int(color), int(key))
        if comm == MPI.COMM_NULL:
            return None
        return MPITransport(comm, owns_comm=True, kernel_ops=self._kernel_ops,  # freed with this transport's
                            deadline=self.deadline)

    def free(self):
        self._native.clear()
        if self.deadline.lost is not None:  # requests were abandoned on it: leave it to the process's end
            self._comm = MPI.COMM_NULL
            return
        if self._owns_ops:
            self._kernel_ops.free()
        if MPI.Is_finalized():  # nothing left to release
            return
        predefined = self._comm in (MPI.COMM_NULL, MPI.COMM_WORLD, MPI.COMM_SELF)
        if self._owns_comm and not predefined:
            self._comm.Free()
        self._comm = MPI.COMM_NULL

    def __repr__(self):
        return f"MPITransport(rank={self._rank}, size={self._size})"

