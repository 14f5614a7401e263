"""The collectives commlib-bench can measure, by name (one module each)."""

from __future__ import annotations

from types import MappingProxyType

from .allgather import Allgather
from .allreduce import Allreduce
from .alltoall import Alltoall
from .broadcast import Broadcast
from .collective import Collective
from .reducescatter import Reducescatter

COLLECTIVES: "MappingProxyType[str, type[Collective]]" = MappingProxyType({
    cls.name: cls for cls in (Allreduce, Allgather, Broadcast, Reducescatter, Alltoall)
})


def collective(name: str) -> Collective:
    """A fresh instance of the collective called ``name``."""
    try:
        return COLLECTIVES[name]()
    except KeyError:
        raise ValueError(f"unknown collective {name!r}; use one of: {', '.join(COLLECTIVES)}") from None
