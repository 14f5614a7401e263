"""BytePS's torch names over commlib's summation servers: ``import commlib.torch as bps``.

``push_pull``, ``push_pull_async``, ``push_pull_async_inplace``, ``push_pull_inplace`` and ``declare`` as
``byteps.torch`` spells them; ``poll``, ``synchronize``, ``DistributedOptimizer``, ``broadcast_parameters``,
``broadcast_optimizer_state``, ``init``, ``size``, ``rank``, ``local_rank`` are commlib.torch's own (the
same signatures). The tensors go through the servers with no negotiation (docs/servers.md); the
DistributedOptimizer's gradients go through them with ``algorithm="ps"`` (``COMMLIB_ALGORITHM=ps``).

``priority`` is BytePS's: a worker sends the partitions of higher-priority tensors before those of lower
ones still waiting to go (equal priorities in submission order). ``version`` is accepted and has no effect.
"""

from __future__ import annotations

import commlib as _cl

from .bridge import as_array, as_tensor
from .collectives import Compression, Handle, in_place_result

__all__ = ["declare", "push_pull", "push_pull_async", "push_pull_async_inplace", "push_pull_inplace"]


def _op(average: bool):
    return _cl.Average if average else _cl.Sum


def _async(tensor, inplace: bool, average: bool, name, compression, priority=0) -> Handle:
    array = as_array(tensor.contiguous() if not inplace else tensor, name, "push_pull")
    kwargs = dict(op=_op(average), name=name, compression=compression, priority=priority)
    if inplace:
        return Handle(_cl.push_pull_async_(array, **kwargs), in_place_result(tensor), tensor)
    return Handle(_cl.push_pull_async(array, **kwargs), as_tensor, tensor)


def push_pull_async(tensor, average: bool = True, name: str | None = None, version: int = 0, priority: int = 0,
                    compression=Compression.none) -> Handle:
    """Start summing (``average``: averaging) ``tensor`` over the workers through the servers into a new
    tensor; ``synchronize`` returns it. Every worker must push each ``name`` with the same shape and dtype.
    ``priority``: higher-priority tensors' partitions are sent first (see :func:`commlib.push_pull_async`)."""
    return _async(tensor, False, average, name, compression, priority)


def push_pull_async_inplace(tensor, average: bool = True, name: str | None = None, version: int = 0,
                            priority: int = 0, compression=Compression.none) -> Handle:
    """In-place :func:`push_pull_async`: ``synchronize`` returns ``tensor``, now holding the result."""
    return _async(tensor, True, average, name, compression, priority)


def push_pull(tensor, average: bool = True, name: str | None = None, version: int = 0, priority: int = 0,
              compression=Compression.none):
    """Sum (``average``: average) ``tensor`` over the workers through the servers; returns a new tensor."""
    return push_pull_async(tensor, average, name, version, priority, compression).wait()


def push_pull_inplace(tensor, average: bool = True, name: str | None = None, version: int = 0,
                      priority: int = 0, compression=Compression.none):
    """In-place :func:`push_pull`; returns ``tensor``."""
    return push_pull_async_inplace(tensor, average, name, version, priority, compression).wait()


def declare(name: str) -> None:
    """BytePS declares each key before its first push; commlib's keys need no declaration (a partition's
    server follows from its name), so this does nothing."""
