"""The background coordinator: agrees across ranks which named tensors are ready, then runs them.

Negotiation protocol
====================
Every rank keeps the same ready table and decides the same things from it; what keeps the tables equal is
the round exchange (:mod:`.rounds`): numbered rounds of one message from every rank, sent to every other
rank (or, beyond ``COMMLIB_DIRECT_MAX_RANKS`` ranks, relayed by rank 0) on the control channel (a
communicator of its own). No message blocks, so an idle rank sleeps instead of spinning in a collective.

1. Request.  A rank with newly submitted tensors contributes to the next round: full metadata (name,
   operation, dtype, shape, op, root, scale factors, compression, algorithm) for names not negotiated
   before, and for names whose request equals the cached one only a bit in ``hits``, a bit vector indexed
   by cache id. A local validation failure travels as metadata with ``error`` set, so that every rank
   learns of it. A rank that has nothing new answers a round another rank started with an empty message.
2. Ready table.  When a round is complete, every rank feeds its messages into its table in rank order
   (:mod:`.negotiation`): full requests per name, cached ones as bits in a (ranks x cache) matrix. A name
   is ready when every rank that has not joined has submitted it; a bitwise AND over the matrix finds all
   ready cached names at once.
3. Response list.  The table checks that the requests agree (a disagreement becomes an error response
   that names each rank's value) and assigns cache ids to newly negotiated names; ready allreduces are
   fused (:mod:`.fusion`). Same messages, same order, same code: every rank computes the same response
   list and executes it in order, without a further message. Response i runs on lane i mod lanes
   everywhere (:mod:`.execution`). The settings these decisions read must agree; ``init`` checks them.
4. Join.  A rank that ran out of data says ``join`` in its message: allreduces proceed with zeros from it,
   other collectives fail; when all ranks have joined, a join response carries the last rank to join.
5. Shutdown.  A rank that shuts down (or whose coordinator fails) says ``gone`` in its last message.
   From that round on, rounds complete without it and every tensor that still needs it fails, on every
   rank.

Why not a coordinator rank: a request to rank 0 and a response back is two message latencies and rank 0's
bookkeeping in between, on every small call; one direct round is one latency. The price is p - 1 messages
per rank per round instead of one, right for the ranks of a node or a few nodes; beyond
``COMMLIB_DIRECT_MAX_RANKS`` the relay through rank 0 keeps it at O(p) in all (a tree of relays, for
thousands of ranks, is not built).

Rank 0 still does what depends on a clock, since decisions from clocks differ between ranks: the stall
check. It logs tensors that some ranks submitted ``COMMLIB_STALL_CHECK_TIME`` seconds ago and others have
not, with the missing ranks; after ``COMMLIB_STALL_SHUTDOWN_TIME`` it names them in its next message, and
they fail on every rank in that round. Every rank warns about peers that stop answering rounds (it cannot
give up on them: a peer that was only slow would, on waking, decide from a round this rank abandoned).

Progress is driven by whichever thread needs it: a thread waiting in ``synchronize`` runs the cycle
itself (no thread hand-off, which costs ~50 us here), and the background thread runs it when nobody
waits. Both back off from polling to yielding to sleeping (at most ``COMMLIB_CYCLE_TIME``) by the time since
their last progress (:mod:`.backoff`); an idle rank sleeps and looks for messages every 50 ms.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from ..errors import CollectiveError, CommlibError
from .backoff import Backoff
from .execution import LaneSet
from .fusion import fuse
from .negotiation import ReadyTable
from .rounds import make_rounds
from .requests import Entry, Handle, Kind, Response

log = logging.getLogger("commlib")

_REPLY_POLLS = 16          # reads of the channel right after contributing, before the next cycle
_IDLE_POLL_S = 0.05        # how often an idle rank still reads control messages
_SHUTDOWN_GRACE_S = 10.0   # how long shutdown waits for the other ranks to shut down too
_JOIN = Kind.JOIN          # a global: an enum member costs an attribute lookup on the hot path


class Coordinator:
    """One per rank. Thread-safe ``submit``; ``wait`` drives progress until a handle completes."""

    def __init__(self, channel, lanes: list, config, timeline=None):
        self._channel = channel
        self.rank = channel.rank
        self.size = channel.size
        self._config = config
        self._cycle_s = config.cycle_time_ms / 1e3
        self._backoff = Backoff(self._cycle_s)
        self._timeline = timeline
        self._lanes = LaneSet(lanes, self._finish)
        self._table = ReadyTable(self.size, config.cache_capacity)
        self._rounds = make_rounds(channel, relay=self.size > config.direct_max_ranks)
        self._incoming: collections.deque[Entry] = collections.deque()
        self._names = threading.Lock()          # guards _in_flight
        self._in_flight: dict[str, Entry] = {}  # submitted and not finished, by name
        self._undecided: set[str] = set()       # announced, no response yet (driving thread only)
        self._extra: dict = {}                  # join / gone / fail, for this rank's next message
        self._failing = False                   # rank 0: stalled tensors named, round not yet complete
        self._stuck_since = 0.0                 # when this rank began waiting for a round (0: not waiting)
        self._progress = threading.Lock()       # held by the thread running a cycle
        self._wakeup = threading.Condition()
        self._waiters: list = []                # an item per user thread inside wait() (append/pop: atomic)
        self._failure: BaseException | None = None
        self._closed = False
        self._next_stall_check = time.monotonic()
        self._thread = threading.Thread(target=self._background, name="commlib-coordinator", daemon=True)
        self._thread.start()

    # ---- user threads ------------------------------------------------------------------------------

    def submit(self, entry: Entry, drive: bool = False) -> Handle:
        """Queue ``entry`` for negotiation. ``drive``: the caller will wait on it at once, so the
        background thread need not be woken."""
        if self._failure is not None or self._closed:
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
        self._waiters.append(None)
        try:
            self._drive(handle)
        finally:
            self._waiters.pop()

    def run(self, entry: Entry) -> Handle:
        """Submit ``entry`` and wait for it. Registered as a waiter first, so that the background thread
        leaves the cycle to this thread instead of taking it and handing the result over."""
        self._waiters.append(None)
        try:
            handle = self.submit(entry, drive=True)
            self._drive(handle)
        finally:
            self._waiters.pop()
        return handle

    def _drive(self, handle: Handle) -> None:
        cycle_s = self._cycle_s
        timeout = max(cycle_s, 1e-3)
        progress = self._progress
        idle_since = None
        while not handle.done():
            if self._failure is not None:
                raise self._failure_error()
            if not progress.acquire(timeout=timeout):
                continue
            try:
                busy = self._cycle()
            except Exception as exc:  # the user sees a CollectiveError, as every other rank's waiter will
                self._fail(exc)
                raise self._failure_error() from exc
            finally:
                progress.release()
            if busy:
                idle_since = None
                continue
            now = time.perf_counter()
            if idle_since is None:
                idle_since = now
            if self._lanes.threaded and not self._undecided:
                handle.wait_briefly(cycle_s)  # decided and queued on a lane: its thread completes it
            else:
                self._backoff.pause(now - idle_since)

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

    def _cycle(self) -> bool:
        """One pass: contribute new requests, read messages, answer rounds others started, and decide
        and execute every complete round. True if any progress was made."""
        rounds = self._rounds
        busy = False
        if self._incoming or self._extra:
            busy = True
            self._contribute()
            for _ in range(_REPLY_POLLS):  # peers usually answer within microseconds: wait here for it
                if not rounds.blocked() or rounds.receive():
                    break
        elif rounds.receive():
            busy = True
        while rounds.owed():  # a peer started a round this rank has not joined: answer it
            busy = True
            self._contribute()
        while busy:  # without news, no round can have completed
            messages = rounds.next_complete()
            if messages is None:
                break
            self._complete_round(messages)
        if rounds.sent > rounds.completed:  # waiting for a round to complete
            if not self._stuck_since:
                self._stuck_since = time.monotonic()
        elif self._stuck_since:
            self._stuck_since = 0.0
        if self._stuck_since or self.rank == 0:
            now = time.monotonic()
            if now >= self._next_stall_check:
                self._check_stalls(now)
        return busy

    def _contribute(self, last: bool = False) -> None:
        """This rank's message for the next round: what was submitted since the last one (possibly
        nothing), as cache bits where possible, plus any join, gone or fail notice."""
        full, hits = [], 0
        cache_id = self._table.cache_id
        while self._incoming:
            entry = self._incoming.popleft()
            meta = entry.meta
            if meta.kind is _JOIN:
                self._extra["join"] = True
                continue
            self._undecided.add(meta.name)
            hit = cache_id(meta)
            if hit >= 0:
                hits |= 1 << hit
            else:
                full.append(meta)
        if full or self._extra:
            message = (full, hits, self._extra)
            self._extra = {}
        else:
            message = hits  # the common message: a bare int pickles in a few bytes
        self._rounds.contribute(message, last)

    def _complete_round(self, messages: list) -> None:
        """Feed a complete round into the ready table, in rank order, and execute what it decides."""
        table = self._table
        now = time.monotonic()
        stalled = None
        for source, message in messages:
            if type(message) is int:
                if message:
                    table.add_cached(source, message, now)
                continue
            full, hits, extra = message
            for meta in full:
                table.add_full(source, meta, now)
            table.add_cached(source, hits, now)
            if extra:
                if extra.get("join"):
                    table.join(source)
                if "fail" in extra:
                    stalled = extra["fail"]
                    self._failing = False
                if "gone" in extra:
                    table.rank_gone(source, extra["gone"])
                    self._rounds.leave(source)
                    if self._rounds.orphaned:  # what rank 0 was to relay is lost: it fails here
                        self._fail_all(f"rank {source} {extra['gone']}")
        responses = table.take_ready()
        if stalled:  # after the round's decisions: a tensor this very round completed runs instead
            responses = table.fail_stalled(*stalled) + responses
        if len(responses) > 1:
            responses = fuse(responses, self._config.fusion_threshold_bytes, self._config.fusion_inplace_bytes)
        if responses:
            self._execute(responses)

    def _execute(self, responses: list[Response]) -> None:
        for response in responses:
            if response.kind is _JOIN:
                self._finish_join(response.last_joined)
                continue
            metas = response.metas
            in_flight = self._in_flight  # one dict.get each is atomic; submit's lock guards check-then-set
            if len(metas) == 1:
                name = metas[0].name
                entries = [in_flight.get(name)]
                self._undecided.discard(name)
            else:
                entries = [in_flight.get(m.name) for m in metas]
                for meta in metas:
                    self._undecided.discard(meta.name)
            if self._timeline is not None:
                now = self._timeline.now()
                for entry in entries:
                    if entry is not None:
                        self._timeline.span("negotiate", entry.submitted, now, 0, tensor=entry.meta.name)
            if response.error:
                self._finish(response, entries, CollectiveError(response.error))
            elif None in entries and self.rank not in response.joined:
                raise CollectiveError(
                    f"rank {self.rank} decided a collective on tensor(s) it never submitted: "
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

    def _check_stalls(self, now: float) -> None:
        check = self._config.stall_check_time_s
        self._next_stall_check = now + max(min(check, 5.0), 0.05) if check else float("inf")
        if not check:
            return
        shutdown = self._config.stall_shutdown_time_s
        if self._stuck_since and now - self._stuck_since >= check:
            # Only a warning: giving up on a round would be unsafe, since a peer that is merely slow
            # (stopped, swapped out) would on waking decide from that round without this rank.
            log.warning("commlib stall: rank %d has waited %.0f s for a coordinator message from rank(s) %s; "
                        "a process may have died, or be stuck without releasing the GIL",
                        self.rank, now - self._stuck_since, self._rounds.missing())
        if self.rank != 0:
            return
        for name, missing in self._table.stalled(check, now):
            if self._table.should_warn(name, now, check):
                log.warning("commlib stall: tensor %r was submitted by some ranks more than %g s ago; "
                            "waiting for rank(s) %s", name, check, missing)
        if shutdown and not self._failing:
            names = [name for name, _ in self._table.stalled(shutdown, now)]
            if names:  # failed in the round that carries them, on every rank alike
                self._extra["fail"] = (names, shutdown)
                self._failing = True

    # ---- background thread ---------------------------------------------------------------------------

    def _background(self) -> None:
        idle_since = None
        while not self._closed:
            with self._wakeup:
                if self._waiters or not self._has_work():
                    self._wakeup.wait(_IDLE_POLL_S)
                    idle_since = None
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
            if busy:
                idle_since = None
            elif self._has_work():
                now = time.perf_counter()
                idle_since = now if idle_since is None else idle_since
                self._backoff.pause(now - idle_since)

    def _has_work(self) -> bool:
        """Something to drive: own requests or notices, or (rank 0, the stall checker) tensors that some
        ranks submitted. Peers' rounds alone are answered at the idle poll."""
        return bool(self._incoming or self._in_flight or self._extra or
                    (self.rank == 0 and self._table.has_pending()))

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
        """This rank's last message: later rounds complete without it."""
        if self._rounds.left:
            return
        self._incoming.clear()
        self._extra["gone"] = reason
        self._contribute(last=True)

    def _await_peers_shutdown(self) -> None:
        """Wait (bounded) until every rank has shut down, so no message is left in flight when the
        communicators are freed; reading (and dropping) messages meanwhile keeps the others' sends flowing."""
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
