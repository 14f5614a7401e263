"""horovod.tensorflow.keras's names: ``import commlib.tensorflow.keras as hvd``.

It serves the Keras that ``tf.keras`` is: Keras 3 (TensorFlow 2.16 and later; then everything is
:mod:`commlib.keras`'s) or tf-keras (``TF_USE_LEGACY_KERAS=1``), whose optimizers are wrapped at
``apply_gradients``.
"""

from __future__ import annotations

import tensorflow as _tf

import commlib as _cl

# from the modules that define them, not the package: commlib.tensorflow's DistributedOptimizer hands a
# Keras optimizer on to this module, which must not import its importer back
from .. import elastic  # noqa: F401
from ..basics import (cross_rank, cross_size, init, is_initialized, local_rank, local_size, rank,  # noqa: F401
                      shutdown, size)
from ..collectives import (Adasum, Average, Max, Min, Product, Sum, allgather, allreduce,  # noqa: F401
                           alltoall, barrier, broadcast, join, reducescatter)
from ..compression import Compression  # noqa: F401
from ..functions import allgather_object, broadcast_object  # noqa: F401
from ...keras.callbacks import broadcast_variables as _broadcast_variables
from ...keras.callbacks import make as _make_callbacks
from ...keras.optimizer import GradientOptions, wrap
from .. import collectives as _collectives

_keras = _tf.keras
#: True when tf.keras is Keras 3 (wrapped at ``apply``), False for tf-keras (at ``apply_gradients``).
KERAS3 = getattr(_keras, "__version__", "3").split(".")[0] >= "3" and not _keras.__name__.startswith("tf_keras")

callbacks = _make_callbacks(_keras)
BroadcastGlobalVariablesCallback = callbacks.BroadcastGlobalVariablesCallback
MetricAverageCallback = callbacks.MetricAverageCallback
LearningRateScheduleCallback = callbacks.LearningRateScheduleCallback
LearningRateWarmupCallback = callbacks.LearningRateWarmupCallback


def _reduce_for(options):
    def reduce(grads, op, compression, prescale_factor, postscale_factor, process_set):
        if options.sparse_as_dense:
            grads = [_tf.convert_to_tensor(g) if isinstance(g, _tf.IndexedSlices) else g for g in grads]
        return _collectives.grouped_allreduce(grads, op=op, compression=compression or Compression.none,
                                              prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                              process_set=process_set or _cl.global_process_set)
    return reduce


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, groups=None,
                         process_set=_cl.global_process_set, scale_local_gradients=True):
    """``optimizer`` (a tf.keras optimizer) with its gradients averaged over the ranks before they are
    applied (``model.fit`` and custom loops alike)."""
    options = GradientOptions(compression, sparse_as_dense, gradient_predivide_factor, backward_passes_per_step,
                              average_aggregated_gradients, op, groups, process_set)
    method = "apply" if KERAS3 and hasattr(optimizer, "apply") else "apply_gradients"
    return wrap(optimizer, method, _reduce_for(options), options, name)


def broadcast_global_variables(root_rank: int):
    """Eagerly there are no global variables: use ``broadcast_variables(model.variables, root_rank)``."""
    from ..functions import broadcast_global_variables as _bgv

    return _bgv(root_rank)


def broadcast_variables(variables, root_rank: int = 0, process_set=None):
    """Give every rank ``root_rank``'s values of ``variables``."""
    _broadcast_variables(variables, root_rank, process_set)


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none):
    """``tf.keras.models.load_model`` whose optimizer comes back wrapped in :func:`DistributedOptimizer`."""
    objects = dict(custom_objects or {})
    for opt in custom_optimizers or []:
        objects[opt.__name__] = opt
    model = _keras.models.load_model(filepath, custom_objects=objects or None)
    if getattr(model, "optimizer", None) is not None:
        model.optimizer = DistributedOptimizer(model.optimizer, compression=compression)
    return model
