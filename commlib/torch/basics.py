"""Process queries and build queries (shared by every plug-in: :mod:`commlib.frameworks.basics`)."""

from ..frameworks.basics import (  # noqa: F401
    ProcessSet, add_process_set, ccl_built, cross_rank, cross_size, cuda_built, ddl_built, global_process_set,
    gloo_built, gloo_enabled, init, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, remove_process_set, rocm_built, shutdown, size, start_timeline,
    stop_timeline,
)
