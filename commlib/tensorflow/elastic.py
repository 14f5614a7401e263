"""``horovod.tensorflow.elastic`` on commlib: ``TensorFlowState`` and ``KerasState`` over commlib.elastic's
``ObjectState`` (with ``run``, ``ObjectState`` and ``HostsUpdatedInterrupt`` re-exported).

Variables are saved as numpy copies on ``commit()``, assigned back on ``restore()``, and ``sync()`` gives
every rank rank 0's values (one grouped broadcast) before saving them. Eager mode only (TensorFlow 2), as
in Horovod. Recovery is by restart under commlib-run's elastic driver (docs/elastic.md).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ..elastic import HorovodInternalError, HostsUpdatedInterrupt, ObjectState, State, run, run_fn  # noqa: F401
from ..api import broadcast_object
from .functions import broadcast_variables

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "KerasState", "ObjectState", "State",
           "TensorFlowState", "run", "run_fn"]


def _value(variable) -> np.ndarray:
    value = variable.numpy() if hasattr(variable, "numpy") else np.asarray(variable.value)
    return np.array(value, copy=True)


class TensorFlowState(ObjectState):
    """``TensorFlowState(variables, epoch=0, batch=0)``: ``commit()``, ``restore()`` and ``sync()`` cover
    the variables and the other named values."""

    def __init__(self, variables=None, session=None, **kwargs):
        if session is not None or not tf.executing_eagerly():
            raise NotImplementedError("commlib.tensorflow.elastic supports TensorFlow 2's eager mode only (no "
                                      "TF1 graphs), as Horovod does")
        self._tf_variables = list(variables or [])
        self._tf_saved: list = []
        super().__init__(bcast_object=broadcast_object, **kwargs)
        self._save_variables()

    def _variables(self) -> list:
        return self._tf_variables

    def _save_variables(self) -> None:
        self._tf_saved = [(v, _value(v)) for v in self._variables()]

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        for variable, value in self._tf_saved:
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        broadcast_variables(self._variables(), root_rank=0)
        super().sync()
        self.save()  # what every rank now holds is the point to come back to

    def snapshot(self):
        return {"variables": [value for _, value in self._tf_saved], "objects": super().snapshot()}

    def load(self, snapshot) -> None:
        self._tf_saved = [(v, value) for (v, _), value in zip(self._tf_saved, snapshot["variables"])]
        for variable, value in self._tf_saved:
            variable.assign(value)
        super().load(snapshot["objects"])


class KerasState(TensorFlowState):
    """``KerasState(model, optimizer=None, epoch=0, batch=0)``: the model's variables and the optimizer's
    (those it has when saved) as a :class:`TensorFlowState`; ``state.model`` and ``state.optimizer``."""

    def __init__(self, model, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        super().__init__(None, **kwargs)

    def _variables(self) -> list:
        variables = list(self.model.variables)
        if self.optimizer is not None:
            extra = self.optimizer.variables
            variables += list(extra() if callable(extra) else extra)
        return variables
