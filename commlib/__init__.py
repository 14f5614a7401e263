"""commlib: a communication layer for data-parallel training.

``import commlib as cl``; ``cl.init()``; then ``cl.allreduce``, ``cl.allreduce_async_``,
``cl.synchronize`` and the other collectives, named as in horovod.torch. See README.md and docs/.
"""

from .api import (
    add_process_set, global_process_set, remove_process_set,
    allgather, allgather_async, allgather_object, allreduce, allreduce_, allreduce_async,
    allreduce_async_, alltoall, alltoall_async, barrier, barrier_async, broadcast, broadcast_, broadcast_async,
    broadcast_async_, broadcast_object, cross_rank, cross_size, grouped_allreduce, grouped_allreduce_,
    grouped_allgather, grouped_allgather_async, grouped_allreduce_async, grouped_allreduce_async_,
    grouped_reducescatter, grouped_reducescatter_async, init, is_initialized, join, local_rank, local_size,
    mpi_threads_supported, num_servers, persistent_allreduce, poll, push_pull, push_pull_, push_pull_async, push_pull_async_, rank,
    reducescatter, reducescatter_async, shutdown, size, start_timeline, stop_timeline, synchronize,
)
from .adasum import Adasum
from .compression import Compression, CompressionOverflowWarning
from .coordinator.requests import Handle
from .device import cuda_built
from .errors import CollectiveError, CommlibError, ConfigError, InFlightError, PeerLostError, ProcessSetError
from .process_sets import ProcessSet
from .ops import Average, Max, Min, Product, ReduceOp, Sum
from .transport.nccl import nccl_built

__version__ = "0.1.0"
