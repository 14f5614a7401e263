"""``TorchState``: a model, an optimizer, elastic samplers and plain attributes as elastic state
(Horovod Elastic's ``hvd.elastic.TorchState``).

Each value has a handler that knows how to save it (a deep copy of its ``state_dict()``), restore it
(``load_state_dict``) and synchronise it from rank 0 (``broadcast_parameters``,
``broadcast_optimizer_state``, ``broadcast_object``); other keyword arguments are plain attributes, as in
:class:`commlib.elastic.ObjectState`.
"""

from __future__ import annotations

import copy

import torch

from ...elastic import ObjectState
from ..functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .sampler import ElasticSampler


class _Handler:
    def __init__(self, value):
        self.value = value
        self.saved = None
        self.save()

    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(copy.deepcopy(self.saved))


class _ModelHandler(_Handler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))


#: value type -> handler; the first match wins
HANDLERS = [(torch.nn.Module, _ModelHandler), (torch.optim.Optimizer, _OptimizerHandler),
            (ElasticSampler, _SamplerHandler)]


def _handler(value):
    for kind, handler in HANDLERS:
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState(ObjectState):
    """``TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)``: ``commit()``, ``restore()`` and
    ``sync()`` cover every value; ``state.model`` and the other names read and set them."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        values = dict(kwargs)
        if model is not None:
            values["model"] = model
        if optimizer is not None:
            values["optimizer"] = optimizer
        handlers = {name: h for name, h in ((name, _handler(v)) for name, v in values.items()) if h is not None}
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, **{k: v for k, v in values.items() if k not in handlers})

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:  # a new model or optimizer object: track it from now on
            handlers[name] = _handler(value)
        object.__setattr__(self, name, value)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()
        self.save()  # what every rank now holds is the point to come back to

    def snapshot(self):
        return {"handlers": {name: h.saved for name, h in self._handlers.items()}, "objects": super().snapshot()}

    def load(self, snapshot) -> None:
        for name, saved in snapshot["handlers"].items():
            if name in self._handlers:
                self._handlers[name].saved = saved
                self._handlers[name].restore()
        super().load(snapshot["objects"])
