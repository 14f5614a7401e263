"""commlib for Keras 3 on any backend: ``import commlib.keras as hvd``.

``DistributedOptimizer`` wraps any ``keras.optimizers.Optimizer`` so that ``model.fit`` (or a custom loop
calling ``apply``/``apply_gradients``) averages the gradients over the ranks through the backend's plug-in:
commlib.tensorflow (``KERAS_BACKEND=tensorflow``), commlib.torch (``torch``) or commlib.jax (``jax``). The
callbacks and :func:`broadcast_variables` move numpy values through commlib's own API. See
docs/tensorflow.md.
"""

try:
    import keras as _keras
except ImportError as _exc:
    raise ImportError("commlib.keras needs Keras 3: pip install 'commlib[keras]' (or pip install keras)") from _exc

import commlib as _cl
from commlib import (Average, Max, Min, Product, Sum, allgather_object, broadcast_object, cross_rank,  # noqa: F401
                     cross_size, init, is_initialized, local_rank, local_size, rank, shutdown, size)

from ..compression import Compression  # noqa: F401
from . import backend as _backend
from . import callbacks as _callbacks
from .callbacks import broadcast_variables  # noqa: F401
from .optimizer import GradientOptions, wrap_keras3

callbacks = _callbacks.make(_keras)
BroadcastGlobalVariablesCallback = callbacks.BroadcastGlobalVariablesCallback
MetricAverageCallback = callbacks.MetricAverageCallback
LearningRateScheduleCallback = callbacks.LearningRateScheduleCallback
LearningRateWarmupCallback = callbacks.LearningRateWarmupCallback


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=None,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, groups=None,
                         process_set=None, **kwargs):
    """``optimizer`` (any ``keras.optimizers.Optimizer``) with its gradients averaged over the ranks.

    ``backward_passes_per_step=k`` accumulates k passes locally (Keras' ``gradient_accumulation_steps``)
    and reduces once per k passes; the reduced gradient is their sum, or their mean with
    ``average_aggregated_gradients=True``.

    Example::

        import keras, commlib.keras as hvd
        hvd.init()
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
        model.compile(optimizer=opt, loss="mse")
        model.fit(x, y, callbacks=[hvd.BroadcastGlobalVariablesCallback(0)])
    """
    options = GradientOptions(compression, sparse_as_dense, gradient_predivide_factor, backward_passes_per_step,
                              average_aggregated_gradients, op, groups, process_set)
    _backend.plugin()  # a clear error now, not at the first step, when the backend has no plug-in here
    return wrap_keras3(optimizer, _reduce_for(options), options, name, _backend.backend_name())


def _reduce_for(options):
    def reduce(grads, **kwargs):
        if options.sparse_as_dense and _backend.backend_name() == "tensorflow":
            import tensorflow as tf

            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        return _backend.grouped_allreduce(grads, **kwargs)
    return reduce


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=None):
    """``keras.models.load_model`` whose optimizer comes back wrapped in :func:`DistributedOptimizer`."""
    objects = dict(custom_objects or {})
    for opt in custom_optimizers or []:
        objects[opt.__name__] = opt
    model = _keras.models.load_model(filepath, custom_objects=objects or None, compile=True)
    if getattr(model, "optimizer", None) is not None:
        wrapped = DistributedOptimizer(model.optimizer, compression=compression)
        model.compile(optimizer=wrapped, loss=model.loss, metrics=getattr(model, "compiled_metrics", None) and None)
    return model
