"""The background coordinator: agrees across ranks which named tensors are ready, then runs them.

Negotiation protocol
====================
Rank 0 coordinates; every message travels on the control channel (a communicator of its own), and no
message ever blocks, so an idle rank sleeps instead of spinning in a collective.

1. Request.  When a tensor is submitted, its rank sends ``("req", metas, hits)`` to rank 0: full
   metadata (name, operation, dtype, shape, op, root, scale factors, compression, algorithm) for names
   not negotiated before, and for names whose request equals the cached one only a bit in ``hits``, a
   bit vector indexed by cache id. A local
   validation failure travels as metadata with ``error`` set, so that every rank learns of it.
2. Ready table.  Rank 0 records full requests per name and cached ones as bits in a (ranks x cache)
   matrix (:mod:`.negotiation`). A name is ready when every rank that has not joined has submitted it; a
   bitwise AND over the matrix finds all ready cached names at once.
3. Response list.  Rank 0 checks that the requests agree (a disagreement becomes an error response that
   names each rank's value), fuses small compatible allreduces (:mod:`.fusion`), assigns cache ids to
   newly negotiated names, and sends the list ``("resp", responses)`` to every other rank. MPI keeps the
   messages from one sender in order, so every rank executes the same responses in the same order; it
   then runs them itself. Response i runs on lane i mod lanes everywhere (:mod:`.execution`).
4. Join.  ``("join",)`` marks a rank that ran out of data: allreduces proceed with zeros from it, other
   collectives fail; when all ranks have joined, a join response carries the last rank to join.
5. Shutdown.  ``("gone", reason)`` says a rank shut down (or its coordinator failed). Rank 0 fails every
   tensor that still needs it, on every rank; if rank 0 goes, the others fail what they have pending.

Stall check: rank 0 logs tensors that some ranks submitted ``COMMLIB_STALL_CHECK_TIME`` seconds ago and
others have not, with the missing ranks; after ``COMMLIB_STALL_SHUTDOWN_TIME`` they fail on every rank.

Progress is driven by whichever thread needs it: a thread waiting in ``synchronize`` runs the cycle
itself (no thread hand-off, which costs ~50 us here), and the background thread runs it when nobody
waits. Both back off from spinning to sleeping (at most ``COMMLIB_CYCLE_TIME``); an idle rank sleeps.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from ..errors import CollectiveError, CommlibError
from .execution import LaneSet
from .fusion import fuse
from .negotiation import ReadyTable
from .requests import Entry, Handle, Kind, Meta, Response

log = logging.getLogger("commlib")

_POLL_CYCLES = 64          # idle cycles that poll without yielding the core (a reply is imminent)
_SPIN_CYCLES = 256         # idle cycles, counting those, before sleeping instead of yielding
_IDLE_POLL_S = 0.05        # how often an idle rank still reads control messages
_SHUTDOWN_GRACE_S = 10.0   # how long shutdown waits for the other ranks to shut down too


class Coordinator:
    """One per rank. Thread-safe ``submit``; ``wait`` drives progress until a handle completes."""

    def __init__(self, channel, lanes: list, config, timeline=None):
        self._channel = channel
        self.rank = channel.rank
        self.size = channel.size
        self._config = config
        self._timeline = timeline
        self._lanes = LaneSet(lanes, self._finish)
        self._table = ReadyTable(self.size, config.cache_capacity) if self.rank == 0 else None
        self._incoming: collections.deque[Entry] = collections.deque()
        self._names = threading.Lock()          # guards _in_flight
        self._in_flight: dict[str, Entry] = {}  # submitted and not finished, by name
        self._undecided: set[str] = set()       # announced, no response yet (driving thread only)
        self._cache: dict[str, tuple[int, Meta]] = {}   # name -> (cache id, agreed metadata)
        self._cache_metas: dict[int, Meta] = {}          # cache id -> agreed metadata
        self._progress = threading.Lock()       # held by the thread running a cycle
        self._wakeup = threading.Condition()
        self._waiters = 0                       # user threads inside wait()
        self._failure: BaseException | None = None
        self._closed = False
        self._coordinator_gone = ""
        self._next_stall_check = time.monotonic()
        self._thread = threading.Thread(target=self._background, name="commlib-coordinator", daemon=True)
        self._thread.start()

    # ---- user threads ------------------------------------------------------------------------------

    def submit(self, entry: Entry, drive: bool = False) -> Handle:
        """Queue ``entry`` for negotiation. ``drive``: the caller will wait on it at once, so the
        background thread need not be woken."""
        self._check_usable()
        name = entry.meta.name
        with self._names:
            if name in self._in_flight:
                raise CommlibError(
                    f"tensor name {name!r} is already in flight on rank {self.rank}; wait for it "
                    "(synchronize) before submitting the name again, or use a different name")
            self._in_flight[name] = entry
        self._incoming.append(entry)
        if not drive:
            with self._wakeup:
                self._wakeup.notify()
        return entry.handle

    def wait(self, handle: Handle) -> None:
        """Return when ``handle`` is done, running the coordinator's cycle in this thread meanwhile."""
        if handle.done():
            return
        with self._wakeup:
            self._waiters += 1
        try:
            self._drive(handle)
        finally:
            with self._wakeup:
                self._waiters -= 1

    def run(self, entry: Entry) -> Handle:
        """Submit ``entry`` and wait for it. Registered as a waiter first, so that the background thread
        leaves the cycle to this thread instead of taking it and handing the result over."""
        with self._wakeup:
            self._waiters += 1
        try:
            handle = self.submit(entry, drive=True)
            self._drive(handle)
        finally:
            with self._wakeup:
                self._waiters -= 1
        return handle

    def _drive(self, handle: Handle) -> None:
        cycle_s = self._config.cycle_time_ms / 1e3
        idle = 0
        while not handle.done():
            if self._failure is not None:
                raise self._failure_error()
            if not self._progress.acquire(timeout=max(cycle_s, 1e-3)):
                continue
            try:
                busy = self._cycle_guarded()
            finally:
                self._progress.release()
            if busy:
                idle = 0
                continue
            idle += 1
            if self._lanes.threaded and not self._undecided:
                handle.wait_briefly(cycle_s)  # decided and queued on a lane: its thread completes it
            else:
                self._back_off(idle)

    def set_timeline(self, timeline) -> None:
        """Start (a Timeline) or stop (None) recording."""
        self._timeline = timeline
        self._lanes.set_timeline(timeline)

    def close(self) -> None:
        """Stop the coordinator: pending operations fail, and the other ranks are told."""
        if self._closed:
            return
        self._closed = True
        with self._wakeup:
            self._wakeup.notify_all()
        self._thread.join(timeout=30)
        with self._progress:
            self._fail_all("commlib was shut down before it completed")
            try:
                self._announce_gone("shut down")
                self._await_peers_shutdown()
            except Exception as exc:  # a failed coordinator may have lost its channel: still shut down
                if self._failure is None:
                    raise
                log.warning("commlib shutdown after a failure on rank %d: %r", self.rank, exc)
        self._lanes.close()
        self._channel.close()

    # ---- the cycle ---------------------------------------------------------------------------------

    def _cycle_guarded(self) -> bool:
        try:
            return self._cycle()
        except Exception as exc:  # the user sees a CollectiveError, as every other rank's waiter will
            self._fail(exc)
            raise self._failure_error() from exc

    def _cycle(self) -> bool:
        """One round: announce new requests, read messages, decide (rank 0), execute. True if any
        progress was made."""
        busy = False
        if self._incoming:
            busy = True
            self._announce()
        for source, message in self._channel.receive_all():
            busy = True
            self._on_message(source, message)
        if self._table is not None:
            now = time.monotonic()
            responses = self._table.take_ready()
            if now >= self._next_stall_check:
                responses += self._check_stalls(now)
            if responses:
                busy = True
                responses = fuse(responses, self._config.fusion_threshold_bytes,
                                 self._config.fusion_inplace_bytes)
                if self.size > 1:
                    message = ("resp", [self._compact(r) for r in responses])
                    for worker in range(1, self.size):
                        self._channel.post(worker, message)
                self._execute(responses)
        return busy

    def _announce(self) -> None:
        full, cached, joining = [], 0, False
        now = time.monotonic()
        while self._incoming:
            entry = self._incoming.popleft()
            meta = entry.meta
            if meta.kind is Kind.JOIN:
                joining = True
                continue
            self._undecided.add(meta.name)
            hit = self._cache.get(meta.name)
            if hit is not None and (hit[1] is meta or hit[1] == meta):
                cached |= 1 << hit[0]
            else:
                full.append(meta)
        if self._coordinator_gone:
            self._fail_all(self._coordinator_gone)
            return
        if self._table is not None:
            for meta in full:
                self._table.add_full(0, meta, now)
            self._table.add_cached(0, cached, now)
            if joining:
                self._table.join(0)
        else:
            if full or cached:
                self._channel.post(0, ("req", full, cached))
            if joining:
                self._channel.post(0, ("join",))

    def _compact(self, response: Response):
        """A plain response for cached names travels as its cache ids (an int, or a tuple when fused):
        every rank knows their metadata, and pickling the full response would cost ~10 us per call."""
        if response.error or response.joined or response.cache_ids or response.kind is Kind.JOIN:
            return response
        ids = []
        for meta in response.metas:
            hit = self._cache.get(meta.name)
            if hit is None or hit[1] != meta:
                return response
            ids.append(hit[0])
        return ids[0] if len(ids) == 1 else tuple(ids)

    def _expand(self, item) -> Response:
        if isinstance(item, Response):
            return item
        ids = (item,) if isinstance(item, int) else item
        metas = [self._cache_metas[i] for i in ids]
        return Response(metas[0].kind, metas)

    def _on_message(self, source: int, message: tuple) -> None:
        tag = message[0]
        if tag == "resp":
            self._execute([self._expand(item) for item in message[1]])
        elif tag == "req":
            now = time.monotonic()
            for meta in message[1]:
                self._table.add_full(source, meta, now)
            self._table.add_cached(source, message[2], now)
        elif tag == "join":
            self._table.join(source)
        elif tag == "gone":
            if self._table is not None:
                self._table.rank_gone(source, message[1])
            else:
                self._coordinator_gone = f"rank 0 (the coordinator) {message[1]}"
                self._fail_all(self._coordinator_gone)
        else:
            raise CollectiveError(f"unknown control message {tag!r} from rank {source}")

    def _execute(self, responses: list[Response]) -> None:
        for response in responses:
            for name, cache_id in response.cache_ids:
                meta = next(m for m in response.metas if m.name == name)
                self._cache[name] = (cache_id, meta)
                self._cache_metas[cache_id] = meta
            if response.kind is Kind.JOIN:
                self._finish_join(response.last_joined)
                continue
            with self._names:
                entries = [self._in_flight.get(m.name) for m in response.metas]
            for meta in response.metas:
                self._undecided.discard(meta.name)
            if self._timeline is not None:
                now = self._timeline.now()
                for entry in entries:
                    if entry is not None:
                        self._timeline.span("negotiate", entry.submitted, now, 0, tensor=entry.meta.name)
            if response.error:
                self._finish(response, entries, CollectiveError(response.error))
            elif any(e is None for e in entries) and self.rank not in response.joined:
                raise CollectiveError(
                    f"rank {self.rank} received a response for tensor(s) it never submitted: "
                    f"{[m.name for m, e in zip(response.metas, entries) if e is None]}")
            else:
                self._lanes.run(response, entries)

    def _finish(self, response: Response, entries: list, error: BaseException | None) -> None:
        """Called when a response ran (or failed): release the names and complete failed handles."""
        with self._names:
            for meta, entry in zip(response.metas, entries):
                if entry is not None and self._in_flight.get(meta.name) is entry:
                    del self._in_flight[meta.name]
        if error is not None:
            if not isinstance(error, CollectiveError):
                cause = error
                error = CollectiveError(f"{type(cause).__name__}: {cause}")
                error.__cause__ = cause
            for entry in entries:
                if entry is not None:
                    entry.handle.set_error(error)

    def _finish_join(self, last_joined: int) -> None:
        with self._names:
            entry = self._in_flight.pop("__join__", None)
        if entry is not None:
            entry.handle.set_result(last_joined)

    def _check_stalls(self, now: float) -> list[Response]:
        check = self._config.stall_check_time_s
        self._next_stall_check = now + max(min(check, 5.0), 0.05) if check else float("inf")
        if not check:
            return []
        for name, missing in self._table.stalled(check, now):
            if self._table.should_warn(name, now, check):
                log.warning("commlib stall: tensor %r was submitted by some ranks more than %g s ago; "
                            "waiting for rank(s) %s", name, check, missing)
        shutdown = self._config.stall_shutdown_time_s
        return self._table.fail_stalled(shutdown, now) if shutdown else []

    # ---- background thread ---------------------------------------------------------------------------

    def _background(self) -> None:
        idle = 0
        while not self._closed:
            with self._wakeup:
                if self._waiters or not self._has_work():
                    self._wakeup.wait(_IDLE_POLL_S)
                    idle = 0
                    if self._waiters or self._closed:
                        continue
            if not self._progress.acquire(timeout=_IDLE_POLL_S):
                continue
            try:
                busy = self._cycle()
            except BaseException as exc:  # reaches the user through the handles and the next call
                self._fail(exc)
                return
            finally:
                self._progress.release()
            idle = 0 if busy else idle + 1
            if not busy and self._has_work():
                self._back_off(idle)

    def _has_work(self) -> bool:
        return bool(self._incoming or self._in_flight or (self._table is not None and self._table.has_pending()))

    def _back_off(self, idle: int) -> None:
        """Poll while a reply is likely imminent, then yield the core, then sleep longer and longer, up
        to the cycle time (a yield costs ~0.5 ms when the cores are oversubscribed)."""
        if idle < _POLL_CYCLES:
            return
        if idle < _SPIN_CYCLES:
            time.sleep(0)
        else:
            time.sleep(min(self._config.cycle_time_ms / 1e3, 20e-6 * (idle - _SPIN_CYCLES + 1)))

    # ---- failure and shutdown ----------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure_error()
        if self._closed:
            raise CollectiveError("commlib has been shut down; call commlib.init() to use it again")

    def _failure_error(self) -> CollectiveError:
        error = CollectiveError(f"commlib's background coordinator failed on rank {self.rank}: "
                                f"{type(self._failure).__name__}: {self._failure}")
        error.__cause__ = self._failure
        return error

    def _fail(self, exc: BaseException) -> None:
        if self._failure is not None:
            return
        self._failure = exc
        log.error("commlib coordinator failed on rank %d: %r", self.rank, exc)
        self._fail_all(str(self._failure_error()))
        try:
            self._announce_gone(f"failed ({type(exc).__name__}: {exc})")
        except BaseException:  # the channel itself may be what failed
            pass

    def _fail_all(self, reason: str) -> None:
        with self._names:
            entries = list(self._in_flight.values())
            self._in_flight.clear()
        self._incoming.clear()
        self._undecided.clear()
        for entry in entries:
            entry.handle.set_error(CollectiveError(f"tensor {entry.meta.name!r}: {reason}"))

    def _announce_gone(self, reason: str) -> None:
        if self.rank == 0:
            for worker in range(1, self.size):
                self._channel.post(worker, ("gone", reason))
        elif self.size > 1:
            self._channel.post(0, ("gone", reason))

    def _await_peers_shutdown(self) -> None:
        """Wait (bounded) until every rank has shut down, so no message is left in flight when the
        communicators are freed; reading messages meanwhile keeps rank 0's notices flowing."""
        barrier = self._channel.ibarrier()
        deadline = time.monotonic() + _SHUTDOWN_GRACE_S
        while not barrier.Test():
            self._channel.receive_all()
            if time.monotonic() > deadline:
                log.warning("commlib shutdown: not every rank shut down within %g s; continuing",
                            _SHUTDOWN_GRACE_S)
                return
            time.sleep(0.001)
        self._channel.flush()
