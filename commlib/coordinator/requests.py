"""What a rank submits (Entry), what the ranks must agree on (Meta), and what they decide (Response)."""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import threading
import time
from typing import Any

import numpy as np


#: In the names given to unnamed tensors: such a name is never submitted twice, so it gets no cache id
#: (it would occupy one for good; the cache never forgets, see :mod:`.negotiation`).
AUTO_NAME_MARK = ".noname."


class Kind(enum.IntEnum):
    """The collective a request asks for."""

    ALLREDUCE = 0
    ALLGATHER = 1
    BROADCAST = 2
    REDUCESCATTER = 3
    ALLTOALL = 4
    BARRIER = 5
    JOIN = 6

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclasses.dataclass(frozen=True)
class Meta:
    """Everything about a request that every rank must agree on. Sent in full the first time a
    name is negotiated; afterwards a cache id stands for it. ``error`` carries a local validation failure
    so that the tensor fails on every rank instead of leaving the others waiting."""

    name: str
    kind: Kind
    dtype: str
    shape: tuple
    op: int = 0
    root: int = -1
    prescale: float = 1.0
    postscale: float = 1.0
    compression: str = "none"
    algorithm: str = ""
    error: str = ""
    device: str = "cpu"  # where the tensor lives ("cpu" or "cuda", see commlib.device); ranks must agree
    priority: int = 0    # allreduce: higher runs sooner once several are ready (:mod:`.priority`); 0: unordered

    @functools.cached_property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    def fusion_key(self) -> tuple:
        """Allreduces with equal keys may share one fused buffer (host tensors with host tensors, device
        tensors with device tensors)."""
        return (self.dtype, self.op, self.prescale, self.postscale, self.compression, self.algorithm, self.device)

    def matched_fields(self) -> dict[str, Any]:
        """The fields that must be equal on every rank (allgather and alltoall may differ in the first
        dimension)."""
        shape = self.shape[1:] if self.kind in (Kind.ALLGATHER, Kind.ALLTOALL) else self.shape
        fields = {"operation": self.kind.label, "dtype": self.dtype, "shape": shape, "device": self.device}
        if self.kind in (Kind.ALLREDUCE, Kind.REDUCESCATTER):
            fields.update(op=self.op, prescale_factor=self.prescale, postscale_factor=self.postscale)
        if self.kind is Kind.ALLREDUCE:
            fields.update(compression=self.compression, algorithm=self.algorithm or "default",
                          priority=self.priority)
        if self.kind is Kind.BROADCAST:
            fields["root_rank"] = self.root
        return fields


@dataclasses.dataclass
class Response:
    """A decision, made identically on every rank and executed by all in the same order.

    ``metas`` are the agreed requests (one, or several fused allreduces). ``error`` set: the tensors fail
    on every rank with that message. ``joined`` are ranks that contribute zeros. ``last_joined``
    completes a join."""

    kind: Kind
    metas: list[Meta]
    error: str = ""
    joined: tuple = ()
    last_joined: int = -1


class Handle:
    """The result of an asynchronous call; pass it to ``poll`` or ``synchronize``."""

    __slots__ = ("name", "owner", "_done", "_event", "_result", "_error", "_parts")

    def __init__(self, name: str, parts: list["Handle"] | None = None):
        self.name = name
        self.owner = None  # the coordinator it was submitted to (synchronize drives that one)
        self._done = False
        self._event: threading.Event | None = None  # made only if a thread has to block on it
        self._result: Any = None
        self._error: BaseException | None = None
        self._parts = parts

    def done(self) -> bool:
        if self._parts is not None:
            return all(p.done() for p in self._parts)
        return self._done

    def wait(self) -> None:
        """Block until done, driving the owning coordinator(s) meanwhile."""
        if self._parts is not None:
            for part in self._parts:
                part.wait()
        elif not self._done:
            self.owner.wait(self)

    def wait_briefly(self, seconds: float) -> bool:
        """Block up to ``seconds`` for another thread to complete the handle."""
        if self._parts is not None:
            return all(p.wait_briefly(seconds) for p in self._parts)
        if self._done:
            return True
        if self._event is None:
            self._event = threading.Event()
        if self._done:  # completed before the event was published: the completer may not have seen it
            return True
        return self._event.wait(seconds)

    def _complete(self) -> None:
        self._done = True
        event = self._event
        if event is not None:
            event.set()

    def set_result(self, result: Any) -> None:
        self._result = result
        self._complete()

    def set_error(self, error: BaseException) -> None:
        if not self._done:
            self._error = error
            self._complete()

    def result(self) -> Any:
        """The output (raises the collective's error). Only valid once done."""
        if self._parts is not None:
            return [p.result() for p in self._parts]
        if self._error is not None:
            raise self._error
        return self._result

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<commlib handle {self.name!r} {state}>"


class Entry:
    """A submitted request on its own rank: the metadata plus the arrays it reads and writes."""

    __slots__ = ("meta", "array", "output", "handle", "splits", "submitted")

    def __init__(self, meta: Meta, array: np.ndarray | None, output: np.ndarray | None, handle: Handle,
                 splits: np.ndarray | None = None):
        self.meta = meta
        self.array = array
        self.output = output
        self.handle = handle
        self.splits = splits
        self.submitted = time.perf_counter()
