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
from ...frameworks import local_layer_variables
from ...keras.callbacks import broadcast_variables as _broadcast_variables
from ...keras.callbacks import make as _make_callbacks
from ...keras.optimizer import GradientOptions, reducer, wrap, wrap_keras3
from .. import collectives as _collectives
from ..aggregation import GradientAccumulator
from ..aggregation import variable_key as _key

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


def _tf_keras_mixin(reduce, options):
    """tf-keras' optimizer wrapper (Horovod's, on tf-keras' optimizers): gradients are reduced in
    ``compute_gradients`` (what ``minimize`` and ``fit`` call) or, for gradients that did not come from it
    (a custom loop's ``tape.gradient``), in ``apply_gradients``; with ``backward_passes_per_step > 1``
    ``apply_gradients`` accumulates and reduces on every k-th call (:mod:`commlib.tensorflow.aggregation`).
    Variables registered with ``register_local_var`` keep their local gradient, divided by the number of
    ranks unless ``scale_local_gradients=False``."""
    reduced_all = reducer(reduce, options)

    def reduce_pairs(opt, grads, variables):
        grads = list(grads)
        local = opt._commlib_local_vars
        shared = [i for i, v in enumerate(variables) if _key(v) not in local]
        out = list(grads)
        for i, r in zip(shared, reduced_all([grads[i] for i in shared])):
            out[i] = r
        if local and options.scale_local_gradients:
            ranks = float((options.process_set or _cl.global_process_set).size())
            for i, v in enumerate(variables):
                g = out[i]
                if _key(v) in local and g is not None:
                    out[i] = (_tf.IndexedSlices(g.values / ranks, g.indices, g.dense_shape)
                              if isinstance(g, _tf.IndexedSlices) else g / ranks)
        return out

    class DistributedTFKeras:
        def register_local_var(self, var):
            """Keep ``var``'s gradient local to this rank (not reduced)."""
            self._commlib_local_vars.add(_key(var))

        def compute_gradients(self, loss, var_list, tape=None):
            return self._compute_gradients(loss, var_list, None, tape)

        def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
            base = super()
            if hasattr(base, "_compute_gradients"):  # optimizer v2 (tf_keras.optimizers.legacy)
                pairs = list(base._compute_gradients(loss, var_list=var_list, grad_loss=grad_loss, tape=tape))
            else:
                pairs = list(base.compute_gradients(loss, var_list, tape))
            if self._agg_helper is not None:  # reduced on the update step, after accumulation
                return pairs
            variables = [v for _, v in pairs]
            grads = reduce_pairs(self, [g for g, _ in pairs], variables)
            self._commlib_reduced = tuple(grads)
            return list(zip(grads, variables))

        def apply_gradients(self, grads_and_vars, *args, **kwargs):
            pairs = list(grads_and_vars)
            grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
            base_apply = super().apply_gradients
            if self._agg_helper is not None:
                with _tf.init_scope():  # optimizer variables are made here, never inside the update branch
                    if hasattr(self, "_create_all_weights"):  # optimizer v2
                        self._create_all_weights(variables)
                    else:
                        self.build(variables)
                if hasattr(self, "_compute_current_learning_rate"):
                    self._compute_current_learning_rate()
                self._agg_helper(grads, variables, lambda reduced: base_apply(reduced, *args, **kwargs),
                                 self.iterations)
                return self.iterations
            done = getattr(self, "_commlib_reduced", None)
            self._commlib_reduced = None
            if not (done is not None and len(done) == len(grads) and all(a is b for a, b in zip(done, grads))):
                grads = reduce_pairs(self, grads, variables)  # not what compute_gradients returned: reduce now
            return base_apply(list(zip(grads, variables)), *args, **kwargs)

    return DistributedTFKeras, reduce_pairs


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, groups=None,
                         process_set=_cl.global_process_set, scale_local_gradients=True):
    """``optimizer`` (a tf.keras optimizer) with its gradients averaged over the ranks before they are
    applied (``model.fit`` and custom loops alike). ``backward_passes_per_step=k``: gradients are
    accumulated locally and reduced and applied on every k-th step (their sum, or their mean with
    ``average_aggregated_gradients=True``)."""
    options = GradientOptions(compression, sparse_as_dense, gradient_predivide_factor, backward_passes_per_step,
                              average_aggregated_gradients, op, groups, process_set, scale_local_gradients)
    if KERAS3 and hasattr(optimizer, "apply"):
        return wrap_keras3(optimizer, _reduce_for(options), options, name, "tensorflow")
    mixin, reduce_pairs = _tf_keras_mixin(_reduce_for(options), options)
    wrapped = wrap(optimizer, mixin, options, name)
    wrapped._commlib_local_vars = set()
    wrapped._commlib_reduced = None
    wrapped._agg_helper = None
    if options.passes > 1:
        wrapped._agg_helper = GradientAccumulator(
            options.passes, options.average_aggregated,
            lambda grads, variables: reduce_pairs(wrapped, grads, variables))
    return wrapped


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False, gradient_predivide_factor=1.0,
                                op=Average, backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=_cl.global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """A :func:`DistributedOptimizer` whose ``local_layers``' (a layer or a list) trainable variables keep
    their local gradients (model parallelism); tf-keras optimizers."""
    opt = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                               gradient_predivide_factor, op, backward_passes_per_step,
                               average_aggregated_gradients, groups, process_set, scale_local_gradients)
    if not hasattr(opt, "register_local_var"):
        raise NotImplementedError("PartialDistributedOptimizer needs a tf-keras optimizer "
                                  "(TF_USE_LEGACY_KERAS=1); with Keras 3 use PartialDistributedGradientTape "
                                  "in a custom loop")
    for var in local_layer_variables(local_layers):
        opt.register_local_var(var)
    return opt


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
