"""A Chrome-trace timeline in Horovod's layout (opens in Perfetto and chrome://tracing): what happened to
each tensor, when, under the activity names Horovod's timeline documentation uses.

As in Horovod, each tensor is a "process" of the trace (its ``pid``, named ``allreduce.<tensor name>``,
...), so a tensor's life reads as one row: ``NEGOTIATE_ALLREDUCE`` (submitted until every rank agreed), then ``ALLREDUCE``
(the collective) with its activities nested inside: ``QUEUE``, ``MEMCPY_IN_FUSION_BUFFER``,
``MPI_ALLREDUCE`` (the communication, whichever schedule runs it: the event's arguments name the
algorithm, the compression and the lane), ``MEMCPY_OUT_FUSION_BUFFER``. With cycle marks on, each
coordinator cycle that negotiated or ran something is a ``CYCLE_START`` instant.

Every rank writes its own file (rank 0 the path asked for, rank r > 0 ``name.rankR.json``: see
:func:`rank_path`). Lines are flushed as they are written, so a file can be read while the job runs; it is
a valid JSON array once closed.
"""

from __future__ import annotations

import json
import os
import threading
import time

#: Horovod's name for the communication step of each collective (keyed by Horovod's name of the collective,
#: which is also commlib's: ALLREDUCE, ALLGATHER, ...).
COMMUNICATION = {"ALLREDUCE": "MPI_ALLREDUCE", "ALLGATHER": "MPI_ALLGATHER", "BROADCAST": "MPI_BCAST",
                 "REDUCESCATTER": "MPI_REDUCESCATTER", "ALLTOALL": "MPI_ALLTOALL", "BARRIER": "MPI_BARRIER",
                 "JOIN": "MPI_ALLREDUCE"}
QUEUE = "QUEUE"
MEMCPY_IN_FUSION_BUFFER = "MEMCPY_IN_FUSION_BUFFER"
MEMCPY_OUT_FUSION_BUFFER = "MEMCPY_OUT_FUSION_BUFFER"
CYCLE_START = "CYCLE_START"


def negotiate_name(kind: str) -> str:
    """``NEGOTIATE_ALLREDUCE`` for ``ALLREDUCE``, as Horovod names the phase."""
    return "NEGOTIATE_" + kind


class Timeline:
    """Appends events to a JSON array file; safe to call from any thread.

    ``mark_cycles``: the coordinator records ``CYCLE_START`` instants (Horovod's
    ``HOROVOD_TIMELINE_MARK_CYCLES``).
    """

    def __init__(self, path: str, rank: int, mark_cycles: bool = False):
        self.path = path
        self.mark_cycles = mark_cycles
        self._rank = rank
        self._lock = threading.Lock()
        self._start = time.perf_counter()
        self._pids: dict[tuple[str, str], int] = {}
        self._file = open(path, "w", buffering=1)  # line-buffered: readable while the job runs
        self._file.write("[\n")
        self._write({"name": "process_name", "ph": "M", "pid": 0,
                     "args": {"name": f"rank {rank}",
                              "start_time_since_epoch_in_micros": int(time.time() * 1e6)}})

    def now(self) -> float:
        return time.perf_counter()

    def span(self, activity: str, start: float, end: float, kind: str, tensor: str, /, **args) -> None:
        """Record ``activity`` of the ``kind`` collective (``ALLREDUCE``, ...) on ``tensor`` from ``start``
        to ``end`` (perf_counter seconds)."""
        self.spans(activity, start, end, kind, (tensor,), **args)

    def spans(self, activity: str, start: float, end: float, kind: str, tensors, /, **args) -> None:
        """The same activity for each of ``tensors`` (a fused response: one event per tensor, as Horovod)."""
        ts, dur = self._micros(start), round((end - start) * 1e6, 3)
        with self._lock:
            for tensor in tensors:
                self._write({"name": activity, "ph": "X", "pid": self._pid(kind, tensor), "tid": 0, "ts": ts,
                             "dur": dur, "args": args})

    def instant(self, name: str, at: float | None = None) -> None:
        """A global instant event such as ``CYCLE_START``."""
        with self._lock:
            self._write({"name": name, "ph": "i", "s": "g", "pid": 0,
                         "ts": self._micros(self.now() if at is None else at)})

    def close(self) -> None:
        """Finish the file as a valid JSON array."""
        with self._lock:
            if self._file.closed:
                return
            self._file.write(json.dumps({"name": "end", "ph": "i", "pid": 0, "s": "g",
                                         "ts": self._micros(self.now())}))
            self._file.write("\n]\n")
            self._file.close()

    def _micros(self, t: float) -> float:
        return round((t - self._start) * 1e6, 3)

    def _pid(self, kind: str, tensor: str) -> int:
        """The tensor's row (lock held): a new one is named as Horovod names it, ``allreduce.grad`` for an
        allreduce of the tensor named ``grad``."""
        key = (kind, tensor)
        pid = self._pids.get(key)
        if pid is None:
            pid = self._pids[key] = len(self._pids) + 1
            prefix = kind.lower()
            label = tensor if tensor.startswith(prefix) else f"{prefix}.{tensor}"
            self._write({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": label}})
            self._write({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}})
        return pid

    def _write(self, event: dict) -> None:
        if not self._file.closed:
            self._file.write(json.dumps(event) + ",\n")


def rank_path(path: str, rank: int, size: int) -> str:
    """One file per rank: rank 0 writes ``path`` itself (where Horovod's single timeline file goes, so
    tools pointed at it find it), rank r > 0 ``trace.rankR.json`` beside it."""
    if rank == 0:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext or '.json'}"
