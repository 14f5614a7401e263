"""The optimizer wrapper for tf-keras (``TF_USE_LEGACY_KERAS=1``; optimizer v2 and the legacy optimizers
alike), as Horovod wraps tf.keras' optimizers.

Gradients are reduced in ``compute_gradients`` (what ``minimize`` and ``fit`` call) or, for gradients that
did not come from it (a custom loop's ``tape.gradient``), in ``apply_gradients``; with
``backward_passes_per_step > 1`` ``apply_gradients`` accumulates and reduces on every k-th call
(:mod:`commlib.tensorflow.aggregation`). Variables registered with ``register_local_var`` keep their local
gradient, divided by the number of ranks unless ``scale_local_gradients=False``.
"""

from __future__ import annotations

import tensorflow as tf

import commlib as _cl

from ..tensorflow.aggregation import GradientAccumulator, variable_key
from .wrapper import GradientOptions, reduce_for, reducer
from .wrapper import wrap as _wrap


def wrap(optimizer, options: GradientOptions, name: str | None = None, in_place: bool = False):
    """``optimizer`` (tf-keras) wrapped; ``in_place`` as :func:`commlib.keras.wrapper.wrap`."""
    mixin, reduce_pairs = _mixin(reduce_for(options, backend="tensorflow"), options)
    wrapped = _wrap(optimizer, mixin, options, name, in_place=in_place)
    wrapped._commlib_local_vars = set()
    wrapped._commlib_reduced = None
    wrapped._agg_helper = None
    if options.passes > 1:
        wrapped._agg_helper = GradientAccumulator(
            options.passes, options.average_aggregated,
            lambda grads, variables: reduce_pairs(wrapped, grads, variables))
    return wrapped


def _mixin(reduce, options: GradientOptions):
    """The methods the wrapper overrides, and ``reduce_pairs(opt, grads, variables)``."""
    reduced_all = reducer(reduce, options)

    def reduce_pairs(opt, grads, variables):
        grads = list(grads)
        local = opt._commlib_local_vars
        shared = [i for i, v in enumerate(variables) if variable_key(v) not in local]
        out = list(grads)
        for i, r in zip(shared, reduced_all([grads[i] for i in shared])):
            out[i] = r
        if local and options.scale_local_gradients:
            ranks = float((options.process_set or _cl.global_process_set).size())
            for i, v in enumerate(variables):
                g = out[i]
                if variable_key(v) in local and g is not None:
                    out[i] = (tf.IndexedSlices(g.values / ranks, g.indices, g.dense_shape)
                              if isinstance(g, tf.IndexedSlices) else g / ranks)
        return out

    class DistributedTFKeras:
        def register_local_var(self, var):
            """Keep ``var``'s gradient local to this rank (not reduced)."""
            self._commlib_local_vars.add(variable_key(var))

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
                with tf.init_scope():  # optimizer variables are made here, never inside the update branch
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
