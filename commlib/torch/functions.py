"""Bringing every rank to the same starting point: parameters, optimizer state, Python objects."""

from __future__ import annotations

import torch

import commlib as _cl

from .. import validation
from . import collectives as C
from .collectives import set_kwargs


def broadcast_object(obj=None, root_rank=0, name=None, process_set=None):
    """Return ``root_rank``'s picklable ``obj`` on every rank (other ranks' ``obj`` is ignored)."""
    return _cl.broadcast_object(obj, root_rank=root_rank, name=name, **set_kwargs(process_set))


def allgather_object(obj, name=None, process_set=None):
    """Return the list of every rank's picklable ``obj``, in rank order."""
    return _cl.allgather_object(obj, name=name, **set_kwargs(process_set))


def broadcast_parameters(params, root_rank, process_set=None):
    """Overwrite parameters on every rank with ``root_rank``'s, in place.

    ``params`` is ``model.state_dict()`` (a dict, broadcast in sorted key order, so buffers such as
    BatchNorm statistics come along), ``model.named_parameters()`` or ``model.parameters()``.

    Example::

        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    """
    what = "pass model.state_dict(), model.named_parameters() or a list of tensors"
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (str, bytes, torch.Tensor)) or not hasattr(params, "__iter__"):
        raise TypeError(f"broadcast_parameters: params is a {type(params).__name__}; {what}")
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    validation.check_rank_argument(root_rank, "root_rank", "broadcast_parameters")
    for name, tensor in items:  # every entry checked before the first is sent
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"broadcast_parameters: {name or 'an entry'} is a {type(tensor).__name__}, "
                            f"not a tensor; {what}")
    handles = []
    for name, tensor in items:
        handles.append(C.broadcast_async_(tensor, root_rank,
                                          name=None if name is None else f"broadcast_parameters.{name}",
                                          process_set=process_set))
    for handle in handles:
        C.synchronize(handle)


def broadcast_optimizer_state(optimizer, root_rank, process_set=None):
    """Give every rank ``root_rank``'s optimizer state and hyperparameters (learning rate, betas, ...).

    Works for state that does not exist yet (Adam before its first step: every rank ends with no state,
    and all create it identically on their first step) and for state that exists only on the root
    (resumed from a checkpoint there). Tensors travel by broadcast; the structure and any non-tensor
    values (scalars, tuples, nested lists) travel pickled with :func:`broadcast_object`. Unlike Horovod
    it never runs a step with zero gradients to create the state, so parameters are never touched; like
    Horovod (which needs them for that step), it leaves a zero gradient on every parameter that requires
    one and has none, so code written for Horovod finds ``p.grad`` set.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):  # a DistributedOptimizer is one too
        raise TypeError(f"broadcast_optimizer_state takes a torch optimizer, not {type(optimizer).__name__}")
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
    state_dict = optimizer.state_dict()
    layout = None
    if _cl.rank() == root_rank:
        layout = {
            "param_groups": state_dict["param_groups"],
            "state": {pid: {key: (("tensor", tuple(v.shape), v.dtype) if torch.is_tensor(v) else ("value", v))
                            for key, v in entries.items()}
                      for pid, entries in state_dict["state"].items()},
        }
    layout = broadcast_object(layout, root_rank, name="broadcast_optimizer_state.layout", process_set=process_set)

    tensors = {}
    for pid, entries in layout["state"].items():
        for key, (kind, *spec) in entries.items():
            if kind != "tensor":
                continue
            if _cl.rank() == root_rank:
                tensors[pid, key] = state_dict["state"][pid][key].contiguous()
            else:
                shape, dtype = spec
                tensors[pid, key] = torch.empty(shape, dtype=dtype)
    handles = [C.broadcast_async_(t, root_rank, name=f"broadcast_optimizer_state.{pid}.{key}",
                                  process_set=process_set)
               for (pid, key), t in tensors.items()]
    for handle in handles:
        C.synchronize(handle)

    if _cl.rank() != root_rank:
        new_state = {pid: {key: tensors[pid, key] if kind == "tensor" else spec[0]
                           for key, (kind, *spec) in entries.items()}
                     for pid, entries in layout["state"].items()}
        optimizer.load_state_dict({"state": new_state, "param_groups": layout["param_groups"]})
