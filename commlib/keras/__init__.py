"""commlib for Keras: ``import commlib.keras as hvd`` (Keras 3 on any backend, horovod.keras's names).

The one Keras implementation: :mod:`commlib.tensorflow.keras` (horovod.tensorflow.keras's names) re-exports
it for ``tf.keras``. ``DistributedOptimizer`` wraps a Keras 3 optimizer (its gradients reduced through the
backend's plug-in: commlib.tensorflow, commlib.torch or commlib.jax) or a tf-keras one (:mod:`.tf_keras`);
the callbacks and :func:`broadcast_variables` move numpy values through commlib's own API;
:func:`load_model` restores a model as it was compiled, its optimizer distributed. See docs/tensorflow.md.

- ``optimizer.py``: ``DistributedOptimizer``, ``PartialDistributedOptimizer``, the Keras 3 wrapper
- ``tf_keras.py``: the tf-keras wrapper
- ``callbacks.py``: Horovod's callbacks, made for the Keras given
- ``saving.py``: ``load_model``
- ``backend.py``: which plug-in reduces a backend's tensors
"""

try:
    import keras as _keras
except ImportError as _exc:
    raise ImportError("commlib.keras needs Keras 3: pip install 'commlib[keras]' (or pip install keras)") from _exc

from commlib import (Adasum, Average, Compression, Max, Min, Product, Sum, allgather_object,  # noqa: F401
                     broadcast_object)
from ..frameworks.basics import (  # noqa: F401
    ProcessSet, add_process_set, ccl_built, cross_rank, cross_size, cuda_built, ddl_built, global_process_set,
    gloo_built, gloo_enabled, init, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, remove_process_set, rocm_built, shutdown, size, start_timeline,
    stop_timeline,
)
from . import saving as _saving
from .callbacks import broadcast_variables, make as _make_callbacks  # noqa: F401
from .optimizer import DistributedOptimizer, PartialDistributedOptimizer  # noqa: F401

callbacks = _make_callbacks(_keras)
BroadcastGlobalVariablesCallback = callbacks.BroadcastGlobalVariablesCallback
MetricAverageCallback = callbacks.MetricAverageCallback
LearningRateScheduleCallback = callbacks.LearningRateScheduleCallback
LearningRateWarmupCallback = callbacks.LearningRateWarmupCallback


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none,
               legacy_opts=False):
    """``keras.models.load_model`` with the model compiled as it was saved (optimizer and its state, loss,
    metrics) and its optimizer wrapped in :func:`DistributedOptimizer` (with ``compression``).
    ``custom_optimizers``: optimizer classes of your own (joined to ``custom_objects`` by name);
    ``legacy_opts`` is Horovod's argument, not needed: the optimizer's kind is read from the file."""
    return _saving.load_model(_keras, filepath, custom_optimizers, custom_objects, compression)
