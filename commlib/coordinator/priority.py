"""Priority scheduling: agreed allreduces with a priority run most urgent first, a bounded amount per round.

ByteScheduler's idea. Backward produces the last layer's gradients first, but the next forward pass needs
the first layer's first: once several allreduces are ready, the one the next step needs soonest should go
first, and a large tensor should not hold the link while a small urgent one waits behind it.

The rule, the same on every rank because it reads only what the rounds agreed:

- A round whose decisions include an allreduce with a nonzero ``Meta.priority`` (or a round after which
  something still waits here) puts its decided responses into a queue instead of running them. An
  allreduce larger than ``COMMLIB_PRIORITY_PARTITION`` bytes whose reduction works element by element
  (Sum, Average, Min, Max, Product; no compression but fp16/bf16) enters as partitions: slices of its
  buffer, each a collective of its own.
- After every complete round, responses leave the queue by priority (higher first; equal priorities in the
  order they were decided) until ``COMMLIB_PRIORITY_CREDIT`` bytes have left (at least one response):
  the credit, the amount committed before the ranks look again at what has become ready.
- While the queue holds anything, every rank starts the next round itself (an empty message, once its
  lanes have run what it released), so the queue drains, and tensors that became ready meanwhile compete
  with what waits.

Errors, joins and eager tensors (their data came with the round) never wait. A tensor's handle completes
when its last partition has run. Splitting changes no element's sum: each element is reduced by the same
algorithm family over the same ranks; on two ranks the bits are those of the whole tensor (a + b is
commutative), on more ranks an algorithm may add in another order for a partition than for the whole.
"""

from __future__ import annotations

import dataclasses
import heapq
import threading

from ..ops import ReduceOp
from .requests import Handle, Kind, Response

_SPLITTABLE_OPS = frozenset(int(op) for op in (ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX,
                                               ReduceOp.PRODUCT))
_SPLITTABLE_CODECS = frozenset(("none", "fp16", "bf16"))
_PART_METAS = 4096  # partition metadata kept (each keeps its engine plan alive in the lanes' caches)


@dataclasses.dataclass
class PartResponse(Response):
    """One partition of an allreduce response; ``split`` completes the whole when its last part has run."""

    split: "Split | None" = None


class Split:
    """A response run as partitions: counts them down and finishes the whole on the last one."""

    def __init__(self, response: Response, entries: list, parts: int, finish):
        self.response = response
        self.entries = entries
        self._left = parts
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._finish = finish  # finish(response, entries, error): the coordinator's, for the whole tensor

    def part_done(self, error: BaseException | None) -> None:
        """Called once per partition (from whichever thread ran it)."""
        with self._lock:
            self._left -= 1
            if error is not None and self._error is None:
                self._error = error
            last = self._left == 0
        if not last:
            return
        self._finish(self.response, self.entries, self._error)
        if self._error is None:
            for entry in self.entries:
                if entry is not None:
                    entry.handle.set_result(entry.output)


class _PartEntry:
    """The request a lane sees for one partition: a flat slice of the whole tensor's output buffer."""

    __slots__ = ("meta", "array", "output", "handle", "splits", "submitted")

    def __init__(self, entry, meta, start: int, stop: int):
        self.meta = meta
        self.output = self.array = entry.output.reshape(-1)[start:stop]
        self.handle = Handle(meta.name)  # completed by the lane; nobody waits on it (the split does)
        self.splits = None
        self.submitted = entry.submitted


class PriorityQueue:
    """The responses decided and not yet started, most urgent first (see the module docstring)."""

    def __init__(self, partition_bytes: int, credit_bytes: int, finish):
        self.partition_bytes = max(1, int(partition_bytes))
        self.credit_bytes = max(1, int(credit_bytes))
        self._finish = finish
        self._heap: list = []  # (-priority, sequence, nbytes, response, entries)
        self.pending = self._heap  # the same list, never replaced: empty while nothing waits (for hot paths)
        self._sequence = 0
        self._part_metas: dict = {}  # (meta, index, parts) -> the partition's Meta (one object per partition)

    def __bool__(self) -> bool:
        return bool(self._heap)

    @staticmethod
    def wanted(responses: list[Response]) -> bool:
        """True if a round's decisions ask for priority scheduling (an allreduce with a priority)."""
        for response in responses:
            if response.kind is Kind.ALLREDUCE and not response.error:
                for meta in response.metas:
                    if meta.priority:
                        return True
        return False

    def push(self, response: Response, entries: list) -> None:
        """Queue a decided response (with this rank's entries for its tensors), split when large."""
        meta = response.metas[0]
        nbytes = sum(m.nbytes for m in response.metas)
        priority = max(m.priority for m in response.metas)
        if (response.kind is Kind.ALLREDUCE and len(response.metas) == 1 and nbytes > self.partition_bytes
                and meta.op in _SPLITTABLE_OPS and meta.compression in _SPLITTABLE_CODECS
                and meta.device == "cpu"):  # a device tensor is segmented by its own pipeline
            self._push_parts(response, entries, nbytes, priority)
            return
        self._add(priority, nbytes, response, entries)

    def _add(self, priority: int, nbytes: int, response: Response, entries: list) -> None:
        heapq.heappush(self._heap, (-priority, self._sequence, nbytes, response, entries))
        self._sequence += 1

    def _push_parts(self, response: Response, entries: list, nbytes: int, priority: int) -> None:
        meta = response.metas[0]
        count = _elements(meta)
        itemsize = meta.nbytes // count
        per_part = max(1, self.partition_bytes // itemsize)
        parts = -(-count // per_part)
        split = Split(response, entries, parts, self._finish)
        entry = entries[0]
        for index in range(parts):
            start = index * per_part
            stop = min(count, start + per_part)
            part_meta = self._part_meta(meta, index, parts, stop - start)
            part_entry = _PartEntry(entry, part_meta, start, stop) if entry is not None else None
            part = PartResponse(Kind.ALLREDUCE, [part_meta], joined=response.joined, split=split)
            self._add(priority, (stop - start) * itemsize, part, [part_entry])

    def _part_meta(self, meta, index: int, parts: int, count: int):
        key = (meta, index, parts)
        part_meta = self._part_metas.get(key)
        if part_meta is None:
            if len(self._part_metas) >= _PART_METAS:
                self._part_metas.clear()
            part_meta = self._part_metas[key] = dataclasses.replace(
                meta, name=f"{meta.name}.part{index}of{parts}", shape=(count,))
        return part_meta

    def release(self) -> list[tuple[Response, list]]:
        """What starts after this round: most urgent first, until the credit is used (at least one)."""
        out = []
        spent = 0
        heap = self._heap
        while heap and (not out or spent < self.credit_bytes):
            _, _, nbytes, response, entries = heapq.heappop(heap)
            out.append((response, entries))
            spent += nbytes
        return out

    def drop(self) -> list[tuple[Response, list]]:
        """Empty the queue (the coordinator failed or closes); returns what was in it."""
        items = [(response, entries) for _, _, _, response, entries in self._heap]
        self._heap.clear()
        return items


def _elements(meta) -> int:
    count = 1
    for dim in meta.shape:
        count *= dim
    return count

