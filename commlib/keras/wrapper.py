"""What the Keras optimizer wrappers share: Horovod's options, the grouped reduction of a gradient list,
and the wrapper class made over the optimizer's own class (:mod:`.keras3` and :mod:`.tf_keras` give it
the methods that reduce)."""

from __future__ import annotations

from typing import Callable

import commlib as _cl

from ..compression import Compression
from ..frameworks import check_predivide, excluded, predivide_factors, resolve_op
from . import backend as _backend


class GradientOptions:
    """Horovod's options for reducing gradients in an optimizer wrapper."""

    def __init__(self, compression=Compression.none, sparse_as_dense=False, gradient_predivide_factor=1.0,
                 backward_passes_per_step=1, average_aggregated_gradients=False, op=_cl.Average, groups=None,
                 process_set=_cl.global_process_set, scale_local_gradients=True):
        op = resolve_op(op)
        check_predivide(op, gradient_predivide_factor)
        if op is _cl.Adasum:
            raise NotImplementedError("op=Adasum is not supported with Keras (as in Horovod)")
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be a positive integer; got "
                             f"{backward_passes_per_step!r}")
        if groups is not None and not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
            raise ValueError(f"groups must be a positive integer or a list of lists of variables; got {groups!r}")
        self.compression, self.sparse_as_dense, self.op, self.groups = compression, sparse_as_dense, op, groups
        self.prescale, self.postscale = predivide_factors(op, gradient_predivide_factor)
        self.process_set = process_set
        self.passes = backward_passes_per_step
        self.average_aggregated = bool(average_aggregated_gradients)
        self.scale_local_gradients = scale_local_gradients


def reducer(reduce: Callable, options: GradientOptions) -> Callable:
    """``reduced(grads, scale=1.0)``: ``grads`` (None entries stay None) reduced in one grouped call, the
    result multiplied by ``scale``; on a rank outside ``options.process_set``, its own ``grads`` (times
    ``scale``), as Horovod's wrappers pass them through there."""
    def reduced(grads, scale=1.0):
        grads = list(grads)
        present = [i for i, g in enumerate(grads) if g is not None]
        if not present:
            return grads
        if excluded(options.process_set):
            return grads if scale == 1.0 else [None if g is None else g * scale for g in grads]
        out = list(grads)
        values = reduce([grads[i] for i in present], op=options.op, compression=options.compression,
                        prescale_factor=options.prescale, postscale_factor=options.postscale * scale,
                        process_set=options.process_set)
        for i, v in zip(present, values):
            out[i] = v
        return out
    return reduced


def reduce_for(options: GradientOptions, backend: str | None = None) -> Callable:
    """The grouped allreduce of ``backend``'s plug-in (Keras 3's backend when None), densifying
    ``tf.IndexedSlices`` first with ``sparse_as_dense``."""
    def reduce(grads, **kwargs):
        if options.sparse_as_dense and (backend or _backend.backend_name()) == "tensorflow":
            import tensorflow as tf

            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        return _backend.grouped_allreduce(grads, backend=backend, **kwargs)
    return reduce


def wrap(optimizer, mixin: type, options: GradientOptions, name: str | None = None, config_update=None,
         in_place: bool = False):
    """``optimizer`` with ``mixin`` over its own class: a copy from its config (same class name, ``name``
    and ``config_update`` applied), or, ``in_place``, the optimizer itself with its class replaced, so its
    variables and their values (moments, iterations) stay."""
    base = optimizer.__class__
    Distributed = type(base.__name__, (mixin, base), {"__module__": base.__module__,
                                                      "__qualname__": base.__qualname__})
    if in_place:
        optimizer.__class__ = Distributed
        wrapped = optimizer
    else:
        config = optimizer.get_config()
        if name is not None:
            config["name"] = name
        config.update(config_update or {})
        wrapped = Distributed.from_config(config)
    wrapped._commlib_options = options
    return wrapped


def is_distributed(optimizer) -> bool:
    """True when ``optimizer`` came from :func:`wrap` (its gradients are reduced already)."""
    return hasattr(optimizer, "_commlib_options")
