"""commlib's horovod.torch-compatible plug-in: ``import commlib.torch as hvd``.

BytePS's names (``push_pull``, ``push_pull_async_inplace``, ...) reach the summation servers
(:mod:`.push_pull`, docs/servers.md), so a ``byteps.torch`` script runs after changing its import.

Collectives on CPU torch tensors (no copies: tensors share memory with the arrays commlib communicates),
their autograd, ``DistributedOptimizer``, and the broadcast helpers. See docs/torch.md.
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as _exc:  # say what to install instead of a bare ModuleNotFoundError deep inside
    raise ImportError(f"commlib.torch needs PyTorch: pip install 'commlib[torch]' (or pip install torch) ({_exc})"
                      ) from _exc

from .averagers import (HierarchicalModelAverager, LocalSGDOptimizer, ModelAverager,
                        PeriodicModelAverager)
from .autograd import (
    allgather, allreduce, alltoall, broadcast, grouped_allgather, grouped_allreduce, grouped_reducescatter,
    reducescatter,
)
from .basics import (
    ProcessSet, add_process_set, global_process_set, remove_process_set, ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, init, is_initialized,
    local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank, rocm_built,
    shutdown, size, start_timeline, stop_timeline,
)
from .collectives import (
    Adasum, Average, Compression, Handle, HorovodInternalError, Max, Min, Product, Sum, allgather_async,
    allreduce_, allreduce_async, allreduce_async_, alltoall_async, barrier, broadcast_, broadcast_async,
    broadcast_async_, grouped_allgather_async, grouped_allreduce_, grouped_allreduce_async,
    grouped_allreduce_async_, grouped_reducescatter_async, join, poll, reducescatter_async,
    sparse_allreduce_async, synchronize,
)
from .geo import GeoSGD
from .functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .optimizer import DistributedOptimizer
from .push_pull import declare, push_pull, push_pull_async, push_pull_async_inplace, push_pull_inplace
from .sync_batch_norm import SyncBatchNorm
from .bridge import DeviceNotSupportedError
from . import elastic  # noqa: E402 (hvd.elastic.run, TorchState, ElasticSampler)
from . import distributed  # noqa: E402 (registers the torch.distributed backend "commlib")
