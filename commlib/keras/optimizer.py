"""``DistributedOptimizer`` for Keras 3: the wrapped optimizer's class, with gradients reduced over the
ranks before they are applied.

The wrapper subclasses the optimizer's own class (so ``isinstance``, ``get_config``, its variables and
serialization stay the optimizer's) through a mixin that overrides the one method every training step
goes through: Keras 3's ``apply`` (``fit``, ``apply_gradients`` and custom loops all reach it). tf-keras'
mixin lives in :mod:`commlib.tensorflow.keras`. ``reduce`` is the backend's grouped allreduce.

``backward_passes_per_step=k`` uses Keras 3's own gradient accumulation (the optimizer's
``gradient_accumulation_steps``): each call adds the local gradients to per-variable accumulators and only
every k-th call, the update step, reduces the accumulated gradients over the ranks (one grouped
allreduce per k passes, as Horovod does) before they are clipped and applied. Keras averages the k
passes; with ``average_aggregated_gradients=False`` (Horovod's default) the reduced gradient is their sum.
"""

from __future__ import annotations

from typing import Callable

import commlib as _cl

from ..frameworks import check_predivide, predivide_factors, resolve_op


class GradientOptions:
    """Horovod's options for reducing gradients in an optimizer wrapper."""

    def __init__(self, compression=None, sparse_as_dense=False, gradient_predivide_factor=1.0,
                 backward_passes_per_step=1, average_aggregated_gradients=False, op=_cl.Average, groups=None,
                 process_set=None, scale_local_gradients=True):
        op = resolve_op(op)
        check_predivide(op, gradient_predivide_factor)
        if op is _cl.Adasum:
            raise NotImplementedError("op=Adasum is not supported with Keras (as in Horovod)")
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be a positive integer; got "
                             f"{backward_passes_per_step!r}")
        self.compression, self.sparse_as_dense, self.op, self.groups = compression, sparse_as_dense, op, groups
        self.prescale, self.postscale = predivide_factors(op, gradient_predivide_factor)
        self.process_set = process_set
        self.passes = backward_passes_per_step
        self.average_aggregated = bool(average_aggregated_gradients)
        self.scale_local_gradients = scale_local_gradients


def reducer(reduce: Callable, options: GradientOptions) -> Callable:
    """``reduced(grads, scale=1.0)``: ``grads`` (None entries stay None) reduced in one grouped call, the
    result multiplied by ``scale``."""
    def reduced(grads, scale=1.0):
        grads = list(grads)
        present = [i for i, g in enumerate(grads) if g is not None]
        if not present:
            return grads
        out = list(grads)
        values = reduce([grads[i] for i in present], op=options.op, compression=options.compression,
                        prescale_factor=options.prescale, postscale_factor=options.postscale * scale,
                        process_set=options.process_set)
        for i, v in zip(present, values):
            out[i] = v
        return out
    return reduced


def keras3_mixin(reduce: Callable, options: GradientOptions) -> type:
    """The methods a Keras 3 optimizer's wrapper overrides (see the module's docstring)."""
    reduced = reducer(reduce, options)
    accumulate = options.passes > 1
    # Keras averages the accumulated passes; Horovod's default (average_aggregated_gradients=False) sums them
    scale = 1.0 if options.average_aggregated else float(options.passes)

    class DistributedKeras3:
        def apply(self, grads, trainable_variables=None):
            if not accumulate:
                grads = reduced(grads)
            return super().apply(grads, trainable_variables)

        def _clip_gradients(self, grads):
            # with accumulation, Keras calls this once per update step, on the accumulated gradients
            if accumulate:
                grads = reduced(grads, scale)
            return super()._clip_gradients(grads)

    return DistributedKeras3


def wrap(optimizer, mixin: type, options: GradientOptions, name: str | None = None, config_update=None):
    """A copy of ``optimizer`` (same class name and config) whose class is ``mixin`` over its own class."""
    base = optimizer.__class__
    Distributed = type(base.__name__, (mixin, base), {"__module__": base.__module__,
                                                      "__qualname__": base.__qualname__})
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    config.update(config_update or {})
    wrapped = Distributed.from_config(config)
    wrapped._commlib_options = options
    return wrapped


def wrap_keras3(optimizer, reduce: Callable, options: GradientOptions, name: str | None = None,
                backend: str | None = None):
    """``optimizer`` (Keras 3) wrapped: gradients reduced in ``apply``, or every ``options.passes``-th
    update step through the optimizer's gradient accumulation."""
    own = getattr(optimizer, "gradient_accumulation_steps", None) or 1
    if options.passes > 1 and own > 1 and own != options.passes:
        raise ValueError(f"backward_passes_per_step={options.passes} differs from the optimizer's own "
                         f"gradient_accumulation_steps={own}; set one of them")
    if options.passes == 1 and own > 1:  # the optimizer accumulates itself: reduce once per update step
        options.passes, options.average_aggregated = own, True
    if options.passes > 1 and backend == "jax":
        raise NotImplementedError("backward_passes_per_step > 1 is not supported by commlib.keras on the JAX "
                                  "backend; use a larger batch, or commlib.jax.DistributedOptimizer's "
                                  "backward_passes_per_step in a JAX loop")
    update = {"gradient_accumulation_steps": options.passes} if options.passes > 1 else None
    return wrap(optimizer, keras3_mixin(reduce, options), options, name, update)
