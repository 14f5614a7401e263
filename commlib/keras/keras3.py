"""The optimizer wrapper for Keras 3, on every backend: gradients reduced in ``apply`` (``fit``,
``apply_gradients`` and custom loops all reach it) by the grouped allreduce of the backend's plug-in
(:mod:`.backend`).

``backward_passes_per_step=k`` uses Keras' own gradient accumulation (the optimizer's
``gradient_accumulation_steps``): each call adds the local gradients to per-variable accumulators and only
every k-th call, the update step, reduces the accumulated gradients over the ranks (one grouped
allreduce per k passes, as Horovod does) before they are clipped and applied. Keras averages the k
passes; with ``average_aggregated_gradients=False`` (Horovod's default) the reduced gradient is their sum.
"""

from __future__ import annotations

from typing import Callable

from . import backend as _backend
from .wrapper import GradientOptions, reduce_for, reducer
from .wrapper import wrap as _wrap


def _mixin(reduce: Callable, options: GradientOptions) -> type:
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


def wrap(optimizer, options: GradientOptions, name: str | None = None, in_place: bool = False):
    """``optimizer`` (Keras 3) wrapped: gradients reduced in ``apply``, or every ``options.passes``-th
    update step through the optimizer's gradient accumulation."""
    own = getattr(optimizer, "gradient_accumulation_steps", None) or 1
    if options.passes > 1 and own > 1 and own != options.passes:
        raise ValueError(f"backward_passes_per_step={options.passes} differs from the optimizer's own "
                         f"gradient_accumulation_steps={own}; set one of them")
    if options.passes == 1 and own > 1:  # the optimizer accumulates itself: reduce once per update step
        options.passes, options.average_aggregated = own, True
    if options.passes > 1 and _backend.backend_name() == "jax":
        raise NotImplementedError("backward_passes_per_step > 1 is not supported by commlib.keras on the JAX "
                                  "backend; use a larger batch, or commlib.jax.DistributedOptimizer's "
                                  "backward_passes_per_step in a JAX loop")
    update = {"gradient_accumulation_steps": options.passes} if options.passes > 1 else None
    return _wrap(optimizer, _mixin(reduce_for(options), options), options, name, update, in_place)
