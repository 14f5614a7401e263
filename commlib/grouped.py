"""Grouped allgather and reducescatter: a list of tensors submitted as one call, as in Horovod.

Each tensor is negotiated under ``<name>.<i>`` (unnamed groups: each tensor gets an automatic name); the handle completes when all of them have, and
``synchronize`` returns the list of results in order. Other keyword arguments (``op``, ``process_set``)
go to every tensor's collective unchanged.
"""

from __future__ import annotations

from typing import Sequence

from . import api
from .coordinator.requests import Handle


def _group(submit, tensors: Sequence, name: str | None, operation: str, kwargs) -> Handle:
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"{operation} takes a non-empty list of tensors")
    parts = [submit(t, name=None if name is None else f"{name}.{i}", **kwargs) for i, t in enumerate(tensors)]
    return Handle(name or operation, parts=parts)


def grouped_allgather_async(tensors: Sequence, name: str | None = None, **kwargs) -> Handle:
    """Start concatenating every rank's tensors, each along its first dimension; ``synchronize``
    returns the list of gathered arrays."""
    return _group(api.allgather_async, tensors, name, "grouped_allgather", kwargs)


def grouped_allgather(tensors: Sequence, name: str | None = None, **kwargs) -> list:
    """Concatenate every rank's tensors, each along its first dimension; returns the list."""
    return api.synchronize(grouped_allgather_async(tensors, name, **kwargs))


def grouped_reducescatter_async(tensors: Sequence, name: str | None = None, **kwargs) -> Handle:
    """Start reducing each tensor and scattering its first dimension; ``synchronize`` returns the list
    of this rank's blocks."""
    return _group(api.reducescatter_async, tensors, name, "grouped_reducescatter", kwargs)


def grouped_reducescatter(tensors: Sequence, name: str | None = None, **kwargs) -> list:
    """Reduce each tensor over the ranks and keep this rank's block of its first dimension."""
    return api.synchronize(grouped_reducescatter_async(tensors, name, **kwargs))
