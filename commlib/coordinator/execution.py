"""Executing agreed responses on execution lanes.

A lane is an :class:`~commlib.engine.Engine` on a communicator of its own. With one lane, responses run
inline in whichever thread drives the coordinator (no thread hand-off: the lowest latency). With k > 1
lanes, each lane has a thread and a queue; response number i runs on lane i mod k on every rank, so the
same collective meets on the same communicator everywhere, and one lane packs or compresses while another
communicates. A response of device tensors runs on the lane's device half (:mod:`.device_path`).
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
from typing import Callable

import numpy as np

from ..buffers import ScratchPool, pack, unpack
from ..cache import BoundedCache
from ..compression import Compression, codec_for
from ..errors import CollectiveError
from ..ops import ReduceOp
from ..timeline import COMMUNICATION, MEMCPY_IN_FUSION_BUFFER, MEMCPY_OUT_FUSION_BUFFER, QUEUE
from .device_path import DevicePath
from .requests import Entry, Kind, Response

Finish = Callable[[Response, list, BaseException | None], None]


class Lane:
    """One engine plus the scratch memory of its fusion buffer."""

    def __init__(self, index: int, engine, timeline):
        self.index = index
        self.engine = engine
        self.timeline = timeline
        self._scratch = ScratchPool()
        self._plans = BoundedCache(_PLANS)   # id(meta) -> (meta, engine plan); the meta keeps the id valid
        self._device: DevicePath | None = None  # made by the lane's first device response

    def execute(self, response: Response, entries: list[Entry | None]) -> None:
        """Run one response; ``entries[i]`` is this rank's request for ``response.metas[i]`` (None for a
        joined rank, which contributes zeros)."""
        if self.timeline is None:
            self._run(response, entries)
            return
        start = self.timeline.now()
        try:
            self._run(response, entries)
        finally:  # the collective's top-level event (Horovod's ALLREDUCE, ...) around its activities
            kind = response.kind.name
            self.timeline.spans(kind, start, self.timeline.now(), kind, [m.name for m in response.metas],
                                **_args(response, self.index))

    def _run(self, response: Response, entries: list[Entry | None]) -> None:
        kind = response.kind
        if kind is _ALLREDUCE:
            self._allreduce(response, entries)
            return
        if response.metas[0].device != _CPU:
            self._run_on_device(response, entries)
            return
        entry = entries[0]
        meta = response.metas[0]
        with self._span(COMMUNICATION[kind.name], response):
            engine = self.engine
            if kind is Kind.ALLGATHER:
                entry.handle.set_result(engine.allgather(entry.array))
            elif kind is Kind.BROADCAST:
                engine.broadcast_(entry.output, meta.root)
                entry.handle.set_result(entry.output)
            elif kind is Kind.REDUCESCATTER:
                entry.handle.set_result(engine.reducescatter(entry.array, ReduceOp(meta.op), meta.name,
                                                             meta.prescale, meta.postscale))
            elif kind is Kind.ALLTOALL:
                entry.handle.set_result(engine.alltoall(entry.array, entry.splits))
            elif kind is Kind.BARRIER:
                engine.barrier()
                entry.handle.set_result(None)
            else:
                raise CollectiveError(f"unexpected response kind {kind!r}")

    def allreduce_one(self, response: Response, entry: Entry | None) -> None:
        """One tensor's allreduce (``entry`` None: a joined rank's zeros). Kept lean: a small synchronous
        call's latency is mostly this kind of code."""
        meta = response.metas[0]
        plan = self._plans.get(id(meta))
        if plan is None or plan[0] is not meta:
            plan = self._plan(meta)
        if plan[1] is None:  # a device tensor's (see _plan)
            self._run_on_device(response, [entry])
            return
        output = entry.output if entry is not None else np.zeros(meta.shape, meta.dtype)
        flat = output if output.ndim == 1 else output.reshape(-1)
        if self.timeline is None:
            plan[1](flat)
        else:
            with self._span(MPI_ALLREDUCE, response):
                plan[1](flat)
            self._learned(response)
        if entry is not None:
            entry.handle.set_result(output)

    def _allreduce(self, response: Response, entries: list[Entry | None]) -> None:
        meta = response.metas[0]
        if len(entries) == 1:
            self.allreduce_one(response, entries[0])
            return
        if meta.device != _CPU:
            self._run_on_device(response, entries)
            return
        op = ReduceOp(meta.op)
        codec = _codec(meta)
        outputs = [e.output if e is not None else np.zeros(m.shape, m.dtype)
                   for e, m in zip(entries, response.metas)]
        inplace_bytes = self.engine.group_inplace_bytes(sum(o.nbytes for o in outputs), np.dtype(meta.dtype), codec,
                                                        meta.algorithm or None)
        small = [o for o in outputs if o.nbytes < inplace_bytes]
        buffers = [o.reshape(-1) for o in outputs if o.nbytes >= inplace_bytes]
        if len(small) > 1:
            fused = self._scratch.get("fusion", sum(o.size for o in small), meta.dtype)
            with self._span(MEMCPY_IN_FUSION_BUFFER, response, tensors=len(small)):
                pack(small, fused)
            buffers.insert(0, fused)
        else:
            buffers[:0] = [o.reshape(-1) for o in small]
        with self._span(MPI_ALLREDUCE, response, tensors=len(outputs)):
            self.engine.allreduce_many_(buffers, op, meta.algorithm or None, meta.prescale, meta.postscale, codec,
                                        meta.name)
        if self.timeline is not None:
            self._learned(response)
        if len(small) > 1:
            with self._span(MEMCPY_OUT_FUSION_BUFFER, response, tensors=len(small)):
                unpack(fused, small)
        for entry, output in zip(entries, outputs):
            if entry is not None:
                entry.handle.set_result(output)

    @property
    def device(self) -> DevicePath:
        """The lane's device half (streams, buffers, NCCL communicators), made on first use."""
        if self._device is None:
            self._device = DevicePath(self.engine, self.engine.config.device_segment_bytes)
        return self._device

    def _run_on_device(self, response: Response, entries: list[Entry | None]) -> None:
        def span(activity: str, **args):
            return self._span(activity, response, **args)
        if response.kind is _ALLREDUCE:
            self.device.allreduce(response, entries, span)
        else:
            self.device.collective(response, entries, span)

    def _plan(self, meta) -> tuple:
        """The engine's plan for ``meta`` (an agreed, validated request), remembered by the Meta object:
        the coordinator hands the same one for every call of a negotiated name. None for a device tensor's
        request: it runs on the lane's device half (decided once per request, not per call)."""
        if meta.device != _CPU:
            return self._plans.put(id(meta), (meta, None))
        plan = (meta, self.engine.plan_allreduce(np.dtype(meta.dtype), math.prod(meta.shape), ReduceOp(meta.op),
                                                  meta.algorithm or None, meta.prescale, meta.postscale,
                                                  _codec(meta), meta.name))
        return self._plans.put(id(meta), plan)

    def _learned(self, response: Response) -> None:
        """What ``auto`` settled since the last call (a size class measured to the end): an ``AUTO_LEARNED``
        event on the response's tensors, its ``learned`` argument the line ``--explain`` prints."""
        learning = self.engine.context.learner
        if learning is not None and learning.notes:
            now = self.timeline.now()
            for note in learning.take_notes():
                self.timeline.spans("AUTO_LEARNED", now, now, response.kind.name, [m.name for m in response.metas],
                                    learned=note, lane=self.index)

    def _span(self, activity: str, response: Response, **args):
        """A timeline event around an activity, for every tensor of the response; without a timeline, a
        context manager that does nothing (a small call's latency budget has no room for building the
        event's arguments)."""
        if self.timeline is None:
            return _NO_SPAN
        return _Span(self.timeline, activity, response.kind.name, [m.name for m in response.metas],
                     **_args(response, self.index), **args)

    def close(self) -> None:
        if self._device is not None:
            self._device.close()
        self.engine.close()


def _args(response: Response, lane: int) -> dict:
    meta = response.metas[0]
    return {"algorithm": meta.algorithm or "auto", "compression": meta.compression, "lane": lane}


def _codec(meta):
    if meta.compression == "none":
        return None
    return codec_for(getattr(Compression, meta.compression), np.dtype(meta.dtype), meta.name)


MPI_ALLREDUCE = COMMUNICATION["ALLREDUCE"]
_CPU = "cpu"  # Meta.device of a host tensor
_ALLREDUCE = Kind.ALLREDUCE  # a global: an enum member costs an attribute lookup on the hot path
_PLANS = 4096  # plans kept per lane; emptied when full (auto-named tensors make a new Meta per call)
_NO_SPAN = contextlib.nullcontext()  # stateless: safe to share between lanes and calls


class _Span:
    """Context manager recording one timeline activity for a response's tensors."""

    __slots__ = ("_timeline", "_activity", "_kind", "_names", "_args", "_start")

    def __init__(self, timeline, activity, kind, names, **args):
        self._timeline, self._activity, self._kind, self._names, self._args = timeline, activity, kind, names, args

    def __enter__(self):
        self._start = self._timeline.now()
        return self

    def __exit__(self, *exc):
        self._timeline.spans(self._activity, self._start, self._timeline.now(), self._kind, self._names,
                             **self._args)
        return False


class LaneSet:
    """Runs responses on lanes: inline with one lane, on one thread per lane otherwise."""

    def __init__(self, lanes: list[Lane], finish: Finish, release: Callable[[Response, Entry], None]):
        self.lanes = lanes
        self._finish = finish
        self._release = release  # what finish does for run_one's tensor when it succeeded: release its name
        self._sequence = 0
        self._ran = [0] * len(lanes)  # responses each lane has run (each counter written by one thread)
        self._queues: list[queue.SimpleQueue] = []
        self._threads: list[threading.Thread] = []
        if len(lanes) > 1:
            for lane in lanes:
                q: queue.SimpleQueue = queue.SimpleQueue()
                thread = threading.Thread(target=self._serve, args=(lane, q), daemon=True,
                                          name=f"commlib-lane-{lane.index}")
                self._queues.append(q)
                self._threads.append(thread)
                thread.start()

    @property
    def threaded(self) -> bool:
        return bool(self._threads)

    def idle(self) -> bool:
        """Every response handed to the lanes has run (always, with one lane: it runs inline)."""
        return not self._threads or sum(self._ran) == self._sequence

    def run(self, response: Response, entries: list[Entry | None]) -> None:
        """Execute now (one lane) or queue on lane ``sequence mod lanes``."""
        index = self._sequence % len(self.lanes)
        self._sequence += 1
        if not self._threads:
            self._execute(self.lanes[0], response, entries)
        else:
            timeline = self.lanes[index].timeline
            self._queues[index].put((response, entries, timeline.now() if timeline is not None else 0.0))

    def run_one(self, response: Response, entry: Entry) -> None:
        """:meth:`run` for an allreduce of one tensor of this rank's (the lone path's): with one lane and no
        timeline, straight to the lane's plan, without the frames in between."""
        if self._threads or response.kind is not _ALLREDUCE or self.lanes[0].timeline is not None:
            self.run(response, [entry])
            return
        self._sequence += 1
        try:
            self.lanes[0].allreduce_one(response, entry)
        except BaseException as exc:  # reported on the handle, and to the coordinator
            self._finish(response, [entry], exc)
        else:
            self._release(response, entry)

    def _execute(self, lane: Lane, response: Response, entries: list[Entry | None],
                 queued_at: float = 0.0) -> None:
        if queued_at and lane.timeline is not None:
            lane.timeline.spans(QUEUE, queued_at, lane.timeline.now(), response.kind.name,
                                [m.name for m in response.metas], lane=lane.index)
        try:
            lane.execute(response, entries)
        except BaseException as exc:  # reported on the handles, and to the coordinator
            self._finish(response, entries, exc)
        else:
            self._finish(response, entries, None)

    def _serve(self, lane: Lane, q: queue.SimpleQueue) -> None:
        ran = self._ran
        while True:
            item = q.get()
            if item is None:
                return
            self._execute(lane, *item)
            ran[lane.index] += 1

    def set_timeline(self, timeline) -> None:
        for lane in self.lanes:
            lane.timeline = timeline

    def close(self) -> None:
        for q in self._queues:
            q.put(None)
        for thread in self._threads:
            thread.join(timeout=30)
        for lane in self.lanes:
            lane.close()
