"""``horovod.torch.mpi_ops``: the module Horovod scripts import the collectives and queries from directly
(``from horovod.torch.mpi_ops import synchronize``). Everything here is commlib.torch's own function."""

from .autograd import (  # noqa: F401
    allgather, allreduce, alltoall, broadcast, grouped_allgather, grouped_allreduce, grouped_reducescatter,
    reducescatter,
)
from .basics import (  # noqa: F401
    ProcessSet, add_process_set, ccl_built, cross_rank, cross_size, cuda_built, ddl_built, global_process_set,
    gloo_built, gloo_enabled, init, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, remove_process_set, rocm_built, shutdown, size, start_timeline,
    stop_timeline,
)
from .collectives import (  # noqa: F401
    Adasum, Average, Handle, HorovodInternalError, Max, Min, Product, Sum, allgather_async, allreduce_,
    allreduce_async, allreduce_async_, alltoall_async, barrier, broadcast_, broadcast_async, broadcast_async_,
    grouped_allgather_async, grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_,
    grouped_reducescatter_async, join, poll, reducescatter_async, sparse_allreduce_async, synchronize,
)
