"""LocalSGD: average models every few steps instead of gradients every step (PyTorch's model averaging).

``PeriodicModelAverager(period, warmup_steps)`` and ``HierarchicalModelAverager(period_group_size_dict,
warmup_steps)`` have the semantics of ``torch.distributed.algorithms.model_averaging.averagers``: each
``average_parameters(params)`` call is one step (counted in ``averager.step``); no averaging before
``warmup_steps``; then the periodic one averages over all ranks when ``(step - warmup_steps) % period ==
0``, and the hierarchical one averages within groups of the size mapped to the largest period that divides
``step`` (e.g. ``{2: local_size(), 8: size()}``: within a host every 2 steps, over all ranks every 8).
``LocalSGDOptimizer(optimizer, averager)`` is ``PostLocalSGDOptimizer``: ``step()`` steps the local
optimizer, then lets the averager average the parameters.

Groups. Averaging over all ranks is a commlib grouped allreduce (the coordinator, fusion and the chosen
algorithm). Smaller groups (ranks ``[i*g, (i+1)*g)``; a host's ranks when ``g`` is ``local_size()``) use
MPI sub-communicators that the averager splits from commlib's communicator when it is created (a
collective call: create averagers on every rank in the same order) and frees in ``close()``; process sets
will replace them once commlib has them. They need MPI_THREAD_MULTIPLE (commlib's background thread keeps
using MPI meanwhile).
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
        self._comms = {}  # group size -> MPI sub-communicator (sizes smaller than size())

    def average_parameters(self, params) -> None:
        raise NotImplementedError

    def _average(self, params, group_size: int) -> None:
        """Replace every parameter by its mean over the ``group_size`` ranks of this rank's group."""
        tensors = [p.data for p in _parameters(params)]
        if not tensors or group_size == 1:
            return
        if group_size == _cl.size():
            C.grouped_allreduce_(tensors, op=C.Average, name=f"localsgd.{type(self).__name__}")
            return
        from mpi4py import MPI

        flat = torch.cat([t.reshape(-1) for t in tensors]).to(torch.float64)
        self._comms[group_size].Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
        flat /= group_size
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    def _split(self, group_size: int) -> None:
        """Create the sub-communicator of ``group_size`` consecutive ranks (collective over all ranks)."""
        size = _cl.size()
        if group_size < 1 or size % group_size:
            raise ValueError(f"a group size must divide the number of ranks ({size}), got {group_size}")
        if group_size in (1, size) or group_size in self._comms:
            return
        from mpi4py import MPI

        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            raise RuntimeError("averaging within groups needs MPI_THREAD_MULTIPLE (commlib's thread uses MPI "
                               "meanwhile); this MPI gave less. Average over all ranks instead")
        base = _cl.api._rt().comm
        self._comms[group_size] = base.Split(base.Get_rank() // group_size, base.Get_rank())

    def close(self) -> None:
        """Free the sub-communicators (call on every rank, before ``shutdown()``)."""
        for comm in self._comms.values():
            comm.Free()
        self._comms.clear()


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
            self._split(int(group_size))

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
