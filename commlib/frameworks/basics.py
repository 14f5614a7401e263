"""Process queries and build queries, answered truthfully for this build (every plug-in re-exports them).

commlib runs over MPI (mpi4py) on the host. It has no Gloo, oneCCL, DDL or ROCm backend, so those queries
say so. ``cuda_built()`` is True where CUDA tensors can be communicated (CuPy and a visible GPU), and
``nccl_built()`` is NCCL's version code where the device path can reduce them with NCCL (docs/gpu.md), as
Horovod's answers for a build with NCCL; 0 otherwise.
"""

from __future__ import annotations

import commlib as _cl

init = _cl.init
shutdown = _cl.shutdown
is_initialized = _cl.is_initialized
rank = _cl.rank
size = _cl.size
local_rank = _cl.local_rank
local_size = _cl.local_size
cross_rank = _cl.cross_rank
cross_size = _cl.cross_size
mpi_threads_supported = _cl.mpi_threads_supported
ProcessSet = _cl.ProcessSet
add_process_set = _cl.add_process_set
remove_process_set = _cl.remove_process_set
global_process_set = _cl.global_process_set


def mpi_built() -> bool:
    """True: commlib always communicates over MPI."""
    return True


def mpi_enabled() -> bool:
    """True once ``init()`` has run (MPI is commlib's only controller and transport)."""
    return _cl.is_initialized()


def gloo_built() -> bool:
    """False: commlib has no Gloo backend."""
    return False


def gloo_enabled() -> bool:
    """False: commlib has no Gloo backend."""
    return False


def nccl_built() -> int:
    """NCCL's version code where commlib's device path can use NCCL here (CuPy, NCCL and a GPU), else 0."""
    return _cl.nccl_built()


def ddl_built() -> bool:
    """False: commlib has no DDL backend."""
    return False


def ccl_built() -> bool:
    """False: commlib has no oneCCL backend."""
    return False


def cuda_built() -> bool:
    """Whether CUDA tensors can be communicated here: CuPy imports and a GPU is visible (they travel through
    pinned host memory and MPI; see docs/gpu.md)."""
    return _cl.cuda_built()


def rocm_built() -> bool:
    """False: commlib has no ROCm backend."""
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a Chrome-trace timeline of the collectives to ``file_path`` (rank 0; rank r > 0 writes
    ``name.rankR.json``), with Horovod's activity names; ``mark_cycles`` marks each coordinator cycle that
    did something with ``CYCLE_START``."""
    _cl.start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop writing the timeline started by :func:`start_timeline` and close the file."""
    _cl.stop_timeline()
