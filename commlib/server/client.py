"""The worker side of push_pull: partitions pushed to their servers, answers received, in the background.

``ServerClient.push_pull_async(buf, key, ...)`` cuts ``buf`` into partitions (:mod:`.protocol`), gives each
a :class:`~.protocol.Push` header, and queues them in sending order (higher priorities first); its data
plane takes them from the queue, sends them to their servers and receives each answer into the memory
the partition was sent from (the server cannot answer before it has every push). The client decodes or
postscales each answered partition and completes the handle when the tensor's last partition is in.

The data plane is handed to the client (:func:`open_client` chooses it), one small class per transport
behind :class:`DataPlane`: :class:`.mpi_plane.MpiPlane` (``COMMLIB_SERVER_TRANSPORT=mpi``: non-blocking MPI
polled by a progress thread) and :class:`.tcp_plane.TcpPlane` (the default: one TCP connection per server,
blocking sockets in threads of their own). Everything else (partitions, their order, encoding, errors,
deadlines, the end) is here, once.

Bounded waits: a partition that a server has not taken or answered for ``timeout_s`` (with nothing else
heard from that server meanwhile) fails its tensor on this worker with an error naming the server and
the key.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time

import numpy as np
from mpi4py import MPI

from .. import kernels
from ..coordinator.backoff import Backoff
from ..coordinator.requests import Handle
from ..dtypes import BY_NUMPY, dtype_name
from ..errors import CollectiveError, CommlibError, ConfigError, InFlightError
from ..ops import ReduceOp
from . import mpi_messages, protocol, tcp
from .discovery import Job
from .plane import DataPlane, Part, PushPull

log = logging.getLogger("commlib")


class ServerError(CollectiveError):
    """A summation server did not answer in time, or refused a push."""


class ServerClient:
    """push_pull for one worker runtime over ``job`` (which has servers), its partitions carried by
    ``plane``. Thread-safe."""

    def __init__(self, job: Job, plane: DataPlane, partition_bytes: int, timeout_s: float,
                 max_sleep_s: float = 1e-3):
        if partition_bytes > protocol.MAX_PARTITION_BYTES:
            raise ConfigError(f"COMMLIB_SERVER_PARTITION={partition_bytes} exceeds the {protocol.MAX_PARTITION_BYTES} "
                              "bytes a summation server takes in one push; use a smaller partition size")
        self.job = job
        self.comm = job.full
        self.servers = job.servers
        self.worker = job.workers.index(self.comm.Get_rank())
        self.partition_bytes = partition_bytes
        self.timeout_s = timeout_s
        self.plane = plane
        self.depth = plane.depth
        tag_ub = self.comm.Get_attr(MPI.TAG_UB) or 32767
        self._slots = (protocol.FIRST_SLOT + n % (tag_ub - protocol.FIRST_SLOT) for n in itertools.count())
        #: guards the queue, the partitions by slot and every plane's own bookkeeping
        self.lock = threading.Lock()
        #: partitions not yet sent, in sending order (the plane takes them from the left)
        self.queue: collections.deque[Part] = collections.deque()
        self._by_slot: dict[int, Part] = {}
        self._in_flight: set[str] = set()
        #: when each server was last heard from (a partition's deadline runs from the later of this and
        #: its own stage)
        self.heard = [time.monotonic()] * len(self.servers)
        self._backoff = Backoff(max_sleep_s)
        self._thread: threading.Thread | None = None
        self.stopping = False
        self._broken: BaseException | None = None
        #: ``None``, or a list that receives ``(time, event, server, slot)`` per partition event ("post",
        #: "sent", "answered"): scripts/bench_servers.py --trace sets it.
        self.trace: list | None = None
        plane.attach(self)

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
        those of lower priority still queued (:meth:`enqueue`)."""
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
        if len(key.encode()) > protocol.MAX_KEY_BYTES:
            raise CommlibError(f"push_pull: the name {key[:40]!r}... is {len(key.encode())} bytes of UTF-8; the "
                               f"servers take names of at most {protocol.MAX_KEY_BYTES}: use a shorter name")
        if codec is not None:
            wire = np.empty(buf.size, codec.wire_dtype)
            overflow = codec.encode(buf, wire, prescale)
            if overflow:
                from ..compression import warn_overflow
                warn_overflow(key, overflow, codec)

            def finish(part: Part) -> None:
                codec.decode(part.wire, buf[part.lo:part.hi], postscale)
        else:
            if prescale != 1.0:
                kernels.scale_(buf, prescale)
            wire = buf

            def finish(part: Part) -> None:
                if postscale != 1.0:
                    kernels.scale_(part.wire, postscale)
        bounds = protocol.bounds(buf.size, wire.itemsize, self.partition_bytes, len(self.servers), depth=self.depth)
        nparts = len(bounds) - 1
        result = buf if result is None else result
        if nparts == 0:
            handle.set_result(result)
            return handle
        job = PushPull(key, handle, result, finish, nparts, priority)
        wire_name = dtype_name(wire.dtype)
        with self.lock:
            self._in_flight.add(key)
            parts = []
            for p in protocol.sending_order(nparts, len(self.servers), self.worker):
                lo, hi = bounds[p], bounds[p + 1]
                slot = next(self._slots)
                payload, packed = (None, "") if lossy is None else lossy.encode(key, p, wire[lo:hi])
                header = protocol.Push(key, p, buf.size, wire_name, hi - lo, int(op), contributors, self.worker,
                                       slot, packed, payload.nbytes if payload is not None else 0).encode()
                part = Part(job, p, lo, hi, protocol.server_of(key, p, len(self.servers)), slot, wire[lo:hi],
                            header, payload)
                parts.append(part)
                self._by_slot[slot] = part
            self.enqueue(parts, priority)
            self.plane.launch()
        self._ensure_thread()
        return handle

    def enqueue(self, parts: list[Part], priority: int) -> None:
        """Queue one tensor's partitions (under the lock) behind every queued partition of the same or a
        higher priority and ahead of the lower ones: higher priorities are sent first, equal ones in
        submission order (BytePS's scheduled queue). What is already being sent is not overtaken."""
        queue = self.queue
        if not queue or queue[-1].job.priority >= priority:  # the common case: no reordering
            queue.extend(parts)
            return
        at = len(queue)
        while at and queue[at - 1].job.priority < priority:
            at -= 1
        queue.rotate(-at)  # the lower-priority tail first, the new partitions before it, then back
        queue.extendleft(reversed(parts))
        queue.rotate(at)

    # -- what the data plane reports ----------------------------------------------------------------------
    def answered(self, part: Part) -> None:
        """``part``'s answer is in its memory (not under the lock): decode it, and complete its tensor if
        it was the last."""
        job = part.job
        if job.failed:
            return
        job.finish(part)
        with self.lock:  # another thread may finish another partition of the job meanwhile
            self._by_slot.pop(part.slot, None)
            job.remaining -= 1
            last = job.remaining == 0 and not job.failed
            if last:
                self._in_flight.discard(job.key)
        if last:
            job.handle.set_result(job.output)

    def part_of(self, slot: int) -> Part | None:
        """The partition sent on ``slot`` and not yet answered (under the lock), if any."""
        return self._by_slot.get(slot)

    def refused(self, server: int, refusal: protocol.Refusal) -> None:
        """``server`` refused the round of the push on ``refusal.slot`` (under the lock): fail its tensor
        here, saying what the server said."""
        self.heard[server] = time.monotonic()
        part = self._by_slot.get(refusal.slot)
        if part is not None and part.server == server:
            self.fail(part.job, ServerError(refusal.text))

    def malformed(self, sender: str, why: str) -> None:
        """``sender`` (a server, as :meth:`.discovery.Job.describe_server` names it, or another rank) sent
        something the protocol does not allow: say so (the message is dropped)."""
        log.error("commlib: dropped a malformed message from %s: %s", sender, why)

    def unreachable(self, server: int, why: str, taken: list[Part] = ()) -> None:
        """``server`` cannot be reached (under the lock): fail every tensor with a partition on it, sent or
        queued, or among ``taken`` (partitions the plane holds outside both)."""
        for part in list(taken) + self.sent_or_queued():
            if part.server == server and not part.job.failed:
                self.fail(part.job, ServerError(
                    f"push_pull {part.job.key!r}: {self.job.describe_server(server)} cannot be reached: {why}; "
                    "the server died or exited (see its output), or its port is not reachable from this host "
                    "(COMMLIB_SERVER_TRANSPORT=mpi sends through MPI instead)"))

    def sent_or_queued(self) -> list[Part]:
        """Every partition sent or queued and not yet answered (under the lock)."""
        return self.plane.sent() + list(self.queue)

    def fail(self, job: PushPull, error: BaseException) -> None:
        """Fail ``job`` (under the lock): forget its partitions, sent and queued."""
        job.failed = True
        self._in_flight.discard(job.key)
        self.plane.forget(job)
        for slot in [slot for slot, part in self._by_slot.items() if part.job is job]:
            del self._by_slot[slot]
        if any(part.job is job for part in self.queue):
            kept = [part for part in self.queue if part.job is not job]
            self.queue.clear()
            self.queue.extend(kept)
        job.handle.set_error(error)

    # -- the progress thread ----------------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._progress, name="commlib-push-pull", daemon=True)
            self._thread.start()

    def _progress(self) -> None:
        """Poll a polled plane (yielding the core while transfers are under way: MPI moves them only
        while polled), and check the deadlines every 0.1 s."""
        last = checked = time.monotonic()
        try:
            while not self.stopping:
                moved = self.plane.poll() if self.plane.polled else False
                now = time.monotonic()
                if now - checked > 0.1:
                    self.check_deadlines(now)
                    checked = now
                if moved:
                    last = now
                elif not self.plane.polled:
                    time.sleep(0.05)
                elif self.plane.sent():
                    self._backoff.pause(0.0)  # transfers under way: yield the core, never sleep
                else:
                    self._backoff.pause(now - last)
        except BaseException as exc:  # never leave a waiter blocked: fail everything in flight
            log.error("commlib: the push_pull progress thread failed: %r", exc)
            self._broken = exc
            with self.lock:
                for part in self.sent_or_queued():
                    if not part.job.failed:
                        self.fail(part.job, ServerError(f"push_pull {part.job.key!r}: the progress thread "
                                                        f"failed: {exc!r}"))

    def check_deadlines(self, now: float) -> None:
        """Fail the tensors whose partitions a server has not taken or answered for the timeout; then
        what the plane itself waits on."""
        if self.timeout_s:
            self._fail_late(now)
        self.plane.check(now)

    def _fail_late(self, now: float) -> None:
        with self.lock:
            for part in self.sent_or_queued():  # queued ones too: behind a stopped server they never leave
                if part.job.failed:
                    continue
                waited = now - max(part.since, self.heard[part.server])
                if waited > self.timeout_s:
                    self.fail(part.job, ServerError(
                        f"push_pull {part.job.key!r}: {self.job.describe_server(part.server)} has not "
                        f"{self.plane.stage(part)} partition {part.index} for {waited:.1f} s (COMMLIB_SERVER_TIMEOUT="
                        f"{self.timeout_s:g}): the server died or hangs, or another worker has not pushed "
                        f"{part.job.key!r} (every worker must push the same keys, alike)"))

    # -- waiting and closing ----------------------------------------------------------------------------
    def wait(self, handle: Handle) -> None:
        """Block until ``handle`` is done, polling a polled plane here too (an answer is then read without
        waking another thread); the progress thread enforces the deadlines."""
        last = time.monotonic()
        while not handle.done():
            if self.plane.polled and self.plane.poll():
                last = time.monotonic()
                continue
            idle = time.monotonic() - last
            if idle > 0.01 or not self.plane.polled:
                handle.wait_briefly(0.05)
                if not handle.done() and (self._thread is None or not self._thread.is_alive()):
                    handle.set_error(ServerError(f"push_pull {handle.name!r}: the progress thread is not "
                                                 "running"))
            else:
                self._backoff.pause(idle)

    def close(self) -> None:
        """Wait for what is in flight (bounded by the timeout), stop the thread and the plane, and tell
        every server this worker's runtime is shutting down."""
        deadline = time.monotonic() + (self.timeout_s or 10.0)
        while self._pending() and time.monotonic() < deadline and self._thread is not None \
                and self._thread.is_alive():
            time.sleep(1e-3)
        self.stopping = True
        if self._thread is not None:
            self._thread.join()
        with self.lock:
            for part in self.sent_or_queued():
                if not part.job.failed:
                    self.fail(part.job, ServerError(f"push_pull {part.job.key!r}: commlib shut down"))
        self.plane.close()
        if MPI.Is_finalized():
            return
        byes = [mpi_messages.post(self.comm, b"", s, protocol.TAG_BYE, synchronous=True) for s in self.servers]
        deadline = time.monotonic() + 2.0
        while not MPI.Request.Testall(byes) and time.monotonic() < deadline:
            time.sleep(1e-3)

    def _pending(self) -> bool:
        with self.lock:
            return bool(self.sent_or_queued())


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


def open_client(job: Job, partition_bytes: int, timeout_s: float, congestion: str = tcp.CONGESTION,
                rcvbuf: int = tcp.RCVBUF) -> ServerClient:
    """push_pull's client for ``job``: over TCP where the servers listen (``COMMLIB_SERVER_TRANSPORT=tcp``;
    its connections with ``congestion`` and ``rcvbuf``, see :func:`.tcp.tune`), else over MPI."""
    if job.tcp:
        from .tcp_plane import TcpPlane

        plane: DataPlane = TcpPlane(congestion, rcvbuf)
    else:
        from .mpi_plane import MpiPlane

        plane = MpiPlane()
    return ServerClient(job, plane, partition_bytes, timeout_s)
