"""``DistributedOptimizer`` for Keras: the wrapped optimizer's class, with gradients reduced over the ranks
before they are applied.

The wrapper subclasses the optimizer's own class (so ``isinstance``, ``get_config``, its variables and
serialization stay the optimizer's) and overrides the one method every training step goes through:
Keras 3's ``apply`` (``fit``, ``apply_gradients`` and custom loops all reach it), or tf-keras'
``apply_gradients``. ``reduce`` is the backend's grouped allreduce.
"""

from __future__ import annotations

from typing import Callable

import commlib as _cl

from ..frameworks import check_predivide, predivide_factors, resolve_op


class GradientOptions:
    """Horovod's options for reducing gradients in an optimizer wrapper."""

    def __init__(self, compression=None, sparse_as_dense=False, gradient_predivide_factor=1.0,
                 backward_passes_per_step=1, average_aggregated_gradients=False, op=_cl.Average, groups=None,
                 process_set=None):
        op = resolve_op(op)
        check_predivide(op, gradient_predivide_factor)
        if op is _cl.Adasum:
            raise NotImplementedError("op=Adasum is not supported with Keras (as in Horovod)")
        if backward_passes_per_step != 1:
            raise NotImplementedError("backward_passes_per_step > 1 is not supported by commlib's Keras "
                                      "optimizer yet; use a larger batch or accumulate gradients in a custom loop")
        self.compression, self.sparse_as_dense, self.op, self.groups = compression, sparse_as_dense, op, groups
        self.prescale, self.postscale = predivide_factors(op, gradient_predivide_factor)
        self.process_set = process_set


def wrap(optimizer, method: str, reduce: Callable, options: GradientOptions, name: str | None = None):
    """A copy of ``optimizer`` (same class and config) whose ``method`` reduces the gradients first.

    ``method`` is ``"apply"`` (Keras 3: ``apply(grads, trainable_variables=None)``) or ``"apply_gradients"``
    (tf-keras: ``apply_gradients(grads_and_vars, ...)``)."""
    base = optimizer.__class__

    def reduced(grads):
        grads = list(grads)
        present = [i for i, g in enumerate(grads) if g is not None]
        if not present:
            return grads
        out = list(grads)
        values = reduce([grads[i] for i in present], op=options.op, compression=options.compression,
                        prescale_factor=options.prescale, postscale_factor=options.postscale,
                        process_set=options.process_set)
        for i, v in zip(present, values):
            out[i] = v
        return out

    if method == "apply":
        class Distributed(base):
            def apply(self, grads, trainable_variables=None):
                return super().apply(reduced(grads), trainable_variables)
    else:
        class Distributed(base):
            def apply_gradients(self, grads_and_vars, *args, **kwargs):
                pairs = list(grads_and_vars)
                grads = reduced([g for g, _ in pairs])
                return super().apply_gradients(list(zip(grads, [v for _, v in pairs])), *args, **kwargs)

    Distributed.__name__ = Distributed.__qualname__ = base.__name__
    Distributed.__module__ = base.__module__
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    wrapped = Distributed.from_config(config)
    wrapped._commlib_options = options
    return wrapped
