"""NCCL: finding the library, the rule for when it can run, and one communicator per lane.

- :func:`nccl_module` is ``cupy.cuda.nccl`` with the NCCL library found at run time: the
  ``nvidia-nccl-cu12``/``-cu13`` wheel's ``libnccl.so.2`` when one is installed (loaded first, so that
  CuPy's NCCL module binds to it), else whatever the system's loader finds. :func:`nccl_built` is its
  version code, 0 when it cannot run here.
- :func:`route` is the rule, on facts every rank has gathered (:class:`GpuRecord`, one per rank), for how
  device allreduces run: ``nccl`` (one node: NCCL among all ranks), ``hierarchical`` (NCCL inside each
  node, the staged host path across nodes), or the staged path, with the reason. NCCL needs every rank to
  load it and every rank on a GPU of its own: NCCL refuses two ranks of one communicator on one GPU.
- :class:`NcclComm` is one NCCL communicator over the ranks of a transport (a lane's, or a node's): rank
  0 makes the unique id and the transport broadcasts it. The library object is handed in, so the tests
  can set communicators up over real MPI with a stand-in library.

The collectives take raw device addresses and a stream handle from the stream interface
(:mod:`.streams`) and are queued on that stream.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np

from ..device import DeviceSupportError, cupy_module
from ..dtypes import BFLOAT16
from ..ops import ReduceOp

# NCCL's ncclDataType_t and ncclRedOp_t (nccl.h); CuPy exports the same numbers as nccl.NCCL_*.
NCCL_TYPES = {np.dtype(np.int8): 0, np.dtype(np.uint8): 1, np.dtype(np.int32): 2, np.dtype(np.int64): 4,
              np.dtype(np.float16): 6, np.dtype(np.float32): 7, np.dtype(np.float64): 8, BFLOAT16: 9}
NCCL_OPS = {ReduceOp.SUM: 0, ReduceOp.PRODUCT: 1, ReduceOp.MAX: 2, ReduceOp.MIN: 3}
NO_LIBRARY = ("install the NCCL wheel for your CUDA version (pip install 'commlib[cuda12]' or "
              "'commlib[cuda13]': nvidia-nccl-cu12/-cu13) or the system's libnccl2")


def wheel_library() -> Path | None:
    """``libnccl.so.2`` of an installed ``nvidia-nccl-cu12``/``-cu13`` wheel (``nvidia/nccl/lib/``), or None."""
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(location) / "lib" / "libnccl.so.2"
        if candidate.exists():
            return candidate
    return None


def nccl_module():
    """``cupy.cuda.nccl`` bound to the NCCL library found at run time (module docstring), or a
    :class:`DeviceSupportError` saying what to install."""
    cupy_module()
    library = wheel_library()
    if library is not None:
        import ctypes

        ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)  # CuPy's module then binds to this one
    try:
        from cupy.cuda import nccl
    except ImportError as exc:
        raise DeviceSupportError(f"CuPy cannot load NCCL ({exc}); {NO_LIBRARY}") from None
    if not getattr(nccl, "available", True):
        raise DeviceSupportError(f"CuPy cannot load NCCL; {NO_LIBRARY}")
    return nccl


def nccl_built() -> int:
    """NCCL's version code (e.g. 22703 for 2.27.3) when NCCL can run here: CuPy imports, the library
    loads, and a CUDA device is visible; else 0 (as Horovod's ``nccl_built``)."""
    try:
        nccl = nccl_module()
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return 0
        return int(nccl.get_version())
    except Exception:  # noqa: BLE001 - no CuPy, no NCCL, no driver: all mean "cannot run here"
        return 0


# ---- when NCCL can run ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GpuRecord:
    """What one rank tells the others before the first device allreduce: its node (as commlib's topology
    counts them, COMMLIB_LOCAL_SIZE included), the machine it really runs on (:func:`this_host`), its GPU's
    PCI address (domain, bus, device; equal for two ranks that share the GPU) and its NCCL version (0:
    none)."""

    node: int
    host: int
    gpu: tuple[int, int, int]
    nccl: int

    def encode(self) -> np.ndarray:
        return np.array([self.node, self.host, *self.gpu, self.nccl], np.int64)

    @classmethod
    def decode(cls, row) -> "GpuRecord":
        node, host, domain, bus, dev, version = (int(v) for v in row)
        return cls(node, host, (domain, bus, dev), version)


#: integers in a :class:`GpuRecord`
RECORD_SIZE = 6


def this_host() -> int:
    """This machine, as a number every process on it computes alike (emulated nodes share one)."""
    import socket
    import zlib

    return zlib.crc32(socket.gethostname().encode())


STAGED, NCCL, HIERARCHICAL = "staged", "nccl", "hierarchical"


def route(records: list[GpuRecord], node_sizes: list[int]) -> tuple[str, str]:
    """(how device allreduces run, why): ``nccl`` on one node, ``hierarchical`` across nodes of equal
    size, else ``staged`` with the reason NCCL cannot run. Every rank decides from the same records."""
    missing = [r for r, record in enumerate(records) if record.nccl <= 0]
    if missing:
        return STAGED, f"rank(s) {missing} cannot load NCCL (commlib.nccl_built() is 0 there): {NO_LIBRARY}"
    seen: dict[tuple, int] = {}
    for r, record in enumerate(records):
        key = (record.host, record.gpu)
        if key in seen:
            domain, bus, dev = record.gpu
            return STAGED, (f"ranks {seen[key]} and {r} share one GPU (PCI {domain:04x}:{bus:02x}:{dev:02x} on "
                            f"node {record.node}); NCCL refuses two ranks of one communicator on one GPU, "
                            "so device tensors go through the host (give each rank a GPU of its own: "
                            "CUDA_VISIBLE_DEVICES or one rank per GPU)")
        seen[key] = r
    if len(node_sizes) == 1:
        return NCCL, f"every rank has a GPU of its own (NCCL {_version(min(r.nccl for r in records))})"
    if len(set(node_sizes)) > 1:
        return STAGED, (f"hierarchical NCCL needs the same number of ranks on every node, but the nodes have "
                        f"{list(node_sizes)}")
    return HIERARCHICAL, (f"every rank has a GPU of its own on {len(node_sizes)} nodes: NCCL inside each node, "
                          "the staged host path across nodes")


def _version(code: int) -> str:
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def why_not_dtype(dtype: np.dtype) -> str | None:
    """Why NCCL cannot reduce ``dtype`` (None: it can)."""
    if np.dtype(dtype) in NCCL_TYPES:
        return None
    return f"NCCL has no {np.dtype(dtype)} type (it takes {', '.join(str(d) for d in NCCL_TYPES)})"


# ---- a communicator -------------------------------------------------------------------------------------

def exchange_unique_id(transport, unique_id) -> tuple:
    """Rank 0's ``unique_id`` (a sequence of ints, NCCL's 128 bytes) on every rank of ``transport``."""
    if transport.size == 1:
        return tuple(int(v) for v in unique_id)
    length = np.array([len(unique_id) if transport.rank == 0 else 0], np.int64)
    transport.bcast_(length, 0)
    payload = (np.array(unique_id, np.int64) if transport.rank == 0 else np.empty(int(length[0]), np.int64))
    transport.bcast_(payload, 0)
    return tuple(int(v) for v in payload)


class NcclComm:
    """One NCCL communicator over the ranks of ``transport`` (its rank 0 makes the unique id), on the GPU of
    ``streams``. ``nccl`` is the library (:func:`nccl_module`, or a stand-in in the tests)."""

    def __init__(self, nccl, transport, streams):
        self.nccl = nccl
        self.streams = streams
        self.rank, self.size = transport.rank, transport.size
        unique_id = exchange_unique_id(transport, nccl.get_unique_id() if transport.rank == 0 else ())
        with streams.activate():
            self.comm = nccl.NcclCommunicator(transport.size, unique_id, transport.rank)

    def allreduce(self, stream, source, target, dtype: np.dtype, op: ReduceOp) -> None:
        """``target`` = the reduction of every rank's ``source`` (1-D, ``dtype``; they may be one buffer)."""
        if source.size:
            s = self.streams
            self.comm.allReduce(s.pointer(source), s.pointer(target), int(source.size), NCCL_TYPES[np.dtype(dtype)],
                                NCCL_OPS[op], s.handle(stream))

    def reduce_scatter(self, stream, source, target, dtype: np.dtype, op: ReduceOp) -> None:
        """``target`` (``source.size / size`` elements) = this rank's block of the reduction of ``source``."""
        if target.size:
            s = self.streams
            self.comm.reduceScatter(s.pointer(source), s.pointer(target), int(target.size),
                                    NCCL_TYPES[np.dtype(dtype)], NCCL_OPS[op], s.handle(stream))

    def all_gather(self, stream, source, target, dtype: np.dtype) -> None:
        """``target`` = every rank's ``source``, in rank order."""
        if source.size:
            s = self.streams
            self.comm.allGather(s.pointer(source), s.pointer(target), int(source.size), NCCL_TYPES[np.dtype(dtype)],
                                s.handle(stream))

    def broadcast(self, stream, buffer, dtype: np.dtype, root: int) -> None:
        if buffer.size:
            s = self.streams
            self.comm.broadcast(s.pointer(buffer), s.pointer(buffer), int(buffer.size), NCCL_TYPES[np.dtype(dtype)],
                                root, s.handle(stream))

    def close(self) -> None:
        if self.comm is not None:
            self.comm.destroy()
            self.comm = None
