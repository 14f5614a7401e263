"""A Chrome-trace timeline (opens in Perfetto and chrome://tracing): what happened to each tensor, when.

Rows (thread ids) per rank: 0 is negotiation (submit -> agreed response), 1 + k is execution lane k
(queue, pack, compression, communication, unpack). Each event names the tensor in its arguments.
"""

from __future__ import annotations

import json
import os
import threading
import time


class Timeline:
    """Appends complete ("X") events to a JSON array file; safe to call from any thread."""

    def __init__(self, path: str, rank: int):
        self.path = path
        self._rank = rank
        self._lock = threading.Lock()
        self._start = time.perf_counter()
        self._file = open(path, "w")
        self._file.write("[\n")
        meta = [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}},
                {"name": "thread_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": "negotiation"}}]
        for event in meta:
            self._file.write(json.dumps(event) + ",\n")

    def now(self) -> float:
        return time.perf_counter()

    def span(self, phase: str, start: float, end: float, row: int = 0, **args) -> None:
        """Record ``phase`` from ``start`` to ``end`` (perf_counter seconds) on row ``row``."""
        event = {"name": phase, "ph": "X", "pid": self._rank, "tid": row,
                 "ts": round((start - self._start) * 1e6, 3), "dur": round((end - start) * 1e6, 3),
                 "args": args}
        line = json.dumps(event) + ",\n"
        with self._lock:
            if not self._file.closed:
                self._file.write(line)

    def close(self) -> None:
        """Finish the file as a valid JSON array."""
        with self._lock:
            if self._file.closed:
                return
            self._file.write(json.dumps({"name": "end", "ph": "i", "pid": self._rank, "s": "p",
                                         "ts": round((time.perf_counter() - self._start) * 1e6, 3)}))
            self._file.write("\n]\n")
            self._file.close()


def rank_path(path: str, rank: int, size: int) -> str:
    """One file per rank: ``trace.json`` becomes ``trace.rank1.json`` on rank 1 (rank 0 keeps the name
    when running alone)."""
    if size == 1:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext or '.json'}"
