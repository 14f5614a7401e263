"""The worker side of push_pull: partitions pushed to their servers, answers received, in the background.

``ServerClient.push_pull_async(buf, key, ...)`` cuts ``buf`` into partitions (``protocol``), and for each
posts the header and the data to the partition's server at once, so that the partitions of one tensor,
and of every tensor submitted meanwhile, travel together. A partition's answer is received into the
memory it was sent from, once its send has completed (MPI forbids a receive into a buffer a send still
reads; the server cannot answer before it has every push anyway). A background thread polls the requests
(``Testsome``), applies the postscale or decodes each answered partition, and completes the handle when
its last partition is in. The caller's thread encodes and posts; MPI must provide MPI_THREAD_MULTIPLE.

This is the MPI data plane (``COMMLIB_SERVER_TRANSPORT=mpi``); :mod:`.tcp_client` replaces the transfers
with TCP connections and keeps the rest (partitions, their sending order in ``_queued``, errors, deadlines).

Bounded waits: a partition that a server has not answered for ``timeout_s`` (with nothing else heard
from that server meanwhile) fails its tensor on this worker with an error naming the server and the key.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from typing import Callable

import numpy as np
from mpi4py import MPI

from .. import kernels
from ..coordinator.backoff import Backoff, yield_core
from ..coordinator.requests import Handle
from ..dtypes import BY_NUMPY, dtype_name
from ..errors import CollectiveError, CommlibError, InFlightError
from ..ops import ReduceOp
from . import protocol
from .discovery import Job

log = logging.getLogger("commlib")


#: Partitions a worker sends at a time, to all servers together (see ``ServerClient._launch``).
#: On 4 + 4 emulated hosts at 1 Gbit/s (64 MiB, machine shared): 2 measured 1.35-1.41x the S/B bound,
#: 1 and 3 1.43-1.68x; a credit on partitions awaiting their answer (6 or 10) 1.7-2.4x (the round trip,
#: which waits for every worker's push, is long beside a partition's time on the link).
WINDOW = 2


class ServerError(CollectiveError):
    """A summation server did not answer in time, or refused a push."""


class _Part:
    """One partition in flight: sending, then receiving its answer."""

    __slots__ = ("job", "index", "lo", "hi", "server", "slot", "wire", "header", "sends", "recv", "since",
                 "payload")

    def __init__(self, job: "_Job", index: int, lo: int, hi: int, server: int, slot: int, wire: np.ndarray,
                 header: protocol.Push):
        self.job = job
        self.index = index
        self.lo, self.hi = lo, hi
        self.server = server
        self.slot = slot
        self.wire = wire  # the partition's wire memory: sent from, answered into
        self.payload: np.ndarray | None = None  # a lossy compressor's push, sent instead of ``wire``
        self.header = header
        self.sends: list | None = None  # posted when the server's window has room
        self.recv: MPI.Request | None = None
        self.since = time.monotonic()


class _Job:
    """One tensor's push_pull."""

    __slots__ = ("key", "handle", "output", "finish", "remaining", "failed", "priority")

    def __init__(self, key: str, handle: Handle, output: np.ndarray, finish: Callable, parts: int,
                 priority: int = 0):
        self.key = key
        self.handle = handle
        self.output = output
        self.finish = finish  # (part) -> None: decode / postscale one answered partition into output
        self.remaining = parts
        self.failed = False
        self.priority = priority  # higher: its queued partitions are sent sooner (ServerClient._enqueue)


class ServerClient:
    """push_pull for one worker runtime over ``job`` (which has servers), over MPI. Thread-safe."""

    #: partitions per server of a large tensor (:func:`.protocol.partitions`)
    depth = protocol.DEPTH

    def __init__(self, job: Job, partition_bytes: int, timeout_s: float, max_sleep_s: float = 1e-3):
        self.job = job
        self.comm = job.full
        self.servers = job.servers
        self.worker = job.workers.index(self.comm.Get_rank())
        self.partition_bytes = partition_bytes
        self.timeout_s = timeout_s
        tag_ub = self.comm.Get_attr(MPI.TAG_UB) or 32767
        self._slots = (protocol.FIRST_SLOT + n % (tag_ub - protocol.FIRST_SLOT) for n in itertools.count())
        self._lock = threading.Lock()
        self._parts: list[_Part] = []  # under _lock: sending or awaiting their answer
        self._queued: collections.deque[_Part] = collections.deque()  # not yet sent, in sending order
        self._sending = 0  # partitions being sent
        self._by_slot: dict[int, _Part] = {}
        self._in_flight: set[str] = set()
        self._heard = [time.monotonic()] * len(self.servers)
        self._backoff = Backoff(max_sleep_s)
        self._thread: threading.Thread | None = None
        self._stop = False
        self._broken: BaseException | None = None
        #: ``None``, or a list that receives ``(time, event, server, slot)`` per partition event ("post",
        #: "sent", "answered"): scripts/bench_servers.py --trace sets it.
        self.trace: list | None = None

    @property
    def num_servers(self) -> int:
        return len(self.servers)

    def server_nodes(self, worker_ranks: list[int], node_of_worker) -> tuple[int, ...]:
        """The node of each server in the numbering of ``node_of_worker`` (the node of each of
        ``worker_ranks``, ranks of the job): a server on a host where one of those workers runs has that
        worker's node; servers on other hosts get numbers past the workers', one per host."""
        hosts = self.job.hosts
        by_host = {hosts[r]: node for r, node in zip(worker_ranks, node_of_worker)}
        nodes = []
        for rank in self.servers:
            if hosts[rank] not in by_host:
                by_host[hosts[rank]] = max(by_host.values(), default=-1) + 1
            nodes.append(by_host[hosts[rank]])
        return tuple(nodes)

    # -- submitting -------------------------------------------------------------------------------------
    def push_pull_async(self, buf: np.ndarray, key: str, op: ReduceOp = ReduceOp.SUM, codec=None,
                        prescale: float = 1.0, postscale: float = 1.0, contributors: int | None = None,
                        result=None, lossy=None, priority: int = 0) -> Handle:
        """Start ``buf = postscale * reduce(prescale * buf)`` over the workers (``contributors`` of them
        push ``key``; default every worker) through the servers; ``buf`` is 1-D and C-contiguous. With
        ``codec`` (float32 ``buf``) the values travel in ``codec.wire_dtype`` and the servers accumulate
        in float32; half-precision ``buf`` travels as it is and also accumulates in float32. The handle's
        result is ``result`` (default ``buf``). ``lossy`` (a :class:`commlib.compression.pushed.PushEncoder`,
        float32 ``buf``, no ``codec``): each partition is pushed encoded, the servers decode and sum it in
        float32 and answer with the dense float32 sum. ``priority``: this tensor's partitions are sent before
        those of lower priority still queued (:meth:`_enqueue`)."""
        if self._broken is not None:
            raise ServerError(f"push_pull {key!r}: {self._broken}")
        contributors = contributors or len(self.job.workers)
        handle = Handle(key)
        handle.owner = self
        if key in self._in_flight:
            raise InFlightError(f"push_pull {key!r} is already in flight on this worker; synchronize it "
                                "before pushing the same name again")
        if buf.dtype not in BY_NUMPY or BY_NUMPY[buf.dtype].kind == "bool":
            raise CommlibError(f"push_pull {key!r}: dtype {buf.dtype} cannot go through the servers; use one "
                               "of float16, bfloat16, float32, float64 or an integer type")
        if codec is not None:
            wire = np.empty(buf.size, codec.wire_dtype)
            overflow = codec.encode(buf, wire, prescale)
            if overflow:
                from ..compression import warn_overflow
                warn_overflow(key, overflow, codec)

            def finish(part: _Part, lo: int, hi: int) -> None:
                codec.decode(part.wire, buf[lo:hi], postscale)
        else:
            if prescale != 1.0:
                kernels.scale_(buf, prescale)
            wire = buf

            def finish(part: _Part, lo: int, hi: int) -> None:
                if postscale != 1.0:
                    kernels.scale_(part.wire, postscale)
        bounds = protocol.bounds(buf.size, wire.itemsize, self.partition_bytes, len(self.servers), depth=self.depth)
        nparts = len(bounds) - 1
        result = buf if result is None else result
        if nparts == 0:
            handle.set_result(result)
            return handle
        job = _Job(key, handle, result, finish, nparts, priority)
        wire_name = dtype_name(wire.dtype)
        with self._lock:
            self._in_flight.add(key)
            parts = []
            for p in protocol.sending_order(nparts, len(self.servers), self.worker):
                lo, hi = bounds[p], bounds[p + 1]
                server = protocol.server_of(key, p, len(self.servers))
                dest = self.servers[server]
                slot = next(self._slots)
                payload, packed = (None, "") if lossy is None else lossy.encode(key, p, wire[lo:hi])
                header = protocol.Push(key, p, buf.size, wire_name, hi - lo, int(op), contributors,
                                       self.worker, slot, packed, payload.nbytes if payload is not None else 0)
                part = _Part(job, p, lo, hi, server, slot, wire[lo:hi], header)
                part.payload = payload
                parts.append(part)
                self._by_slot[slot] = part
            self._enqueue(parts, priority)
            self._launch()
        self._ensure_thread()
        return handle

    def _enqueue(self, parts: list[_Part], priority: int) -> None:
        """Queue one tensor's partitions (under the lock) behind every queued partition of the same or a
        higher priority and ahead of the lower ones: higher priorities are sent first, equal ones in
        submission order (BytePS's scheduled queue). What is already being sent is not overtaken."""
        queue = self._queued
        if not queue or queue[-1].job.priority >= priority:  # the common case: no reordering
            queue.extend(parts)
            return
        at = len(queue)
        while at and queue[at - 1].job.priority < priority:
            at -= 1
        queue.rotate(-at)  # the lower-priority tail first, the new partitions before it, then back
        queue.extendleft(reversed(parts))
        queue.rotate(at)

    def _launch(self) -> None:
        """Post the next queued partitions while fewer than ``WINDOW`` are being sent (under the lock).

        A few at a time, not everything at once: partitions sent together share the worker's link and
        all arrive at the end, so the servers could answer none before the last; sent a few at a time,
        the first answers travel back while later partitions still go out. And each worker starts a
        tensor at another partition (its rank's), so at each moment the workers push to different
        servers: every server's link takes one worker's stream at a time instead of all of them by
        turns, and the answers, which wait for the last worker's push, follow one step behind."""
        queue = self._queued
        while queue and self._sending < WINDOW:
            part = queue.popleft()
            dest = self.servers[part.server]
            part.sends = [self.comm.isend(part.header, dest=dest, tag=protocol.TAG_PUSH),
                          self.comm.Isend((part.wire if part.payload is None else part.payload).view(np.uint8),
                                          dest=dest, tag=part.slot)]
            part.since = time.monotonic()
            if self.trace is not None:
                self.trace.append((part.since, "post", part.server, part.slot))
            self._parts.append(part)
            if MPI.Request.Testall(part.sends):  # a small partition leaves at once: await its answer now
                part.recv = self.comm.Irecv(part.wire.view(np.uint8), source=dest, tag=part.slot)
            else:
                self._sending += 1

    # -- the progress thread ----------------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._progress, name="commlib-push-pull", daemon=True)
            self._thread.start()

    def _progress(self) -> None:
        last = checked = time.monotonic()
        try:
            while not self._stop:
                moved = self._errors() | self._poll()
                now = time.monotonic()
                if now - checked > 0.1:
                    self._check_deadlines(now)
                    checked = now
                if moved:
                    last = now
                elif self._parts:
                    yield_core()  # transfers under way progress only while MPI is polled: never sleep then
                else:
                    self._backoff.pause(now - last)
        except BaseException as exc:  # never leave a waiter blocked: fail everything in flight
            log.error("commlib: the push_pull progress thread failed: %r", exc)
            self._broken = exc
            with self._lock:
                for part in self._parts:
                    self._fail(part.job, ServerError(f"push_pull {part.job.key!r}: the progress thread failed: "
                                                     f"{exc!r}"))
                self._parts = []

    def _poll(self) -> bool:
        """Advance every partition: sends done -> post the answer's receive; answer in -> finish it."""
        with self._lock:
            parts = self._parts
            if not parts:
                return False
            requests = [p.recv if p.recv is not None else p.sends[-1] for p in parts]
            done = MPI.Request.Testsome(requests)
            if not done:
                return False
            finished, gone = [], set()
            for i in done:
                part = parts[i]
                if part.recv is None:  # its data went out (the header, sent first, has gone too)
                    MPI.Request.Waitall(part.sends)
                    self._heard[part.server] = time.monotonic()
                    if self.trace is not None:
                        self.trace.append((self._heard[part.server], "sent", part.server, part.slot))
                    self._sending -= 1
                    if part.job.failed:
                        gone.add(id(part))
                    else:
                        part.recv = self.comm.Irecv(part.wire.view(np.uint8), source=self.servers[part.server],
                                                    tag=part.slot)
                        part.since = self._heard[part.server]
                else:
                    finished.append(part)
                    gone.add(id(part))
                    if self.trace is not None:
                        self.trace.append((time.monotonic(), "answered", part.server, part.slot))
                    self._by_slot.pop(part.slot, None)
            if gone:
                self._parts = [p for p in parts if id(p) not in gone]
            self._launch()
        now = time.monotonic()
        for part in finished:
            self._heard[part.server] = now
            self._complete(part)
        return True

    def _complete(self, part: _Part) -> None:
        """``part``'s answer is in its memory: decode it, and complete its tensor if it was the last."""
        job = part.job
        if job.failed:
            return
        job.finish(part, part.lo, part.hi)
        with self._lock:  # another thread may finish another partition of the job meanwhile
            job.remaining -= 1
            last = job.remaining == 0 and not job.failed
            if last:
                self._in_flight.discard(job.key)
        if last:
            job.handle.set_result(job.output)

    def _errors(self) -> bool:
        """A server refused a round: fail that tensor here, naming what the server said."""
        moved = False
        while True:
            message = self.comm.improbe(MPI.ANY_SOURCE, protocol.TAG_ERROR)
            if message is None:
                return moved
            slot, text = message.recv()
            moved = True
            with self._lock:
                part = self._by_slot.get(slot)
                if part is not None:
                    self._heard[part.server] = time.monotonic()
                    self._fail(part.job, ServerError(text))

    def _check_deadlines(self, now: float) -> None:
        if not self.timeout_s:
            return
        with self._lock:
            for part in self._watched():
                if part.job.failed:
                    continue
                waited = now - max(part.since, self._heard[part.server])
                if waited > self.timeout_s:
                    stage = self._stage(part)
                    self._fail(part.job, ServerError(
                        f"push_pull {part.job.key!r}: {self.job.describe_server(part.server)} has not "
                        f"{stage} partition {part.index} for {waited:.1f} s (COMMLIB_SERVER_TIMEOUT="
                        f"{self.timeout_s:g}): the server died or hangs, or another worker has not pushed "
                        f"{part.job.key!r} (every worker must push the same keys, alike)"))

    def _stage(self, part: _Part) -> str:
        """What the server of ``part`` has not done yet, for an error."""
        return "taken its push" if part.recv is None else "answered"

    def _watched(self) -> list[_Part]:
        """The partitions whose deadline runs (under the lock)."""
        # queued ones too: behind a server that stopped taking pushes, they never leave
        return self._pending()

    def _pending(self) -> list[_Part]:
        """Every partition sent or queued and not yet answered (under the lock)."""
        return self._parts + list(self._queued)

    def _fail(self, job: _Job, error: BaseException) -> None:
        """Fail ``job`` (under the lock): forget its partitions, sent and queued."""
        job.failed = True
        self._in_flight.discard(job.key)
        self._forget_sent(job)
        queue = self._queued
        if any(part.job is job for part in queue):
            kept = [part for part in queue if part.job is not job]
            for part in queue:
                if part.job is job:
                    self._by_slot.pop(part.slot, None)
            queue.clear()
            queue.extend(kept)
        job.handle.set_error(error)

    def _forget_sent(self, job: _Job) -> None:
        """Cancel the receives of ``job``'s partitions (the sends still complete when their servers take
        them) and forget them (under the lock)."""
        keep = []
        for part in self._parts:
            if part.job is job:
                self._by_slot.pop(part.slot, None)
                if part.recv is not None:
                    part.recv.Cancel()
                else:  # still sending: kept until the send completes and frees its place in the window
                    keep.append(part)
            else:
                keep.append(part)
        self._parts = keep

    # -- waiting and closing ----------------------------------------------------------------------------
    def wait(self, handle: Handle) -> None:
        """Block until ``handle`` is done, polling here too (a reply is then read without waking another
        thread); the progress thread enforces the deadlines."""
        last = time.monotonic()
        while not handle.done():
            if self._errors() | self._poll():
                last = time.monotonic()
                continue
            idle = time.monotonic() - last
            if idle > 0.01:
                handle.wait_briefly(0.05)
                if self._thread is None or not self._thread.is_alive():
                    handle.set_error(ServerError(f"push_pull {handle.name!r}: the progress thread is not "
                                                 "running"))
            else:
                self._backoff.pause(idle)

    def close(self) -> None:
        """Wait for what is in flight (bounded by the timeout), stop the thread, and tell every server
        this worker's runtime is shutting down."""
        deadline = time.monotonic() + (self.timeout_s or 10.0)
        while self._pending() and time.monotonic() < deadline and self._thread is not None \
                and self._thread.is_alive():
            time.sleep(1e-3)
        self._stop = True
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            for part in self._pending():
                if not part.job.failed:
                    self._fail(part.job, ServerError(f"push_pull {part.job.key!r}: commlib shut down"))
        if MPI.Is_finalized():
            return
        byes = [self.comm.issend(None, dest=s, tag=protocol.TAG_BYE) for s in self.servers]
        deadline = time.monotonic() + 2.0
        while not MPI.Request.Testall(byes) and time.monotonic() < deadline:
            time.sleep(1e-3)


class ServerLane:
    """What one execution lane of one process set hands the ``ps`` algorithm: push_pull under keys that
    every rank of the set derives alike (the set's label, the lane, and a count of this lane's ``ps``
    calls: the coordinator runs every rank's collectives in one agreed order per lane)."""

    def __init__(self, client: ServerClient, prefix: str, contributors: int, server_nodes: tuple[int, ...] = ()):
        self.client = client
        self.server_nodes = server_nodes  # the node of each server, as the set's topology numbers them
        self.depth = client.depth  # partitions per server of a large tensor (the cost model reads it)
        self.prefix = prefix
        self.contributors = contributors
        self.calls = 0

    def reduce_(self, buf: np.ndarray, op: ReduceOp, codec, prescale: float, postscale: float) -> None:
        self.calls += 1
        self._finish([self.client.push_pull_async(buf, f"{self.prefix}#{self.calls}", op, codec, prescale,
                                                   postscale, self.contributors)])

    def reduce_shards_(self, shards, op: ReduceOp, codec, prescale: float, postscale: float,
                       contributors: int) -> None:
        """One call's share when the set's nodes reduce inside first (``ps.host_allreduce``): each
        ``(j, view)`` of ``shards`` is pushed under the call's key and ``.j``, counted by the servers
        with ``contributors`` pushes (one per node: the holders of shard j); every rank counts the call
        alike, whatever it holds."""
        self.calls += 1
        self._finish([self.client.push_pull_async(view, f"{self.prefix}#{self.calls}.{j}", op, codec, prescale,
                                                   postscale, contributors) for j, view in shards])

    def _finish(self, handles) -> None:
        """Wait for every handle of one call, then raise the first error among them."""
        for handle in handles:
            if not handle.done():
                self.client.wait(handle)
        for handle in handles:
            handle.result()
