"""``DistributedOptimizer`` and ``PartialDistributedOptimizer``: the one wrapper for Keras 3 (every backend)
and for tf-keras (``TF_USE_LEGACY_KERAS=1``), with Horovod's arguments and defaults.

The wrapper subclasses the optimizer's own class (so ``isinstance``, ``get_config``, its variables and
serialization stay the optimizer's) and overrides the method every training step goes through. Which
methods depends on the optimizer given, not on the entry point: a Keras 3 optimizer is reduced in
``apply`` (:mod:`.keras3`), a tf-keras one in ``compute_gradients``/``apply_gradients``
(:mod:`.tf_keras`).
"""

from __future__ import annotations

import warnings

import commlib as _cl

from ..compression import Compression
from ..frameworks import local_layer_variables
from . import backend as _backend
from . import keras3
from .wrapper import GradientOptions


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=_cl.Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0,
                         groups=None, process_set=_cl.global_process_set, scale_local_gradients=True):
    """``optimizer`` (a Keras 3 or tf-keras optimizer) with its gradients averaged over the ranks before
    they are applied (``model.fit`` and custom loops alike); a new optimizer of the same class and config.

    ``backward_passes_per_step=k`` accumulates k passes locally and reduces once per k passes; the reduced
    gradient is their sum, or their mean with ``average_aggregated_gradients=True``. ``process_set``:
    reduce over that set's ranks only. ``groups`` (and the deprecated ``num_groups``) are accepted: every
    gradient already travels in one grouped collective. ``device_dense``/``device_sparse`` are ignored
    (tensors are read on the host).

    Example::

        import keras, commlib.keras as hvd
        hvd.init()
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
        model.compile(optimizer=opt, loss="mse")
        model.fit(x, y, callbacks=[hvd.BroadcastGlobalVariablesCallback(0)])
    """
    if num_groups:
        warnings.warn("num_groups is replaced by groups (as in Horovod)", DeprecationWarning, stacklevel=2)
        groups = num_groups if groups is None else groups
    options = GradientOptions(compression, sparse_as_dense, gradient_predivide_factor, backward_passes_per_step,
                              average_aggregated_gradients, op, groups, process_set, scale_local_gradients)
    return distribute(optimizer, options, name)


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False, gradient_predivide_factor=1.0,
                                op=_cl.Average, backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=_cl.global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """A :func:`DistributedOptimizer` whose ``local_layers``' (a layer or a list) trainable variables keep
    their local gradients (model parallelism), divided by the number of ranks unless
    ``scale_local_gradients=False``; tf-keras optimizers (with Keras 3, use
    ``commlib.tensorflow.PartialDistributedGradientTape`` in a custom loop)."""
    opt = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                               gradient_predivide_factor, op, backward_passes_per_step,
                               average_aggregated_gradients, 0, groups, process_set, scale_local_gradients)
    if not hasattr(opt, "register_local_var"):
        raise NotImplementedError("PartialDistributedOptimizer needs a tf-keras optimizer "
                                  "(TF_USE_LEGACY_KERAS=1); with Keras 3 use PartialDistributedGradientTape "
                                  "in a custom loop")
    for var in local_layer_variables(local_layers):
        opt.register_local_var(var)
    return opt


def distribute(optimizer, options: GradientOptions, name: str | None = None, in_place: bool = False):
    """``optimizer`` wrapped by the mixin of its Keras. ``in_place``: the optimizer itself becomes the
    wrapper (its variables and state kept; what ``load_model`` needs), instead of a copy from its config."""
    if is_tf_keras(optimizer):
        from . import tf_keras  # imports TensorFlow

        return tf_keras.wrap(optimizer, options, name, in_place)
    _backend.plugin()  # a clear error now, not at the first step, when the backend has no plug-in here
    return keras3.wrap(optimizer, options, name, in_place)


def is_tf_keras(optimizer) -> bool:
    """True for a tf-keras optimizer, False for a Keras 3 one; a TypeError for anything else."""
    for cls in type(optimizer).__mro__:
        package = cls.__module__.split(".")[0]
        if package == "tf_keras":
            return True
        if package == "keras":
            return False
    raise TypeError(f"DistributedOptimizer wraps a Keras optimizer (Keras 3 or tf-keras), not "
                    f"{type(optimizer).__name__}; for a tf.compat.v1.train.Optimizer use "
                    "commlib.tensorflow.DistributedOptimizer")
