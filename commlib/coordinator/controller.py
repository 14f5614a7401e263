"""The coordinator of one process set: agrees across its ranks which named tensors are ready, then runs them.

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
5. Shutdown.  A rank that shuts down, fails, or leaves (its process exits without ``shutdown()``) says
   ``gone`` in its last message, with the reason; from that round on rounds complete without it, and
   every tensor that still needs it fails on every rank, naming it (:mod:`.lifecycle` documents the
   shutdown path, the exit hook and the goodbyes above their code).
6. Stalls (:mod:`.stalls`).  Rank 0 fails tensors some ranks never submitted by naming them in its next
   round message (rounds still complete). A rank that waits longer than ``COMMLIB_STALL_SHUTDOWN_TIME``
   for a round that a peer never answers gives up without that peer's message: it sends every peer a
   notice outside the rounds and fails; a rank that reads such a notice fails alike. Everything pending
   and every later call then raises, naming the silent ranks.

Why not a coordinator rank: a request to rank 0 and a response back is two message latencies and rank 0's
bookkeeping in between, on every small call; one direct round is one latency. The price is p - 1 messages
per rank per round instead of one, right for the ranks of a node or a few nodes; beyond
``COMMLIB_DIRECT_MAX_RANKS`` the relay through rank 0 keeps it at O(p) in all (a tree of relays, for
thousands of ranks, is not built).

Progress (:mod:`.progress`) is driven by whichever thread needs it: a thread waiting in ``synchronize``
runs the cycle itself, and the background thread runs it when nobody waits; both wait between cycles by
the policy of :mod:`.backoff`. A synchronous call with nothing else of its rank under way takes the lone
path (:meth:`Coordinator._run_alone`): the same protocol - its round message is the bare bit of its cache
id, step 1 - with the decision of steps 2-3 known without feeding the table when every rank sent that bit
alone (``ReadyTable.decide_alone``); anything else in the round goes through the table as above.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from ..errors import CollectiveError, InFlightError, PeerLostError
from .eager import EagerStore
from .execution import LaneSet
from .lifecycle import Lifecycle, StallShutdown
from .fusion import fuse
from .negotiation import ReadyTable
from .priority import PartResponse, PriorityQueue
from .progress import REPLY_POLLS, Progress, gather_limit_s, reply_arrived
from .requests import Entry, Handle, Kind, Response
from .rounds import make_rounds
from .stalls import StallInspector
from ..timeline import CYCLE_START, negotiate_name

log = logging.getLogger("commlib")

_CATCH_UP_READS = 20       # reads, 5 ms apart, after a long absence (see Coordinator._catch_up)
_JOIN = Kind.JOIN          # a global: an enum member costs an attribute lookup on the hot path
_monotonic = time.monotonic


class Coordinator(Lifecycle):
    """One per process set on each of its ranks. Thread-safe ``submit``; ``wait`` drives progress until a
    handle completes. ``world_ranks[r]`` is the world rank of set rank r (for messages)."""

    def __init__(self, channel, lanes: list, config, timeline=None, world_ranks=None, label: str = ""):
        self._channel = channel
        channel.quiet_after_loss = config.recovers_in_process  # (a send to a dead rank can crash the sender)
        self.rank = channel.rank
        self.size = channel.size
        self._config = config
        self._timeline = timeline
        self._world_ranks = list(world_ranks) if world_ranks is not None else list(range(self.size))
        self._label = label
        self._lanes = LaneSet(lanes, self._finish, self._release)
        self._engine = lanes[0].engine  # reduces eager tensors (kernels only: safe beside a lane's thread)
        self._table = ReadyTable(self.size, config.cache_capacity, self._world_ranks)
        relayed = self.size > config.direct_max_ranks
        self._rounds = make_rounds(channel, relay=relayed)
        self._stalls = StallInspector(self.rank, config, self.describe_ranks, relayed=relayed)
        self._eager = EagerStore(self.rank, self.size, config.eager_bytes, config.algorithm,
                                 self._engine.topology.cross_size, relayed)
        self._incoming: collections.deque[Entry] = collections.deque()
        self.submitted = 0  # submissions so far (Progress reads it to see whether a burst goes on)
        self.alone = 0      # synchronous calls this rank ran by the lone path (_run_alone; for tests)
        self._names = threading.Lock()          # guards _in_flight
        self._in_flight: dict[str, Entry] = {}  # submitted and not finished, by name
        self._undecided: set[str] = set()       # announced, no response yet (driving thread only)
        self._extra: dict = {}                  # join / gone / fail, for this rank's next message
        shutdown_s = config.stall_shutdown_time_s
        self._away_s = shutdown_s / 2 if shutdown_s else float("inf")  # see _catch_up
        self._last_cycle = time.monotonic()
        # how long tensors may wait for peers with no round open before this rank starts an empty one (cycle)
        self._probe_s = config.wait_limit_s / 4
        self._quiet_since = self._last_cycle
        self._failure: BaseException | None = None
        self._lost_in_lane: PeerLostError | None = None  # a lane's transfer timed out: fail in the cycle
        self._closed = False
        self._queue = PriorityQueue(config.priority_partition_bytes, config.priority_credit_bytes, self._finish)
        self._queued = self._queue.pending  # the queue's list itself: run() tests it without a call
        self._progress = Progress(self, config.cycle_time_ms / 1e3, gather_s=gather_limit_s(self._engine.topology))
        if not label and not self._lanes.threaded:  # the world's; a lane thread must not read the channel
            channel.deadline.watch = self.watch

    def describe_ranks(self, ranks) -> str:
        """Set ranks as the user knows them: world ranks (and the set, if not the world)."""
        names = [self._world_ranks[r] for r in ranks]
        return f"rank(s) {names}" + (f" of {self._label}" if self._label else "")

    def _who(self, rank: int) -> str:
        return f"rank {self._world_ranks[rank]}" + (f" of {self._label}" if self._label else "")

    # ---- user threads ------------------------------------------------------------------------------

    def submit(self, entry: Entry, drive: bool = False) -> Handle:
        """Queue ``entry`` for negotiation. ``drive``: the caller will wait on it at once, so the
        background thread need not be woken."""
        self._register(entry)
        self._incoming.append(entry)
        if not drive:
            self._progress.wake()
        return entry.handle

    def _register(self, entry: Entry) -> None:
        """Put ``entry`` in flight under its name (a name already in flight on this rank is an error)."""
        if self._failure is not None or self._closed or self._channel.deadline.lost is not None:
            self.check_usable()
        name = entry.meta.name
        with self._names:
            if name in self._in_flight:
                raise InFlightError(
                    f"tensor name {name!r} is already in flight on rank {self._world_ranks[self.rank]}; wait "
                    "for it (synchronize) before submitting the name again, or use a different name")
            self._in_flight[name] = entry
        entry.handle.owner = self
        self.submitted += 1

    def wait(self, handle: Handle) -> None:
        """Return when ``handle`` is done, running the coordinator's cycle in this thread meanwhile."""
        if not handle.done():
            self._progress.wait(handle)

    def run(self, entry: Entry) -> Handle:
        """Submit ``entry`` and wait for it, on this thread. Where this rank has nothing else under way in
        this coordinator, the request is negotiated and run here by :meth:`_run_alone`; otherwise (and
        whenever the round brings anything else) the general cycle runs it, driven by this thread too:
        registered as a waiter first, the background thread leaves the cycle to it."""
        progress = self._progress
        if not (self._in_flight or self._incoming or self._extra or self._queued or self._undecided
                or self._timeline is not None or self._failure is not None or self._closed) and progress.hold():
            # this rank has nothing else under way here, no timeline to write, no failure to report
            try:
                done = self._run_alone(entry)
            finally:
                progress.let_go()
            if not done:
                progress.wait(entry.handle)
        else:
            progress.wait(entry.handle, before=lambda: self.submit(entry, drive=True))
        return entry.handle

    def _run_alone(self, entry: Entry) -> bool:
        """The lone synchronous request, holding the cycle: what the cycle would do for it, without the
        cycle's generality. A request negotiated before (a cache id) goes out as this rank's round message,
        a bare bit vector; when every rank's message is that same bit and the ready table holds nothing
        else, the table's decision is known without feeding it (``decide_alone``: the response it would
        return, the table left as it would be) and the response runs at once. True when the request is
        done. False as soon as anything differs - a first negotiation, an eager tensor, a priority, a round
        that brings more, a peer slow to answer: the request is then where the general cycle expects it
        (queued, or announced and undecided), and the cycle takes over, so that results and errors are
        the general path's."""
        meta = entry.meta
        rounds = self._rounds
        channel = self._channel
        hit = -1
        if not (meta.priority or rounds.sent != rounds.completed or rounds.owed() or channel.notices):
            hit = self._table.cache_id(meta)
        if hit < 0 or self._eager.applies(meta):
            self.submit(entry, drive=True)
            return False
        self._register(entry)
        try:
            now = _monotonic()
            if now - self._last_cycle > self._away_s:
                self._catch_up()
            self._last_cycle = now
            message = 1 << hit
            messages = rounds.exchange(message, REPLY_POLLS)
            if messages is None:
                if not reply_arrived(rounds):
                    self._undecided.add(meta.name)
                    return False
                messages = rounds.next_complete()
            response = None if self._channel.notices else self._table.decide_alone(hit, message, messages)
            if response is None:  # the round brought more: the general path decides it, as the cycle would
                self._undecided.add(meta.name)
                self._complete_round(messages)
            else:
                self._lanes.run_one(response, entry)
                self.alone += 1
            if self._lost_in_lane is not None:
                raise self._lost_in_lane
        except Exception as exc:  # as a failed cycle: the user sees a CollectiveError, as every other rank
            self.fail(exc)
            self.check_usable()
            raise
        return entry.handle.done()

    def set_timeline(self, timeline) -> None:
        """Start (a Timeline) or stop (None) recording."""
        self._timeline = timeline
        self._lanes.set_timeline(timeline)

    # ---- what Progress reads -------------------------------------------------------------------------

    @property
    def lanes_threaded(self) -> bool:
        return self._lanes.threaded

    def undecided(self) -> bool:
        return bool(self._undecided) or bool(self._queue)

    def has_work(self) -> bool:
        """Something to drive: own requests or notices, or (rank 0, the stall checker) tensors that some
        ranks submitted. Peers' rounds alone are answered at the idle poll."""
        return bool(self._incoming or self._in_flight or self._extra or self._queue or
                    (self.rank == 0 and self._table.has_pending()))

    # ---- the cycle ---------------------------------------------------------------------------------

    def cycle(self) -> bool:
        """One pass: contribute new requests, read messages, answer rounds others started, and decide
        and execute every complete round. True if any progress was made."""
        if self._channel.deadline.lost is not None:  # another set of this rank, or a transfer, lost a peer:
            raise self._channel.deadline.lost       # this set fails too and tells its peers (Lifecycle.fail)
        rounds = self._rounds
        busy = False
        timeline = self._timeline
        marked = timeline.now() if timeline is not None and timeline.mark_cycles else 0.0
        now = time.monotonic()
        if now - self._last_cycle > self._away_s:
            self._catch_up()
        self._last_cycle = now
        if self._incoming or self._extra or (self._queue and rounds.sent == rounds.completed and self._lanes.idle()):
            busy = True  # (priority scheduling: something waits, so every rank starts the next round)
            self._contribute()
            for _ in range(REPLY_POLLS):  # peers usually answer within microseconds: wait here for it
                if not rounds.blocked() or rounds.receive():
                    break
        elif rounds.receive():
            busy = True
        if self._channel.notices:  # a peer gave up on the rounds: decide nothing more from them
            self._read_notices()
        # A peer started a round this rank has not joined: answer it, but not while a round this rank
        # contributed to is still incomplete. That round completes without this rank's help, and its
        # caller usually submits again at once: answering now with an empty message would push every
        # caller that is a little behind into one more round per call (peers drift apart when no
        # collective realigns them, as with eager tensors).
        while rounds.owed() and rounds.completed == rounds.sent:
            busy = True
            self._contribute()
        while busy:  # without news, no round can have completed
            messages = rounds.next_complete()
            if messages is None:
                break
            self._complete_round(messages)
        # A peer that died between rounds, after the others had announced a tensor it had not, leaves no
        # round open: no wait would ever time out (an idle job sends nothing), and only rank 0's tensor
        # stall warning would run. While announced tensors wait for peers and no round is open, start an
        # empty round now and then: a dead or frozen peer leaves it unanswered, and the silent-peer check
        # below gives up on it after the timeout, naming it.
        if busy or rounds.sent != rounds.completed or not self._undecided:
            self._quiet_since = now
        elif now - self._quiet_since >= self._probe_s and not rounds.left:
            self._quiet_since = now
            self._contribute()
        stalls = self._stalls
        if stalls.waiting(rounds.sent > rounds.completed, now):
            self._check_stalls()
        if busy and marked:  # idle cycles (thousands a second) are not marked
            timeline.instant(CYCLE_START, marked)
        if self._lost_in_lane is not None:
            raise self._lost_in_lane
        return busy

    def _contribute(self, last: bool = False) -> None:
        """This rank's message for the next round: what was submitted since the last one (possibly
        nothing), as cache bits where possible, plus any join, gone or fail notice."""
        full, hits, payloads = [], 0, []
        cache_id = self._table.cache_id
        eager = self._eager
        while self._incoming:
            entry = self._incoming.popleft()
            meta = entry.meta
            if meta.kind is _JOIN:
                self._extra["join"] = True
                continue
            self._undecided.add(meta.name)
            if eager.applies(meta):
                payloads.append(eager.outgoing(entry))
            hit = cache_id(meta)
            if hit >= 0:
                hits |= 1 << hit
            else:
                full.append(meta)
        if full or self._extra or payloads:
            extra, self._extra = self._extra, {}
            if payloads:
                extra["data"] = payloads
            message = (full, hits, extra)
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
                if "data" in extra and source != self.rank:
                    self._eager.receive(source, extra["data"])
                if extra.get("join"):
                    table.join(source)
                if "fail" in extra:
                    stalled = extra["fail"]
                    self._stalls.fail_applied()
                if "gone" in extra:
                    if "lost" in extra:  # as its notice would, whichever comes first
                        self._follow(source, extra["gone"], extra["lost"])
                    self._rank_gone(source, extra["gone"])
        responses = table.take_ready()
        if stalled:  # after the round's decisions: a tensor this very round completed runs instead
            responses = table.fail_stalled(*stalled, describe=self.describe_ranks) + responses
        if self._queue or (responses and PriorityQueue.wanted(responses)):
            self._execute(responses, queued=True)
            self._run_released()
            return
        if len(responses) > 1:
            # the in-place limit is searched on first use (tens of ms on 16 ranks), not at init
            responses = fuse(responses, self._config.fusion_threshold_bytes, self._engine.fusion_inplace_bytes,
                             apart=self._eager.applies)
        if responses:
            self._execute(responses)

    def _rank_gone(self, source: int, reason: str) -> None:
        """``source`` sent its last message: later rounds complete without it; what needs it fails."""
        who = self._who(source)
        for response, entries in self._queue.drop():  # decided with it, not started: cannot run any more
            self._finish(response, entries, CollectiveError(f"{who} {reason} before this tensor ran"))
        self._table.rank_gone(source, f"{who} {reason}")
        self._rounds.leave(source)
        if self._rounds.orphaned:  # what rank 0 was to relay is lost: it fails here
            self._fail_all(f"{who} {reason}")

    def _run_released(self) -> None:
        """Priority scheduling: start what the queue releases after this round (:mod:`.priority`), small
        ones fused as usual (partitions never: they are slices of one buffer)."""
        released = self._queue.release()
        if not released:
            return
        responses = [response for response, _ in released]
        if len(responses) > 1:
            parts = {id(r.metas[0]) for r in responses if type(r) is PartResponse}
            eager = self._eager.applies
            fused = fuse(responses, self._config.fusion_threshold_bytes, self._engine.fusion_inplace_bytes,
                         apart=lambda meta: id(meta) in parts or eager(meta))
            if len(fused) < len(responses):
                entries_of = {id(r): e for r, e in released}
                by_name = {r.metas[0].name: e[0] for r, e in released if type(r) is not PartResponse}
                released = [(r, entries_of.get(id(r)) or [by_name[m.name] for m in r.metas]) for r in fused]
        for response, entries in released:
            self._lanes.run(response, entries)

    def _execute(self, responses: list[Response], queued: bool = False) -> None:
        for response in responses:
            if response.kind is _JOIN:
                self._finish_join(response.last_joined, response.error)
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
                        kind = entry.meta.kind.name
                        self._timeline.span(negotiate_name(kind), entry.submitted, now, kind, entry.meta.name)
            if response.error:
                for meta in metas:
                    self._eager.discard(meta.name)
                self._finish(response, entries, CollectiveError(response.error))
            elif len(metas) == 1 and self._eager.applies(metas[0]):
                self._run_eager(response, entries)
            elif None in entries and self.rank not in response.joined:
                raise CollectiveError(
                    f"rank {self.rank} decided a collective on tensor(s) it never submitted: "
                    f"{[m.name for m, e in zip(response.metas, entries) if e is None]}")
            elif queued:
                self._queue.push(response, entries)
            else:
                self._lanes.run(response, entries)

    def _run_eager(self, response: Response, entries: list) -> None:
        """A tensor whose every contribution came with the rounds (:mod:`.eager`): reduce it here."""
        entry = entries[0]
        start = self._timeline.now() if self._timeline is not None else 0.0
        try:
            output = self._eager.run(self._engine, response, entry)
        except Exception as exc:  # noqa: BLE001 - as a lane reports it: the tensor fails, commlib goes on
            self._finish(response, entries, exc)
            return
        if self._timeline is not None:  # reduced by every rank from the round's data: no MPI call of its own
            kind = response.kind.name
            self._timeline.span(kind, start, self._timeline.now(), kind, response.metas[0].name, eager=True)
        self._finish(response, entries, None)
        if entry is not None:
            entry.handle.set_result(output)

    def _finish(self, response: Response, entries: list, error: BaseException | None) -> None:
        """Called when a response ran (or failed): release the names and complete failed handles."""
        if type(response) is PartResponse:  # one partition: the split finishes the whole on its last one
            response.split.part_done(error)
            return
        with self._names:
            for meta, entry in zip(response.metas, entries):
                if entry is not None and self._in_flight.get(meta.name) is entry:
                    del self._in_flight[meta.name]
        if isinstance(error, PeerLostError):  # fatal: the cycle fails the coordinator with it
            names = [m.name for m in response.metas[:4]]
            error = PeerLostError(f"tensor(s) {names}: {error}", error.ranks, error.what)
            self._lost_in_lane = error
        if error is not None:
            if not isinstance(error, CollectiveError):
                cause = error
                error = CollectiveError(f"{type(cause).__name__}: {cause}")
                error.__cause__ = cause
            for entry in entries:
                if entry is not None:
                    entry.handle.set_error(error)

    def _release(self, response: Response, entry: Entry) -> None:
        """What :meth:`_finish` does for one host tensor's response that ran without error (the lone
        path's): release its name. Without the lock: while the name is in flight no other thread can
        register or release it, and each dict operation is atomic."""
        name = response.metas[0].name
        in_flight = self._in_flight
        if in_flight.get(name) is entry:
            del in_flight[name]

    def _finish_join(self, last_joined: int, error: str = "") -> None:
        with self._names:
            entry = self._in_flight.pop("__join__", None)
        if entry is None:
            return
        if error:
            entry.handle.set_error(CollectiveError(error))
        else:
            entry.handle.set_result(self._world_ranks[last_joined] if last_joined >= 0 else last_joined)

    # ---- stalls --------------------------------------------------------------------------------------

    def _check_stalls(self) -> None:
        names, verdict = self._stalls.check(time.monotonic(), self._table, self._rounds.missing)
        if names:  # failed in the round that carries them, on every rank alike
            self._extra["fail"] = (names, self._config.stall_shutdown_time_s)
        if verdict:
            self._give_up(*verdict)

    def _give_up(self, verdict: str, silent: list[int]) -> None:
        """Abandon the rounds (peers stopped answering): tell every peer outside the rounds, and fail."""
        log.error("commlib stall on rank %d: %s", self._world_ranks[self.rank], verdict)
        lost = [self._world_ranks[r] for r in silent]
        self._tell_peers(verdict, lost)
        raise StallShutdown(verdict, lost, "a negotiation round")

    def watch(self, suspects=None) -> None:
        """Run by a transfer that has waited a while (:class:`~commlib.transport.deadline.Deadline`): read
        the control channel for a peer's notice that it lost a rank, and raise it here, so that a rank
        waiting for a peer that has already failed fails now, naming the lost rank. ``suspects``: world
        ranks the transfer ran out of time waiting for: the others are told first. Only from the thread
        that runs this coordinator's cycle, or when no thread does."""
        progress = self._progress
        if progress.holder != threading.get_ident():
            if not progress.lock.acquire(blocking=False):
                return
            try:
                self._watch(suspects)
            finally:
                progress.lock.release()
        else:
            self._watch(suspects)

    def _watch(self, suspects) -> None:
        if suspects:
            self._tell_peers(f"{self._who(self.rank)} ran out of time waiting for {self.describe_world(suspects)}",
                             suspects)
        self._rounds.receive()
        if self._channel.notices:
            self._read_notices()

    def describe_world(self, world_ranks) -> str:
        return f"rank(s) {list(world_ranks)}"

    def _catch_up(self) -> None:
        """This rank ran no cycle for a long time (stopped, or starved of the GIL): its peers may have given
        up on a rank. Their notices were sent after the round messages that are waiting here, and may arrive
        a little after them: read until a notice comes (or briefly), so that no round they abandoned over
        another rank is decided here. (A notice naming this rank is read as a suspicion, :meth:`_read_notices`:
        this rank then fails once its own wait for them runs out.)"""
        for _ in range(_CATCH_UP_READS):
            self._rounds.receive()
            if self._channel.notices:
                return
            time.sleep(0.005)

    def _read_notices(self) -> None:
        """A peer gave up on a round this rank also waits in, or lost a peer: give up too."""
        for source, verdict, lost in self._channel.receive_notices():
            self._follow(source, verdict, lost)

    def _follow(self, source: int, verdict: str, lost) -> None:
        """``source`` gave up (its notice, or its last round message naming the world ranks it ``lost``):
        give up too, naming them; not where they include this rank (a peer waited for this rank, which is
        waiting for someone else: not this one)."""
        if self._world_ranks[self.rank] in lost:
            return
        raise StallShutdown(f"{self._who(source)} gave up: {verdict}", lost or (self._world_ranks[source],),
                            "a peer's notice")
