"""LocalSGD: average models every few steps instead of gradients every step (PyTorch's model averaging).

``PeriodicModelAverager(period, warmup_steps)`` and ``HierarchicalModelAverager(period_group_size_dict,
warmup_steps)`` have the semantics of ``torch.distributed.algorithms.model_averaging.averagers``: each
``average_parameters(params)`` call is one step (counted in ``averager.step``); no averaging before
``warmup_steps``; then the periodic one averages over all ranks when ``(step - warmup_steps) % period ==
0``, and the hierarchical one averages within groups of the size mapped to the largest period that divides
``step`` (e.g. ``{2: local_size(), 8: size()}``: within a host every 2 steps, over all ranks every 8).
``LocalSGDOptimizer(optimizer, averager)`` is ``PostLocalSGDOptimizer``: ``step()`` steps the local
optimizer, then lets the averager average the parameters.

Groups. Every average is a commlib grouped allreduce (the coordinator, fusion, the chosen algorithm, and
``COMMLIB_TIMEOUT`` on every wait: a lost peer is ``PeerLostError`` on every live rank). Over all ranks it
runs on the world; a smaller group size ``g`` gets one process set per group (ranks ``[i*g, (i+1)*g)``; a
host's ranks when ``g`` is ``local_size()``), whose own coordinator averages within it with the algorithm
its shape calls for. The sets are added when the averager is created (collective: create averagers on every
rank in the same order) and removed by ``close()``.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

import commlib as _cl

from . import collectives as C
from .local_optimizer import LocalOptimizerWrapper


def _parameters(params) -> list[torch.Tensor]:
    """The tensors of ``params``: parameters, or param_groups (dicts with "params"), as PyTorch accepts."""
    params = list(params)
    if params and isinstance(params[0], dict):
        return [p for group in params for p in group["params"]]
    return params


class ModelAverager:
    """Base: counts steps; subclasses decide when and over which ranks to average."""

    def __init__(self, warmup_steps: int = 0):
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.warmup_steps = int(warmup_steps)
        self.step = 0
        self._groups: dict[int, _cl.ProcessSet] = {}  # group size -> this rank's group (sizes below size())
        self._added: list[_cl.ProcessSet] = []  # every process set this averager registered, in order

    def average_parameters(self, params) -> None:
        raise NotImplementedError

    def _average(self, params, group_size: int) -> None:
        """Replace every parameter by its mean over the ``group_size`` ranks of this rank's group."""
        tensors = [p.data for p in _parameters(params)]
        if not tensors or group_size == 1:
            return
        group = None if group_size == _cl.size() else self._groups[group_size]
        C.grouped_allreduce_(tensors, op=C.Average, name=f"localsgd.{type(self).__name__}", process_set=group)

    def _add_groups(self, group_size: int) -> None:
        """Register the process sets of ``group_size`` consecutive ranks (collective over all ranks)."""
        size = _cl.size()
        if group_size < 1 or size % group_size:
            raise ValueError(f"a group size must divide the number of ranks ({size}), got {group_size}")
        if group_size in (1, size) or group_size in self._groups:
            return
        for start in range(0, size, group_size):
            try:
                group = _cl.add_process_set(range(start, start + group_size))
            except _cl.ProcessSetError as exc:  # every rank raises alike: take back what this averager added
                self.close()
                raise _cl.ProcessSetError(f"{type(self).__name__} cannot register its group of ranks "
                                          f"{list(range(start, start + group_size))}: {exc}. close() any other "
                                          "averager with this group size, or remove your own set of these "
                                          "ranks, first") from exc
            self._added.append(group)
            if group.included():
                self._groups[group_size] = group

    def close(self) -> None:
        """Remove the averager's process sets (call on every rank, before ``shutdown()``)."""
        if _cl.is_initialized():
            for group in reversed(self._added):
                _cl.remove_process_set(group)
        self._added.clear()
        self._groups.clear()


class PeriodicModelAverager(ModelAverager):
    """Average the parameters over all ranks every ``period`` steps once ``warmup_steps`` have passed.

    Example::

        averager = hvd.PeriodicModelAverager(period=8, warmup_steps=100)
        for x, y in batches:
            opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
            averager.average_parameters(model.parameters())
    """

    def __init__(self, period: int, warmup_steps: int = 0):
        super().__init__(warmup_steps)
        if int(period) != period or period < 1:
            raise ValueError(f"period must be a positive integer, got {period!r}")
        if period == 1:
            import warnings

            warnings.warn("PeriodicModelAverager with period 1 averages every step: plain synchronous "
                          "training with parameters instead of gradients on the wire", stacklevel=2)
        self.period = int(period)

    def average_parameters(self, params) -> None:
        if self.step >= self.warmup_steps and (self.step - self.warmup_steps) % self.period == 0:
            self._average(params, _cl.size())
        self.step += 1


class HierarchicalModelAverager(ModelAverager):
    """Average within groups of ranks at several periods: ``period_group_size_dict`` maps a period to a
    group size (ascending periods; the largest group must be all ranks). At each step after warm-up the
    largest period that divides the step picks the group. Default: ``{2: local_size(), 4: size()}``."""

    def __init__(self, period_group_size_dict: dict | None = None, warmup_steps: int = 0):
        super().__init__(warmup_steps)
        if period_group_size_dict is None:
            period_group_size_dict = {2: _cl.local_size(), 4: _cl.size()}
        if not period_group_size_dict:
            raise ValueError("period_group_size_dict must not be empty")
        periods = list(period_group_size_dict)
        if periods != sorted(periods) or any(int(p) != p or p < 1 for p in periods):
            raise ValueError(f"periods must be positive integers in ascending order, got {periods}")
        if list(period_group_size_dict.values())[-1] != _cl.size():
            raise ValueError(f"the last group size must be the number of ranks ({_cl.size()}), got "
                             f"{list(period_group_size_dict.values())[-1]}")
        self.period_group_size_dict = OrderedDict(period_group_size_dict)
        for group_size in self.period_group_size_dict.values():
            self._add_groups(int(group_size))

    def _group_size(self) -> int | None:
        for period in reversed(self.period_group_size_dict):
            if self.step % period == 0:
                return int(self.period_group_size_dict[period])
        return None

    def average_parameters(self, params) -> None:
        if self.step >= self.warmup_steps:
            group_size = self._group_size()
            if group_size is not None:
                self._average(params, group_size)
        self.step += 1


class LocalSGDOptimizer(LocalOptimizerWrapper):
    """PyTorch's ``PostLocalSGDOptimizer``: ``step()`` runs the wrapped (local) optimizer, then
    ``averager.average_parameters``. During the averager's ``warmup_steps`` the gradients are first
    averaged over all ranks (synchronous SGD, as PyTorch's post-localSGD communication hook does before
    local SGD starts). Wrap a plain ``torch.optim`` optimizer, not a DistributedOptimizer.

    Example::

        opt = hvd.LocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    hvd.PeriodicModelAverager(period=8, warmup_steps=20))
    """

    def __init__(self, optimizer: torch.optim.Optimizer, averager: ModelAverager):
        super().__init__(optimizer, "would average gradients every step as well")
        self.averager = averager

    def __repr__(self):
        return f"LocalSGDOptimizer({self.optim!r})"

    def state_dict(self):
        """The wrapped optimizer's state plus the averager's step."""
        state = self.optim.state_dict()
        state["step"] = self.averager.step
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        self.averager.step = state_dict.pop("step", 0)
        self.optim.load_state_dict(state_dict)

    def step(self, closure=None):
        if self.averager.step < self.averager.warmup_steps:
            grads = [p.grad for p in _parameters(self.param_groups) if p.grad is not None]
            if grads:
                C.grouped_allreduce_(grads, op=C.Average, name="localsgd.warmup")
        loss = self.optim.step(closure) if closure is not None else self.optim.step()
        self.averager.average_parameters(self.param_groups)
        return loss

    def zero_grad(self, set_to_none: bool = True):
        self.optim.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        self.optim.add_param_group(param_group)
