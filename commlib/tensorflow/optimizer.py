"""Gradient reduction for TensorFlow: ``DistributedGradientTape``, ``PartialDistributedGradientTape`` and
the TF1 ``DistributedOptimizer`` (``tf.compat.v1.train.Optimizer``).

All gradients of one ``gradient()`` call travel in one grouped collective (one graph op): inside a
``tf.function`` a single op holds one inter-op thread at a time, so ranks cannot deadlock on a small
machine, and commlib fuses them. Horovod's ``groups`` split that call in several.
"""

from __future__ import annotations

import tensorflow as tf

import commlib as _cl

from ..frameworks import (check_predivide, excluded, local_layer_variables, predivide_factors, resolve_op,
                          set_size, split_evenly)
from .aggregation import variable_key as key
from .collectives import grouped_allreduce
from .compression import Compression




class GradientReducer:
    """Horovod's gradient options, applied to a list of gradients (None entries stay None)."""

    def __init__(self, compression=Compression.none, sparse_as_dense=False, op=_cl.Average,
                 gradient_predivide_factor=1.0, groups=None, process_set=_cl.global_process_set, name=None):
        op = resolve_op(op)
        check_predivide(op, gradient_predivide_factor)
        if groups is not None and not isinstance(groups, list):
            split_evenly([], groups)  # validates an int
        self.compression, self.sparse_as_dense, self.op = compression, sparse_as_dense, op
        self.prescale, self.postscale = predivide_factors(op, gradient_predivide_factor)
        self.groups, self.process_set, self.name = groups, process_set, name

    def _units(self, indices, sources):
        """The index lists reduced together: all of them, or Horovod's ``groups``."""
        if self.groups is None:
            return [indices]
        if isinstance(self.groups, list):
            position = {key(sources[i]): i for i in indices if sources[i] is not None}
            units, seen = [], set()
            for group in self.groups:
                unit = [position[key(v)] for v in group if key(v) in position and position[key(v)] not in seen]
                seen.update(unit)
                if unit:
                    units.append(unit)
            return units + [[i] for i in indices if i not in seen]
        return split_evenly(indices, self.groups)

    def __call__(self, grads, sources=None, use_generic_names=False):
        grads = list(grads)
        if excluded(self.process_set):
            return grads
        if self.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        present = [i for i, g in enumerate(grads) if g is not None]
        out = list(grads)
        for n, unit in enumerate(self._units(present, sources or [None] * len(grads))):
            name = f"{self.name}.{n}" if self.name and use_generic_names else None
            reduced = grouped_allreduce([grads[i] for i in unit], compression=self.compression, op=self.op,
                                        prescale_factor=self.prescale, postscale_factor=self.postscale,
                                        process_set=self.process_set, name=name)
            for i, r in zip(unit, reduced):
                out[i] = r
        return out


class _DistributedGradientTape(tf.GradientTape):
    """A ``tf.GradientTape`` whose ``gradient()`` averages the gradients over the ranks."""

    def __init__(self, tape, reducer: GradientReducer, persistent=False, watch_accessed_variables=True,
                 scale_local_gradients=True):
        super().__init__(persistent, watch_accessed_variables)
        self._tape = tape
        self._reducer = reducer
        self.process_set = reducer.process_set
        self.scale_local_gradients = scale_local_gradients
        self._local_sources = set()

    def register_local_source(self, source):
        """Keep ``source``'s gradient local to this rank (it is not reduced; scaled by 1/size unless
        ``scale_local_gradients=False``)."""
        self._local_sources.add(key(source))

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False, **kwargs):
        flat_sources = tf.nest.flatten(sources)
        gradients = tf.nest.flatten(super().gradient(target, flat_sources, output_gradients, **kwargs),
                                    expand_composites=False)
        is_local = [key(s) in self._local_sources for s in flat_sources]
        shared = [i for i, local in enumerate(is_local) if not local]
        reduced = self._reducer([gradients[i] for i in shared], [flat_sources[i] for i in shared],
                                use_generic_names)
        out = list(gradients)
        for i, r in zip(shared, reduced):
            out[i] = r
        if self.scale_local_gradients and self._local_sources:
            ranks = float(set_size(None if self.process_set is _cl.global_process_set else self.process_set))
            for i, local in enumerate(is_local):
                g = out[i]
                if local and g is not None:
                    out[i] = (tf.IndexedSlices(g.values / ranks, g.indices, g.dense_shape)
                              if isinstance(g, tf.IndexedSlices) else g / ranks)
        return tf.nest.pack_sequence_as(sources, out)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None, use_generic_names=False):
        """``(local, global)`` lists of (source, gradient) pairs."""
        gradients = self.gradient(target, sources, output_gradients, use_generic_names)
        local, shared = [], []
        for s, g in zip(sources, gradients):
            (local if key(s) in self._local_sources else shared).append((s, g))
        return local, shared


def DistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                            sparse_as_dense=False, op=_cl.Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=_cl.global_process_set, scale_local_gradients=True):
    """Wrap ``gradtape`` (a ``tf.GradientTape``) so that ``gradient()`` reduces the gradients over the ranks.

    Example::

        with tf.GradientTape() as tape:
            loss = loss_fn(model(x), y)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
    """
    if num_groups and groups is None:
        groups = num_groups
    reducer = GradientReducer(compression, sparse_as_dense, op, gradient_predivide_factor, groups, process_set,
                              name="DistributedGradientTape")
    return _DistributedGradientTape(gradtape._tape, reducer, gradtape._persistent,
                                    gradtape._watch_accessed_variables, scale_local_gradients)


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                                   sparse_as_dense=False, op=_cl.Average, gradient_predivide_factor=1.0,
                                   num_groups=0, groups=None, process_set=_cl.global_process_set,
                                   local_layers=None, scale_local_gradients=True):
    """A :func:`DistributedGradientTape` whose ``local_layers``' (a Keras layer or a list) variables keep
    their local gradients (model parallelism)."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set,
                                   scale_local_gradients)
    for var in local_layer_variables(local_layers):
        tape.register_local_source(var)
    return tape


class _DistributedLegacyOptimizer(tf.compat.v1.train.Optimizer):
    """A TF1 optimizer whose ``compute_gradients`` reduces the gradients over the ranks."""

    def __init__(self, optimizer, reducer: GradientReducer, name=None, use_locking=False):
        self._optimizer = optimizer
        self._reducer = reducer
        self._local_vars = set()
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)

    def register_local_var(self, var):
        """Keep ``var``'s gradient local to this rank."""
        self._local_vars.add(key(var))

    def compute_gradients(self, *args, **kwargs):
        grads_and_vars = list(self._optimizer.compute_gradients(*args, **kwargs))
        shared = [i for i, (_, v) in enumerate(grads_and_vars) if key(v) not in self._local_vars]
        reduced = self._reducer([grads_and_vars[i][0] for i in shared], [grads_and_vars[i][1] for i in shared])
        out = list(grads_and_vars)
        for i, g in zip(shared, reduced):
            out[i] = (g, grads_and_vars[i][1])
        return out

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                         op=_cl.Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=_cl.global_process_set,
                         scale_local_gradients=True):
    """Wrap a ``tf.compat.v1.train.Optimizer`` (TF1 graphs) or a Keras optimizer so that gradients are
    reduced over the ranks before they are applied. A Keras optimizer goes to
    ``commlib.keras.DistributedOptimizer`` (which ``commlib.tensorflow.keras`` re-exports)."""
    if num_groups and groups is None:
        groups = num_groups
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if backward_passes_per_step != 1:
            raise NotImplementedError("backward_passes_per_step > 1 is not supported for TF1 optimizers; "
                                      "accumulate gradients yourself or use a Keras optimizer")
        reducer = GradientReducer(compression, sparse_as_dense, op, gradient_predivide_factor, groups,
                                  process_set, name="DistributedOptimizer")
        return _DistributedLegacyOptimizer(optimizer, reducer, name, use_locking)
    from ..keras import DistributedOptimizer as _keras_optimizer

    return _keras_optimizer(optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
                            gradient_predivide_factor=gradient_predivide_factor,
                            backward_passes_per_step=backward_passes_per_step,
                            average_aggregated_gradients=average_aggregated_gradients, op=op, groups=groups,
                            process_set=process_set, scale_local_gradients=scale_local_gradients)
