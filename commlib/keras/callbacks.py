"""Horovod's Keras callbacks, for Keras 3 and for tf-keras (each made on the Keras it is given).

- ``BroadcastGlobalVariablesCallback(root_rank)``: after the first batch (when the optimizer's variables
  exist), every rank takes ``root_rank``'s model and optimizer variables.
- ``MetricAverageCallback()``: at the end of each epoch the logged metrics are averaged over the ranks.
- ``LearningRateScheduleCallback(initial_lr, multiplier, start_epoch, end_epoch, staircase, momentum_correction,
  steps_per_epoch)``: the learning rate is ``initial_lr * multiplier(epoch)`` between the epochs given.
- ``LearningRateWarmupCallback(initial_lr, warmup_epochs, momentum_correction, steps_per_epoch, verbose)``:
  the rate ramps from ``initial_lr / size`` to ``initial_lr`` over the first epochs (Goyal et al.).
"""

from __future__ import annotations

import functools
import types

import numpy as np

import commlib as _cl

from ..frameworks import set_kwargs
from . import backend as B


def _variables(model, optimizer=None, exclude=()):
    out = list(model.variables)
    opt = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    if opt is not None:
        out += [v for v in opt.variables if all(v is not o for o in out)]
    skip = {id(v) for v in exclude}
    return [v for v in out if id(v) not in skip]


def broadcast_variables(variables, root_rank: int = 0, process_set=None, name="broadcast_variables"):
    """Give every rank ``root_rank``'s values of ``variables`` (Keras or TensorFlow variables)."""
    variables = list(variables)
    values = B.broadcast_values([B.to_numpy(v) for v in variables], root_rank, name, process_set)
    for v, value in zip(variables, values):
        v.assign(value.reshape(tuple(v.shape)))


def _get_lr(optimizer) -> float:
    return float(B.to_numpy(optimizer.learning_rate))


def _set_lr(optimizer, value: float) -> None:
    lr = optimizer.learning_rate
    if hasattr(lr, "assign"):
        lr.assign(value)
    else:
        optimizer.learning_rate = value


def _set_momentum(optimizer, value: float) -> None:
    momentum = getattr(optimizer, "momentum", None)
    if momentum is None:
        return
    if hasattr(momentum, "assign"):
        momentum.assign(value)
    else:
        optimizer.momentum = value


def make(keras) -> types.SimpleNamespace:
    """The callback classes, subclassing ``keras.callbacks.Callback`` of the Keras given (made once per
    Keras: ``tf.keras`` that is Keras 3 gets the classes ``keras`` gets)."""
    return _make(keras.callbacks.Callback)


@functools.lru_cache(maxsize=None)
def _make(Callback: type) -> types.SimpleNamespace:

    class BroadcastGlobalVariablesCallback(Callback):
        """Broadcast the model's and optimizer's variables from ``root_rank`` after the first batch."""

        def __init__(self, root_rank: int = 0, device="", local_variables=None, process_set=None):
            super().__init__()
            self.root_rank, self.process_set = root_rank, process_set
            self.local_variables = list(local_variables or [])
            self.broadcast_done = False

        def on_batch_end(self, batch, logs=None):
            if self.broadcast_done:
                return
            broadcast_variables(_variables(self.model, exclude=self.local_variables), self.root_rank,
                                self.process_set, name="BroadcastGlobalVariablesCallback")
            self.broadcast_done = True

        on_train_batch_end = on_batch_end

    class MetricAverageCallback(Callback):
        """Average the epoch's logged metrics over the ranks (in sorted name order, one allreduce)."""

        def __init__(self, device="", process_set=None):
            super().__init__()
            self.process_set = process_set

        def on_epoch_end(self, epoch, logs=None):
            if not logs:
                return
            keys = sorted(k for k, v in logs.items() if np.ndim(B.to_numpy(v)) == 0)
            values = np.array([float(B.to_numpy(logs[k])) for k in keys], np.float64)
            averaged = _cl.allreduce(values, op=_cl.Average, name=f"MetricAverageCallback.{epoch}",
                                     **set_kwargs(self.process_set))
            for k, v in zip(keys, averaged):
                logs[k] = float(v)

    class LearningRateScheduleCallback(Callback):
        """``initial_lr * multiplier`` (a number, or a function of the epoch) from ``start_epoch`` to
        ``end_epoch``; with ``staircase=False`` the epoch is fractional, updated every batch."""

        def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                     momentum_correction=True, steps_per_epoch=None):
            super().__init__()
            self.initial_lr, self.start_epoch, self.end_epoch = initial_lr, start_epoch, end_epoch
            self.staircase, self.momentum_correction = staircase, momentum_correction
            self.steps_per_epoch = steps_per_epoch
            self.current_epoch = None
            self.restore_momentum = None
            self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)

        def _adjust(self, epoch):
            optimizer = self.model.optimizer
            old_lr = _get_lr(optimizer)
            new_lr = self.initial_lr * self.multiplier(epoch)
            _set_lr(optimizer, new_lr)
            momentum = getattr(optimizer, "momentum", None)
            if momentum is not None and self.momentum_correction and old_lr > 0:
                self.restore_momentum = float(B.to_numpy(momentum))
                _set_momentum(optimizer, self.restore_momentum * new_lr / old_lr)

        def _restore(self):
            if self.restore_momentum is not None:
                _set_momentum(self.model.optimizer, self.restore_momentum)
                self.restore_momentum = None

        def _in_range(self, epoch):
            return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

        def on_train_begin(self, logs=None):
            if self.initial_lr is None:
                self.initial_lr = _get_lr(self.model.optimizer)
            if not self.staircase and not self.steps_per_epoch:
                self.steps_per_epoch = self.params.get("steps") if self.params else None
                if not self.steps_per_epoch:
                    raise ValueError("LearningRateScheduleCallback(staircase=False) needs steps_per_epoch")

        def on_epoch_begin(self, epoch, logs=None):
            self.current_epoch = epoch

        def on_batch_begin(self, batch, logs=None):
            if not self._in_range(self.current_epoch):
                return
            if self.staircase and batch == 0:
                self._adjust(self.current_epoch)
            elif not self.staircase:
                self._adjust(self.current_epoch + float(batch) / self.steps_per_epoch)

        def on_batch_end(self, batch, logs=None):
            self._restore()

        on_train_batch_begin = on_batch_begin
        on_train_batch_end = on_batch_end

        def on_epoch_end(self, epoch, logs=None):
            if logs is not None:
                logs["lr"] = _get_lr(self.model.optimizer)

    class LearningRateWarmupCallback(LearningRateScheduleCallback):
        """Ramp the rate from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs``."""

        def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None,
                     verbose=0):
            size = _cl.size()

            def multiplier(epoch):
                epoch += 1.0 / self.steps_per_epoch
                return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

            super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                             momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
            self.verbose = verbose

        def on_epoch_end(self, epoch, logs=None):
            super().on_epoch_end(epoch, logs)
            if epoch == self.end_epoch - 1 and self.verbose > 0 and _cl.rank() == 0:
                print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {_get_lr(self.model.optimizer):g}.")

    return types.SimpleNamespace(
        BroadcastGlobalVariablesCallback=BroadcastGlobalVariablesCallback,
        MetricAverageCallback=MetricAverageCallback,
        LearningRateScheduleCallback=LearningRateScheduleCallback,
        LearningRateWarmupCallback=LearningRateWarmupCallback,
    )
