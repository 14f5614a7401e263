"""horovod.tensorflow.keras's names: ``import commlib.tensorflow.keras as hvd``.

:mod:`commlib.keras`'s implementation (one for Keras 3 on every backend and for tf-keras), re-exported with
commlib.tensorflow's process queries, collectives and ``Compression``, as Horovod's module re-exports
horovod.tensorflow's. The callbacks subclass, and ``load_model`` loads with, the Keras that ``tf.keras`` is:
Keras 3 (then everything here is commlib.keras's own) or tf-keras under ``TF_USE_LEGACY_KERAS=1``.
"""

import tensorflow as _tf

from ...keras import DistributedOptimizer, PartialDistributedOptimizer, broadcast_variables  # noqa: F401
from ...keras.callbacks import make as _make_callbacks
from ...keras.saving import load_model as _load_model
# from the modules that define them, not commlib.tensorflow itself, whose DistributedOptimizer imports this
# package when it is handed a Keras optimizer
from .. import elastic  # noqa: F401
from ..basics import (  # noqa: F401
    ProcessSet, add_process_set, ccl_built, cross_rank, cross_size, cuda_built, ddl_built, global_process_set,
    gloo_built, gloo_enabled, init, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, remove_process_set, rocm_built, shutdown, size, start_timeline,
    stop_timeline,
)
from ..collectives import (Adasum, Average, Max, Min, Product, Sum, allgather, allreduce,  # noqa: F401
                           alltoall, barrier, broadcast, join, reducescatter)
from ..compression import Compression
from ..functions import allgather_object, broadcast_global_variables, broadcast_object  # noqa: F401

callbacks = _make_callbacks(_tf.keras)
BroadcastGlobalVariablesCallback = callbacks.BroadcastGlobalVariablesCallback
MetricAverageCallback = callbacks.MetricAverageCallback
LearningRateScheduleCallback = callbacks.LearningRateScheduleCallback
LearningRateWarmupCallback = callbacks.LearningRateWarmupCallback


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none,
               legacy_opts=False):
    """``tf.keras.models.load_model``, as :func:`commlib.keras.load_model` (model compiled as saved,
    optimizer state kept and the optimizer distributed)."""
    return _load_model(_tf.keras, filepath, custom_optimizers, custom_objects, compression)
