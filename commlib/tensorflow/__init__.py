"""commlib's horovod.tensorflow-compatible plug-in: ``import commlib.tensorflow as hvd``.

Collectives on ``tf.Tensor`` in eager mode, inside ``tf.function`` and in TF1 graphs, with gradients;
``DistributedGradientTape``, ``DistributedOptimizer``, the broadcast helpers and process sets. Keras lives
in :mod:`commlib.tensorflow.keras` (horovod.tensorflow.keras's names) and :mod:`commlib.keras` (Keras 3 on
any backend). See docs/tensorflow.md.
"""

try:
    import tensorflow as _tf  # noqa: F401
except ImportError as _exc:  # say what to install instead of a bare ModuleNotFoundError
    raise ImportError("commlib.tensorflow needs TensorFlow: pip install 'commlib[tensorflow]' "
                      "(or pip install tensorflow-cpu)") from _exc

from . import elastic, util  # noqa: F401
from .basics import (
    ProcessSet, add_process_set, ccl_built, cross_rank, cross_size, cuda_built, ddl_built, global_process_set,
    gloo_built, gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_rank_op, local_size,
    local_size_op, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, process_set_included_op, rank,
    rank_op, remove_process_set, rocm_built, shutdown, size, size_op, start_timeline, stop_timeline,
)
from .collectives import (
    Adasum, Average, Max, Min, Product, Sum, allgather, allreduce, alltoall, barrier, broadcast, broadcast_,
    grouped_allgather, grouped_allreduce, grouped_reducescatter, join, reducescatter,
)
from .compression import Compression
from .functions import (allgather_object, broadcast_global_variables, broadcast_object, broadcast_object_fn,
                        broadcast_variables)
from .optimizer import DistributedGradientTape, DistributedOptimizer, PartialDistributedGradientTape
# Horovod's underscore names, which horovod.tensorflow re-exports (scripts and Horovod's tests use them)
from .bridge import executing_eagerly as _executing_eagerly  # noqa: F401
from .mpi_ops import allreduce_op as _allreduce, grouped_allreduce_op as _grouped_allreduce  # noqa: F401
from .mpi_ops import grouped_reducescatter_op as _grouped_reducescatter, reducescatter_op as _reducescatter  # noqa: F401
