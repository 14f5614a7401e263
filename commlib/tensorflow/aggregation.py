"""Local gradient accumulation for TensorFlow optimizers (Horovod's ``backward_passes_per_step``).

Each call adds the gradients to one accumulator variable per model variable and counts; the k-th call
(the update step) reduces the accumulated gradients over the ranks in one grouped collective, applies
them, and zeroes the accumulators and the counter. The other calls only advance the optimizer's
``iterations``. Written with ``tf.cond`` on variables, so it runs eagerly and inside ``tf.function``
(``model.fit``) alike; every rank takes the same branch, since every rank counts the same calls.
"""

from __future__ import annotations

from typing import Callable, Sequence

import tensorflow as tf


def variable_key(variable):
    """A hashable key of a TensorFlow or Keras 3 variable (Keras 3's have no ``ref()``)."""
    return variable.ref() if hasattr(variable, "ref") else id(variable)


class GradientAccumulator:
    """Sums ``passes`` backward passes, then reduces and applies them.

    ``reduce(grads, variables)`` returns the reduced gradients; ``average``: divide the sum by ``passes``
    before reducing (Horovod's ``average_aggregated_gradients``). ``counter`` is the number of passes
    accumulated since the last update step (a ``tf.Variable``)."""

    def __init__(self, passes: int, average: bool, reduce: Callable):
        if passes < 2:
            raise ValueError(f"gradient accumulation needs at least 2 passes; got {passes}")
        self.passes, self.average, self._reduce = passes, average, reduce
        self.counter = None
        self._sums: dict = {}

    def _build(self, variables: Sequence) -> None:
        with tf.init_scope():  # once, outside any tf.function or branch
            if self.counter is None:
                self.counter = tf.Variable(0, dtype=tf.int32, trainable=False, name="commlib_passes")
            for v in variables:
                if variable_key(v) not in self._sums:
                    self._sums[variable_key(v)] = tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                                      name="commlib_accumulated_gradient")

    def __call__(self, grads: Sequence, variables: Sequence, apply: Callable, iterations) -> tf.Tensor:
        """Accumulate ``grads`` (of ``variables``; None entries are left out); on the update step call
        ``apply(pairs)`` with the reduced (gradient, variable) pairs, else advance ``iterations``. Returns
        True on an update step (a boolean tensor)."""
        present = [i for i, g in enumerate(grads) if g is not None]
        pvars = [variables[i] for i in present]
        self._build(pvars)
        sums = [self._sums[variable_key(v)] for v in pvars]
        for s, i in zip(sums, present):
            s.assign_add(tf.convert_to_tensor(grads[i], dtype_hint=s.dtype))
        count = self.counter.assign_add(1)

        def update():
            values = [s.read_value() for s in sums]
            if self.average:
                values = [v / tf.cast(self.passes, v.dtype) for v in values]
            reduced = self._reduce(values, pvars)
            with tf.control_dependencies([r for r in reduced if r is not None]):
                apply(list(zip(reduced, pvars)))
                for s in sums:
                    s.assign(tf.zeros_like(s))
                self.counter.assign(0)
            return tf.constant(True)

        def skip():
            iterations.assign_add(1)
            return tf.constant(False)

        return tf.cond(tf.equal(count, self.passes), update, skip)
