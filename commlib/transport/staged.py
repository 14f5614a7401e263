"""The host-staged path: device buffers through pinned host memory to the host algorithms, in segments.

MPI here is not CUDA-aware, so device memory reaches the network through the host. :class:`StagedPipeline`
moves one fused device buffer (packed by the caller on its stream, the prescale and a half-precision cast
done there) to pinned host memory segment by segment on a copy stream, one event per segment; the host
waits for segment i's event and reduces it across ranks with the host algorithms (``reduce_host``: the
lane's :class:`~commlib.engine.Engine`) while the copies of the next segments run, then queues the copy of
the reduced segment back on a second copy stream (a GPU has a copy engine for each direction). It returns
the event after which the whole buffer is back; the caller's stream waits for it and unpacks.

Every rank cuts the buffer into the same segments (:func:`segments`: a function of the agreed size alone),
so the host reductions meet in the same order everywhere. The pipeline orders itself with the stream
interface of :mod:`.streams` only, so the CPU tests run it with ``commlib.testing.streams.HostStreams``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..ops import ReduceOp

ReduceHost = Callable[[np.ndarray, ReduceOp], None]

DEFAULT_SEGMENT_BYTES = 4 << 20


def segments(count: int, itemsize: int, segment_bytes: int) -> list[tuple[int, int]]:
    """[start, stop) element ranges of at most ``segment_bytes`` (at least one element) covering
    ``count`` elements; none for an empty buffer."""
    step = max(1, segment_bytes // itemsize)
    return [(start, min(start + step, count)) for start in range(0, count, step)]


class StagedPipeline:
    """One lane's staging: two copy streams and a pinned host buffer, reused call after call.

    ``streams`` is the stream interface (:mod:`.streams`)."""

    def __init__(self, streams, segment_bytes: int = DEFAULT_SEGMENT_BYTES):
        if segment_bytes < 1:
            raise ValueError(f"segment_bytes must be positive, got {segment_bytes}")
        self.streams = streams
        self.segment_bytes = segment_bytes
        self.to_host_stream = streams.new_stream()
        self.to_device_stream = streams.new_stream()
        self._host: np.ndarray | None = None   # pinned, grown when a call needs more
        self._free = None                      # the event after which the last call stopped reading _host

    def allreduce(self, ready, source, target, dtype: np.dtype, op: ReduceOp, reduce_host: ReduceHost):
        """Reduce the 1-D device buffer ``source`` (of ``dtype``; its values are there after the event
        ``ready``) across ranks into ``target`` (the same buffer, or one of the same size): each segment by
        ``reduce_host(host_segment, op)``, which reduces a 1-D host buffer in place across ranks. Returns
        the event after which ``target`` holds the result."""
        streams = self.streams
        count = int(source.size)
        host = self.host_buffer(count, dtype)
        down, up = self.to_host_stream, self.to_device_stream
        streams.wait(down, ready)
        parts = segments(count, np.dtype(dtype).itemsize, self.segment_bytes)
        arrived = []
        for start, stop in parts:  # all queued at once: they run while the host reduces earlier segments
            streams.to_host(down, source[start:stop], host[start:stop])
            arrived.append(streams.record(down))
        for (start, stop), event in zip(parts, arrived):
            streams.synchronize(event)
            reduce_host(host[start:stop], op)
            streams.to_device(up, host[start:stop], target[start:stop])
        done = streams.record(up)
        self._free = done
        return done

    def released(self, event) -> None:
        """The host buffer is read (by a copy back) until ``event``: copies into it wait for that first."""
        self._free = event

    def host_buffer(self, count: int, dtype: np.dtype) -> np.ndarray:
        """``count`` elements of ``dtype`` in the reused pinned buffer. Copies into it wait (on the GPU) for
        the last call's copies out of it; a buffer too small is replaced once those have run."""
        dtype = np.dtype(dtype)
        nbytes = count * dtype.itemsize
        if self._host is None or self._host.nbytes < nbytes:
            if self._free is not None:
                self.streams.synchronize(self._free)  # the old buffer's last copy back has run
                self._free = None
            self._host = self.streams.pinned(max(nbytes, 1 << 20), np.dtype(np.uint8))
        elif self._free is not None:
            self.streams.wait(self.to_host_stream, self._free)
        return self._host[:nbytes].view(dtype)
