"""What ``auto`` learns from the calls it runs: each candidate algorithm's time per size class, measured on
this job and agreed between ranks, so that the choice is right on machines the cost model has never seen
(docs/algorithms.md, "How auto learns"; the measurements behind each rule: docs/results/auto_learn_rules.md).

A *bucket* is a size class (the message size's power of two), a codec, and whether the calls reduce one
buffer or several fused in place. Its :class:`State`:

- ``WARMING``: each candidate not yet run on this lane runs once, its time unused: first calls create
  sub-groups and scratch memory. Not where the model predicts ``LARGE_S`` or more: set-up is small there.
- ``MEASURING``: rounds in which each candidate runs a block of ``REPS`` consecutive calls from a barrier of
  the lane (``sync``): without it a rank that enters early times its wait for the others; blocks, because
  a job's calls come back to back and a call can pay for how the one before it ended. The candidates are
  the model's ranking within ``SPREAD`` of its best, at most ``MAX_CANDIDATES`` of commlib's, and MPI's own
  (``native``, the baseline auto must never lose to; for the half types, whose MPI reduction is a Python
  callback, last and only under ``SMALL_S``: :func:`.select.reduced_by_callback`). Where the model
  predicts ``SMALL_S`` or more, each block's first call is agreed at once, and a block whose first call
  took ``WATCH_S`` or more and ``CUT`` longer than the best so far ends there (it cannot take over). A
  candidate not measured yet whose block is next, and that a smaller class of such long calls agreed
  more than ``RECHECK`` slower than its best, is dropped unmeasured (long calls are the bytes they move).
  After the first round those slower than ``DROP`` times the best are dropped; short calls (under ``SMALL_S``)
  get a second round, the order rotated (a block can fall on a busy moment); the best and its closest
  within ``NEAR`` get up to ``EXTRA_ROUNDS`` more (one block cannot separate near-equal algorithms),
  within ``MAX_CALLS`` calls. A round ends in one small allreduce (``agree``, MAX) of every rank's block
  times, so every rank holds the same numbers.
- ``SETTLED``: the candidate with the least agreed time (ties to the model's order) runs every call, untimed.
- ``WATCHED``: settled on calls of ``WATCH_S`` or more, each of them timed and agreed: when the median of the
  last ``WATCH_CALLS`` is slower than the best measured rival by more than ``SWITCH``, the rival takes over
  (a block can catch an algorithm that is fast and slow by turns on its fast calls). Otherwise a rival
  that has not run watched calls here and that the model does not predict within ``SWITCH`` of the settled
  one is tried on as many (a block is timed from a barrier, alone; the job's calls are not): the model's
  favourite whatever its block (it ran the job's first, slowest calls), else the nearest within ``TRIAL``
  of that median, up to ``TRIALS`` per bucket; it stays where its median is the lower (two
  calls slower than the median it stood against end it). What a watch or a trial finds is the WATCHED
  sibling's time too, and its choice where it beats the sibling's by more than ``SWITCH``.
- ``CHECKING``: after ``RECHECK_FIRST`` settled calls (``RECHECK_SHORT`` for short calls), then 4x as many
  each time, the settled algorithm and up to two rivals measured within ``RECHECK`` of it (short calls:
  ``DROP``) run ``CHECK_ROUNDS`` rounds; one faster by more than ``SWITCH`` takes over: a choice settled on
  unlucky calls corrects itself.

:data:`NEXT` lists the moves between states, and every move goes through ``Bucket._enter``. A new bucket
of long calls whose sibling (the same class and codec, fused or not) has settled starts ``WATCHED`` on the
sibling's times instead of exploring: such calls are the bytes they move. A settled bucket can be kept
(:meth:`Bucket.to_kept`) and a later learner started from it (:meth:`Bucket.from_kept`). Where a
restored bucket's first ``WATCH_CALLS`` watched calls run more than ``STALE`` times slower or faster than
its kept time and than its kept watched calls' (where kept), the kept times were measured under other
conditions (another network under the same layout, a shared cache directory): the rivals' kept times are
forgotten and the nearest re-checked at once.

Paced exploring (``pace``, COMMLIB_AUTO_PACE): in a class the model does not call short, every call a
candidate runs over the best measured so far (the *leader*) costs a training step the difference. Each of
the class's calls earns ``pace`` of a leader call; a rival's block (with its warm-up call just before it,
where calls warm up) starts only once what it is expected to cost over the leader is earned (not
measured yet: the model's ratio, at most ``DROP``), and until then the leader runs in its place, untimed
(a *rest*). The warm-up call and the block's first call are agreed at once, and what they cost replaces
what was expected, so a rival slower than the model said is paid back by longer rests, and one faster
earns the difference; each block is agreed as it ends, and the fastest leads. What exploring adds then
stays near ``pace`` of the class's call time from the job's first step on (exploring at once cost the
first 10 steps of a DDP job 8-25%: docs/results/auto_learn_rules.md); the price is that a class settles
over more calls, so a job that ends first keeps its agreed blocks (:meth:`Bucket.to_kept`) and a later
job goes on from them (:meth:`Learner.restore`). The leader is the first candidate (the model's
favourite, or the commlib schedule that :func:`_native_not_first` puts before MPI's own) until a block is
agreed. Where the leader's calls take ``WATCH_S`` or more, the class explores at once: there a losing block
ends after one call (``CUT``), and the class must settle early for the watch and trials to correct its
blocks on the job's own calls (a 25-step job on the summation servers never settled paced, and ran the
ring, whose blocks beat the servers', at 1.6 s a step against 1.3 s).

Decisions are a function of agreed data only (the model's ranking, the MAX-reduced times, the count of
calls), never of a rank's own clock, so ranks whose clocks disagree still choose alike. Exploring is
bounded per bucket (``MAX_CALLS``) and per learner (``FREE_CALLS`` calls, then ``BUDGET`` of all calls;
beyond that a new bucket takes the model's choice). ``COMMLIB_AUTO_LEARN=0`` turns learning off.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import Callable, Mapping, Sequence

import numpy as np

SPREAD = 4.0         # candidates: predicted within this factor of the model's best
MAX_CANDIDATES = 3   # besides native
ROUNDS = 1           # scheduled measured rounds after the warm-up (2 below SMALL_S)
SMALL_S = 2e-3       # predicted best below this: a second scheduled round, the order rotated
REPS = 2             # consecutive calls per candidate per round: one block, timed from a barrier
MAX_CALLS = 20       # a bucket settles within this many calls (near-tie rounds only while they fit)
DROP = 2.0           # after the first round: drop candidates slower than this times the best
LARGE_S = 10e-3      # predicted best at least this: no warm-up call (set-up costs are small beside it)
TIE = 1e-6           # predicted times this close (relative) count as one candidate
FREE_CALLS = 400     # exploring calls always allowed per learner
BUDGET = 0.05        # beyond FREE_CALLS: exploring calls at most this share of all calls
NEAR = 0.10          # candidates within this (relative) of the best after the scheduled rounds: near-tied
EXTRA_ROUNDS = 2     # more rounds, of the near-tied only
RECHECK_FIRST = 64   # settled calls before the first re-check; each later one after 4x as many
RECHECK_SHORT = 16   # the same where the model predicts under SMALL_S
RECHECK = 1.25       # re-check the measured algorithms whose agreed time was within this of the settled one
                     # (DROP where the model predicts under SMALL_S)
CHECK_ROUNDS = 2     # rounds per re-check
SWITCH = 0.05        # a re-check switches to an algorithm faster than the settled one by more than this
WATCH_S = 50e-3      # settled buckets whose calls take at least this keep timing them (watch)
WATCH_CALLS = 3      # the settled algorithm's watched time: the median of its last this many calls
STALE = 1.5          # a restored bucket's first watched calls this far off its kept time: the kept times
                     # are not this job's (either way)
TRIAL = RECHECK      # a watched bucket tries a rival on watched calls where the rival's measured time is
                     # within this of the settled one's watched time
TRIALS = 2           # at most this many rivals tried per bucket, each once
CUT = 1 + SWITCH     # a block whose first call of WATCH_S or more is this much slower than the best so far
                     # ends there: it cannot take over (a long block's time is its slower call)

Agree = Callable[[np.ndarray], np.ndarray]  # elementwise MAX over the ranks of a float64 vector


class State(enum.Enum):
    """Where a bucket is in its schedule; the data each state uses is grouped under it in :class:`Bucket`."""

    NEW = "new"              # made, its schedule not chosen yet (inside Learner.bucket only)
    WARMING = "warming"      # each cold candidate once, untimed by the choice
    MEASURING = "measuring"  # measured rounds of blocks, each from a barrier
    SETTLED = "settled"      # the settled algorithm runs, untimed
    WATCHED = "watched"      # the settled algorithm runs, each call timed and agreed
    CHECKING = "checking"    # a re-check: the settled algorithm and its rivals run measured rounds


NEW, WARMING, MEASURING, SETTLED, WATCHED, CHECKING = State  # names for the per-call path (a global read)

#: The states whose bucket can be kept (:meth:`Bucket.to_kept`): it has settled.
KEPT = frozenset({SETTLED, WATCHED, CHECKING})

#: The moves between states: from each, the states a bucket may enter next (``Bucket._enter`` holds every
#: move to it). MEASURING and CHECKING enter themselves for each further round; an exploring bucket whose
#: sibling settles on long calls is adopted (WATCHED); a watch may hand over to a rival of short calls.
NEXT: dict[State, frozenset[State]] = {
    NEW: frozenset({WARMING, MEASURING, SETTLED, WATCHED}),
    WARMING: frozenset({MEASURING, WATCHED}),
    MEASURING: frozenset({MEASURING, SETTLED, WATCHED}),
    SETTLED: frozenset({CHECKING}),
    WATCHED: frozenset({CHECKING, SETTLED, WATCHED}),
    CHECKING: frozenset({CHECKING, SETTLED, WATCHED}),
}


@dataclasses.dataclass
class Bucket:
    """One size class: its state, the data of that state, and what it has measured in every state."""

    key: tuple
    candidates: list[str]           # in the model's order
    predicted_s: dict[str, float]   # the model's time of each at the first size seen
    reps: int                       # consecutive calls per candidate per round (a block)
    rounds: int                     # measured rounds (near-tie rounds add to them)
    state: State = NEW
    # -- WARMING, MEASURING, CHECKING: the round under way
    slots: list[str] = dataclasses.field(default_factory=list)    # its calls, in order
    local: list[float] = dataclasses.field(default_factory=list)  # this rank's times of its calls so far
    measuring: int = 0              # MEASURING: which of the rounds (1..rounds)
    checking: list[str] = dataclasses.field(default_factory=list)  # CHECKING: its algorithms, settled first
    checked: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # CHECKING: their agreed times
    # -- SETTLED, WATCHED, and CHECKING (which keeps the settled algorithm until the check ends)
    settled: str | None = None
    since: int = 0                  # calls since the bucket settled or was last re-checked
    next_check: int = RECHECK_FIRST  # re-check when ``since`` reaches this
    watched: list[float] = dataclasses.field(default_factory=list)  # WATCHED: agreed times of its calls
    trial: str | None = None        # WATCHED: the algorithm it settled on before trying this one (TRIAL)
    tried: list[str] = dataclasses.field(default_factory=list)  # algorithms whose calls were watched here
    trials: int = 0                 # rivals tried on watched calls (at most TRIALS)
    # -- what the bucket measured and did, in every state
    agreed: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # agreed time per call, per block
    dropped: list[str] = dataclasses.field(default_factory=list)
    cut: list[str] = dataclasses.field(default_factory=list)  # blocks ended after their first call (CUT)
    firsts: list[float] = dataclasses.field(default_factory=list)  # this round's agreed first calls (_probe)
    # -- MEASURING when paced (Learner.pace): rests between blocks
    paced: bool = False             # exploring pays for itself: blocks of rivals wait for ``allowance``
    leader: str | None = None       # the best measured so far (the first candidate before): rests run it
    leader_s: float | None = None   # its agreed time per call
    allowance: float = 0.0          # earned and not spent, in the leader's calls (``pace`` per call run)
    charged: float = 0.0            # what the block under way was charged when it began
    warms: bool = False             # a cold candidate's block begins with its warm-up call (under LARGE_S)
    approved: int = -1              # the block of the round beginning here has been charged
    agreed_upto: int = 0            # the round's calls before this one are in agreed blocks already
    aside: str | None = None        # the call under way is outside the round: "rest" or "warm" (pick -> record)
    rests: int = 0                  # rests run
    explored: int = 0               # calls run while exploring or checking
    extra: int = 0                  # near-tie rounds run
    checks: int = 0                 # re-checks run
    switches: int = 0               # of which changed the settled algorithm
    watch_switches: int = 0         # settled algorithms given up because their calls ran slower than a rival
    seeded: bool = False            # settled on its sibling's times (Learner._adopt)
    restored: bool = False          # settled on an earlier learner's times (from_kept)
    kept_compared: bool = False     # restored and watched: its first watched calls were held against it
    kept_watched: float | None = None  # restored: the kept median of the choice's watched calls
    stale: bool = False             # ... and were STALE off: the kept times were forgotten
    # -- the state as the per-call path reads it: one attribute each, set by _enter alone
    running: bool = dataclasses.field(default=False, init=False, repr=False)  # SETTLED or WATCHED
    untimed: bool = dataclasses.field(default=False, init=False, repr=False)  # SETTLED

    @property
    def keepable(self) -> bool:
        """Whether :meth:`to_kept` has something to keep: the bucket has settled, or it explores paced and
        has agreed blocks (a job that ends before such a class settles hands its blocks on)."""
        return self.state in KEPT or (self.state is MEASURING and self.paced and bool(self.agreed))

    @property
    def short(self) -> bool:
        """The model predicts this class's calls under ``SMALL_S``: a second round, earlier and wider
        re-checks."""
        return min(self.predicted_s.values(), default=0.0) < SMALL_S

    def begins_block(self, index: int) -> bool:
        """Whether call ``index`` of the round under way is its block's first (a block: a candidate's
        consecutive calls in ``slots``)."""
        return index == 0 or self.slots[index] != self.slots[index - 1]

    def block_starts(self) -> list[int]:
        """Where each block of the round under way begins in ``slots``."""
        return [i for i in range(len(self.slots)) if self.begins_block(i)]

    def lead_with_best(self) -> None:
        """The fastest agreed block so far leads (ties to the model's order)."""
        times = self.best_times()
        self.leader = min(times, key=lambda n: (times[n], self.candidates.index(n)))
        self.leader_s = times[self.leader]

    @property
    def watching(self) -> bool:
        """Whether the settled algorithm's calls are timed (:meth:`Learner.watched`)."""
        return self.state is WATCHED

    def best_times(self) -> dict[str, float]:
        """The agreed time of each candidate measured: its fastest agreed block, per call."""
        return {name: min(times) for name, times in self.agreed.items() if times}

    def times_so_far(self) -> dict[str, float]:
        """:meth:`best_times`, and the round under way's first calls agreed so far (``firsts``, one per block
        begun) where they are lower or new: a block cut after its first call is agreed with the round."""
        times = self.best_times()
        for name, first in zip((self.slots[i] for i in self.block_starts()), self.firsts):
            if first < times.get(name, float("inf")):
                times[name] = first
        return times

    @property
    def watched_median(self) -> float | None:
        """The median of the settled algorithm's last ``WATCH_CALLS`` watched calls (None before as many)."""
        return float(np.median(self.watched[-WATCH_CALLS:])) if len(self.watched) >= WATCH_CALLS else None

    def mark_tried(self, *names: str) -> None:
        """``names`` ran watched calls here: their times are the job's calls', not only a block's."""
        self.tried += [name for name in names if name not in self.tried]

    # -- the moves (NEXT): each enters a state and sets the data that state uses -------------------------
    def _enter(self, state: State) -> None:
        if state not in NEXT[self.state]:
            raise RuntimeError(f"auto {bucket_label(self.key)}: no move from {self.state.value} to "
                               f"{state.value}")
        self.state = state
        self.running = state is SETTLED or state is WATCHED
        self.untimed = state is SETTLED

    def _round(self, order: Sequence[str], calls: int) -> None:
        self.slots = [name for name in order for _ in range(calls)]
        self.approved = -1
        self.agreed_upto = 0
        self.local = []
        self.firsts = []

    def warm_up(self, cold: Sequence[str]) -> None:
        """WARMING: ``cold`` (candidates not run on this lane yet) once each."""
        self._enter(WARMING)
        self._round(cold, 1)

    def measure(self, number: int, order: Sequence[str]) -> None:
        """MEASURING: round ``number``, a block of each of ``order``."""
        self._enter(MEASURING)
        self.measuring = number
        self._round(order, self.reps)

    def check(self, algorithms: Sequence[str]) -> None:
        """CHECKING: the settled algorithm and its rivals (``algorithms``, settled first) begin a re-check."""
        self._enter(CHECKING)
        self.checking = list(algorithms)
        self.checked = {}
        self._round(self.checking, self.reps)

    def check_again(self, order: Sequence[str]) -> None:
        """CHECKING: the re-check's next round, a block of each of ``order``."""
        self._enter(CHECKING)
        self._round(order, self.reps)

    def settle_on(self, name: str | None) -> None:
        """SETTLED on ``name`` from now on, or WATCHED where its agreed time is at least ``WATCH_S``: there a
        clock read and one small allreduce per call cost under 1%."""
        mine = self.agreed.get(name) if name is not None else None
        self._enter(WATCHED if mine and min(mine) >= WATCH_S else SETTLED)
        self.settled = name
        self.trial = None
        self.slots, self.local, self.checking, self.checked, self.watched = [], [], [], {}, []
        self.paced = False

    # -- kept between jobs -------------------------------------------------------------------------------
    def to_kept(self) -> dict:
        """What this bucket settled, as JSON-ready data that :meth:`from_kept` restores: the candidates,
        the model's predictions, every agreed time, the dropped and the choice (None where it still
        explores, paced: its agreed blocks so far), and where the choice's calls were watched the median of
        its last ones (``watched_s``). A re-check or a trial under way is left out (the bucket's choice
        before it); a bucket that is not :attr:`keepable` has nothing to keep (ValueError)."""
        if not self.keepable:
            raise ValueError(f"auto {bucket_label(self.key)} has not settled (it is {self.state.value}) nor "
                             "agreed a paced block: there is nothing to keep")
        power, codec, fused = self.key
        kept = {"key": [power, codec, fused], "candidates": list(self.candidates),
                "predicted_s": dict(self.predicted_s), "reps": self.reps,
                "agreed": {name: list(times) for name, times in self.agreed.items()},
                "dropped": list(self.dropped),
                "settled": (self.trial or self.settled) if self.state in KEPT else None}
        if kept["settled"] is None:
            kept["allowance"] = float(self.allowance)  # earned over this job's calls: the next goes on
        if self.state is WATCHED and self.trial is None and self.watched_median is not None:
            kept["watched_s"] = self.watched_median  # (STALE)
        elif self.kept_watched is not None:
            kept["watched_s"] = self.kept_watched
        return kept

    @classmethod
    def from_kept(cls, data: Mapping) -> "Bucket":
        """A bucket settled on ``data`` (from :meth:`to_kept`): it runs the settled algorithm (WATCHED
        where its time is long) and re-checks it as a bucket that has just settled would, so a choice
        that no longer holds here still corrects itself. Where ``data`` settled nothing (a class explored
        paced), a NEW bucket holding its agreed blocks, which :meth:`Learner.restore` goes on exploring.
        ValueError names what in ``data`` is not one."""
        try:
            power, codec, fused = data["key"]
            key = (int(power), None if codec is None else str(codec), bool(fused))
            candidates = [str(name) for name in data["candidates"]]
            predicted = {str(name): float(t) for name, t in data["predicted_s"].items()}
            agreed = {str(name): [float(t) for t in times] for name, times in data["agreed"].items()}
            dropped = [str(name) for name in data["dropped"]]
            settled, reps = data["settled"], int(data["reps"])
            watched = data.get("watched_s")
            watched = None if watched is None else float(watched)
            allowance = float(data.get("allowance", 0.0))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a settled auto bucket ({type(exc).__name__}: {exc}); keep one with "
                             "Bucket.to_kept") from None
        unknown = sorted((set(agreed) | set(dropped) | set(predicted) | {settled}) - set(candidates) - {None})
        if settled is None and not agreed:
            unknown = ["(nothing settled nor measured)"]
        if unknown or reps < 1:
            raise ValueError(f"not a settled auto bucket for {bucket_label(key)}: "
                             + (f"{', '.join(unknown)} not among its candidates {candidates}" if unknown
                                else f"reps {reps} must be at least 1"))
        bucket = cls(key, candidates, predicted, reps=reps, rounds=ROUNDS, agreed=agreed, dropped=dropped,
                     restored=True, kept_watched=watched, allowance=allowance)
        bucket.next_check = RECHECK_SHORT if bucket.short else RECHECK_FIRST
        if settled is not None:
            bucket.settle_on(settled)
        return bucket


class Learner:
    """The learning state of one execution lane (one :class:`~.context.AlgorithmContext`); every rank of the
    lane holds an equal one because it sees the same calls in the same order and the same agreed times."""

    def __init__(self, agree: Agree, clock: Callable[[], float] = time.perf_counter,
                 sync: Callable[[], None] = lambda: None, pace: float = 0.0):
        self.agree = agree
        self.pace = pace    # exploring's share of a class's call time (COMMLIB_AUTO_PACE); 0: every block at once
        self.sync = sync    # a barrier of the lane: every measured block starts from it
        self.clock = clock  # replaceable in tests: a rank whose clock disagrees must still choose alike
        self.buckets: dict[tuple, Bucket] = {}
        self.calls = 0          # auto calls seen
        self.explored = 0       # of which exploring
        self.agreements = 0     # small MAX allreduces run
        self.watches = 0        # of which for watched calls (one each)
        self.warmed: set[str] = set()  # algorithms that have run on this lane (their set-up is paid)
        self.notes: list[str] = []  # what was learned, one line per settled bucket, for the timeline
        self.origin = ""  # where its buckets started: kept by an earlier job of the layout, or afresh

    # -- the schedule ------------------------------------------------------------------------------------
    def bucket(self, key: tuple, ranking: Callable[[], Sequence]) -> Bucket:
        """The bucket of ``key``, made from the model's ``ranking()`` (Choices, fastest first) when new."""
        found = self.buckets.get(key)
        if found is not None:
            return found
        ranked = [c for c in ranking() if c.predicted_s != float("inf")]
        best = ranked[0].predicted_s if ranked else 0.0
        names: list[str] = []
        last = None
        for c in ranked:
            if c.predicted_s > SPREAD * best or len([n for n in names if n != "native"]) == MAX_CANDIDATES:
                break
            if last is not None and abs(c.predicted_s - last) <= last * TIE:
                continue  # the same predicted time: on this layout the same exchanges (2 ranks: ring,
                # rabenseifner and hierarchical are one swap of halves); the model's first stands for them
            names.append(c.algorithm)
            last = c.predicted_s
        if "native" not in names and any(c.algorithm == "native" for c in ranked):
            names.append("native")
        predicted = {c.algorithm: c.predicted_s for c in ranked if c.algorithm in names}
        names = _native_not_first(names, predicted)
        bucket = Bucket(key, names, predicted, reps=REPS, rounds=ROUNDS, leader=names[0] if names else None)
        bucket.paced = self._paces(bucket)
        # short calls: a second round (of the candidates not dropped), as one block may fall on a busy
        # moment, and an earlier first re-check
        if bucket.short:
            bucket.rounds, bucket.next_check = ROUNDS + 1, RECHECK_SHORT
        cold = self._cold(names, best)
        if len(names) < 2 or not self._may_explore(bucket, len(cold)):
            bucket.settle_on(names[0] if names else None)
        elif self._adopt(bucket, self._sibling(key)):
            pass  # settled on the sibling's times, watched
        else:
            self._explore(bucket, names, cold)
        self.buckets[key] = bucket
        return bucket

    def _paces(self, bucket: Bucket) -> bool:
        """Whether ``bucket`` explores paced: this learner paces, the model does not call its calls short (so
        its blocks are probed), and its leader's calls, where known, take under ``WATCH_S``."""
        return (self.pace > 0 and not bucket.short and bucket.reps > 1
                and (bucket.leader_s is None or bucket.leader_s < WATCH_S))

    def _cold(self, names: Sequence[str], best: float) -> list[str]:
        """Which of ``names`` to warm up where the model's best time is ``best``: a first call's set-up
        (sub-groups, scratch memory) is paid once per algorithm and is small beside a long call, so only
        those that have not run on this lane, and only under ``LARGE_S``."""
        return [n for n in names if n not in self.warmed] if best < LARGE_S else []

    @staticmethod
    def _explore(bucket: Bucket, names: list[str], cold: list[str]) -> None:
        """Begin exploring ``names``: a warm-up round of the ``cold`` ones first, or where the bucket is
        paced, each cold one's warm-up call right before its block."""
        if cold and not bucket.paced:
            bucket.warm_up(cold)
        else:
            bucket.warms = bool(cold)
            bucket.measure(1, names)

    def _sibling(self, key: tuple) -> Bucket | None:
        """The bucket of the same size class and codec, fused where ``key`` is not or the other way round."""
        power, codec, fused = key
        return self.buckets.get((power, codec, not fused))

    def _adopt(self, bucket: Bucket, source: Bucket | None) -> bool:
        """Settle ``bucket`` (new, or still exploring) on what its sibling ``source`` measured (True), where
        ``source`` has settled with calls of at least ``WATCH_S``: such calls are the bytes they move, fused
        or not, and exploring them again costs a training step a call of each candidate. The settled
        algorithm is WATCHED against the sibling's rivals, so a difference still shows. Equal on every
        rank: both buckets are."""
        if source is None or (source.state is not SETTLED and source.state is not WATCHED):
            return False
        times = {name: list(seconds) for name, seconds in source.agreed.items()
                 if seconds and name in bucket.candidates}
        if not times or min(min(seconds) for seconds in times.values()) < WATCH_S:
            return False
        bucket.agreed = times
        bucket.tried = [name for name in source.tried if name in times]  # their times are watched ones
        bucket.seeded = True
        chosen = source.trial or source.settled  # a trial under way stands in for the source's choice
        bucket.settle_on(chosen if chosen in times else min(times, key=lambda n: min(times[n])))
        self.notes.append(describe(bucket))
        return True

    def _may_explore(self, bucket: Bucket, cold: int, calls: int | None = None) -> bool:
        cost = cold + (len(bucket.candidates) * bucket.rounds * bucket.reps if calls is None else calls)
        return self.explored + cost <= max(FREE_CALLS, BUDGET * self.calls)

    def _agree_blocks(self, bucket: Bucket, begin: int = 0) -> list[tuple[str, float]]:
        """(name, agreed seconds per call) of each block of this round from call ``begin`` on (a paced
        bucket agrees each block as it ends): every rank's block sums and call times, MAX over the ranks
        in one small allreduce. A block's time is the slowest rank's sum per
        call (per-call maxima would add up each call's wait for the others within the block), or where
        that is at least ``WATCH_S`` its slowest call: a job waits for each of its few long calls, and an
        algorithm whose long calls are fast and slow by turns shows it in a block's slower call, where the
        mean would halve it. A block cut after its first call (``CUT``) is that call."""
        local = np.asarray(bucket.local[begin:], np.float64)
        starts = np.asarray([i - begin for i in bucket.block_starts() if begin <= i < len(bucket.local)])
        sums = np.add.reduceat(local, starts)
        agreed = self.agree(np.concatenate([sums, local]))  # each rank's block sums, then its calls
        self.agreements += 1
        blocks = len(sums)
        lengths = np.diff(np.append(starts, len(local)))
        slowest = np.maximum.reduceat(agreed[blocks:], starts)
        out = []
        for b in range(blocks):
            mean = float(agreed[b]) / lengths[b]  # the slowest rank's block from the common start, per call
            out.append((bucket.slots[begin + starts[b]], mean if mean < WATCH_S else float(slowest[b])))
        return out

    def _probe(self, bucket: Bucket) -> None:
        """A block of a class the model does not call short has run its first call (the model can be 10x off:
        8 MiB across hosts at 1 Gbit/s, predicted 9 ms, takes 100): agree on it (MAX: the slowest rank's, from
        the block's barrier), and where it took ``WATCH_S`` or more and ``CUT`` longer than the best measured
        so far (this round's first calls and earlier rounds' blocks; in a re-check, the re-check's own) end
        the block there: a block of such calls is timed by its slower call, so it could not take over from
        the best so far, and its second call would cost a training step that call's time. The block's time
        is that first call."""
        index = len(bucket.local) - 1
        agreed = float(self.agree(np.array([bucket.local[index]], np.float64))[0])
        self.agreements += 1
        measured = bucket.checked if bucket.state is CHECKING else bucket.agreed  # a re-check: its own times
        known = bucket.firsts + [min(times) for times in measured.values() if times]
        bucket.firsts.append(agreed)
        name = bucket.slots[index]
        if known and agreed >= WATCH_S and agreed > CUT * min(known):
            del bucket.slots[index + 1:index + self._block_length(bucket, index)]
            if name not in bucket.cut:
                bucket.cut.append(name)
        if bucket.paced:
            self._pay(bucket, name, agreed, self._block_length(bucket, index))

    @staticmethod
    def _pay(bucket: Bucket, name: str, agreed: float, calls: int) -> None:
        """A paced block's first call took ``agreed``: charge what its ``calls`` cost over the leader instead
        of what was expected (a faster one earns the difference), and lead where it is the fastest yet.
        Where the leader's calls take ``WATCH_S`` or more, the bucket explores at once from now on: there a
        losing block ends after one call (CUT), and its calls must settle early to be watched and tried
        on the job's own calls, which is where long calls' blocks mislead (the summation servers')."""
        if bucket.leader_s is not None and name != bucket.leader:
            bucket.allowance += bucket.charged - (agreed / bucket.leader_s - 1) * calls
        bucket.charged = 0.0
        if bucket.leader_s is None or agreed < bucket.leader_s:
            bucket.leader, bucket.leader_s = name, agreed
        if name == bucket.leader and agreed >= WATCH_S:
            bucket.paced = bucket.warms = False

    # -- re-checks ---------------------------------------------------------------------------------------
    def _start_check(self, bucket: Bucket) -> bool:
        """Begin a re-check of a settled bucket (True), or put it off when nothing qualifies or the budget
        has no room (False)."""
        bucket.since = 0
        bucket.next_check *= 4
        rivals = _rivals(bucket, bucket.best_times())
        if not rivals or not self._may_explore(bucket, 0, (1 + len(rivals)) * bucket.reps * CHECK_ROUNDS):
            return False
        bucket.check([bucket.settled] + rivals)
        return True

    def _end_check_round(self, bucket: Bucket) -> None:
        for name, seconds in self._agree_blocks(bucket):
            bucket.checked.setdefault(name, []).append(seconds)
        rounds = len(bucket.checked[bucket.checking[0]])
        if rounds < CHECK_ROUNDS:
            shift = rounds % len(bucket.checking)
            bucket.check_again(bucket.checking[shift:] + bucket.checking[:shift])
            return
        best = {name: min(times) for name, times in bucket.checked.items()}
        old = bucket.settled
        winner = min(bucket.checking, key=lambda n: (best[n], bucket.checking.index(n)))
        switch = winner != old and best[winner] < best[old] * (1 - SWITCH)
        bucket.switches += switch
        for name, times in bucket.checked.items():  # what the check measured replaces the older times
            bucket.agreed[name] = list(times)
        bucket.settle_on(winner if switch else old)
        bucket.checks += 1
        self.notes.append(describe(bucket) + (f" (re-checked: was {old})" if bucket.settled != old
                                              else " (re-checked: kept)"))

    def pick(self, bucket: Bucket) -> str | None:
        """The algorithm of this call; None when the bucket has settled (the caller runs ``settled``). A
        call to measure returns after the lane's barrier: the caller starts its clock then."""
        self.calls += 1
        if bucket.running:  # SETTLED or WATCHED
            bucket.since += 1
            if bucket.since < bucket.next_check or not self._start_check(bucket):
                return None
        elif bucket.state is MEASURING and not bucket.paced:
            self._leave_out_losers(bucket)
            if bucket.running:
                return None
        index = len(bucket.local)
        if bucket.paced and bucket.begins_block(index) and bucket.approved != index:
            if not self._may_start(bucket, index):
                bucket.aside = "rest"
                return bucket.leader
            bucket.approved = index
            if bucket.warms and bucket.slots[index] not in self.warmed:
                bucket.aside = "warm"
                return bucket.slots[index]
        if bucket.state is not WARMING and bucket.begins_block(index):  # a measured block begins
            self.sync()
        return bucket.slots[index]

    def _leave_out_losers(self, bucket: Bucket) -> None:
        """Before a block of an unpaced class's round, other than its first: where the block's candidate
        has not been measured here and a smaller class of long calls on this lane (the same codec) agreed
        it more than ``RECHECK`` slower than that class's best, drop it unmeasured (and end the round
        where nothing is left to run). Long calls are the bytes they move: such a loser loses here too,
        and its block would cost a training step a call of it. Equal on every rank: agreed data only."""
        while bucket.state is MEASURING and 0 < len(bucket.local) < len(bucket.slots):
            index = len(bucket.local)
            name = bucket.slots[index]
            if not bucket.begins_block(index) or name in bucket.agreed or not self._lost_below(bucket, name):
                return
            del bucket.slots[index:index + self._block_length(bucket, index)]
            bucket.dropped.append(name)
            if len(bucket.local) == len(bucket.slots):
                self._end_round(bucket)

    def _lost_below(self, bucket: Bucket, name: str) -> bool:
        """Whether a smaller class of long calls (its best agreed time ``WATCH_S`` or more) with ``bucket``'s
        codec agreed ``name`` more than ``RECHECK`` slower than its best."""
        power, codec, _ = bucket.key
        for (other_power, other_codec, _), other in self.buckets.items():
            if other_power < power and other_codec == codec:
                times = other.times_so_far()
                best = min(times.values(), default=0.0)
                if best >= WATCH_S and times.get(name, 0.0) > RECHECK * best:
                    return True
        return False

    def _may_start(self, bucket: Bucket, index: int) -> bool:
        """Whether the block beginning at ``index`` of a paced bucket starts now (charging the allowance what
        it is expected to cost over the leader) or waits for more rests."""
        name = bucket.slots[index]
        if name == bucket.leader:
            bucket.charged = 0.0
            return True
        known = bucket.best_times().get(name)
        if known is not None and bucket.leader_s:
            ratio = known / bucket.leader_s
        else:  # not measured yet: the model's ratio (it ranks better than it times), at most DROP
            ratio = min(bucket.predicted_s[name] / bucket.predicted_s[bucket.leader], DROP)
        calls = self._block_length(bucket, index) + (bucket.warms and name not in self.warmed)  # its warm-up
        cost = max(ratio - 1, 0.0) * calls
        if bucket.allowance < cost:
            return False
        bucket.allowance -= cost
        bucket.charged = cost
        return True

    def _warmed_up(self, bucket: Bucket, name: str, seconds: float) -> None:
        """A paced block's candidate ran its warm-up call (``seconds`` here): it costs a training step as any
        call, so agree on it and charge what it ran over the leader."""
        self.warmed.add(name)
        bucket.explored += 1
        self.explored += 1
        agreed = float(self.agree(np.array([seconds], np.float64))[0])
        self.agreements += 1
        if name != bucket.leader and bucket.leader_s:
            bucket.allowance -= max(agreed / bucket.leader_s - 1, 0.0)

    @staticmethod
    def _block_length(bucket: Bucket, index: int) -> int:
        end = index
        while end < len(bucket.slots) and bucket.slots[end] == bucket.slots[index]:
            end += 1
        return end - index

    def record(self, bucket: Bucket, seconds: float) -> None:
        """The time this rank measured for the call :meth:`pick` chose; at the end of a round, agree."""
        if bucket.paced:
            bucket.allowance += self.pace
            aside, bucket.aside = bucket.aside, None
            if aside == "rest":  # the leader ran in a block's place: nothing measured
                bucket.rests += 1
                self.warmed.add(bucket.leader)
                return
            if aside == "warm":
                self._warmed_up(bucket, bucket.slots[len(bucket.local)], seconds)
                return
        bucket.local.append(seconds)
        index = len(bucket.local) - 1
        self.warmed.add(bucket.slots[index])
        bucket.explored += 1
        self.explored += 1
        if bucket.state is not WARMING and not bucket.short and bucket.reps > 1 and bucket.begins_block(index):
            self._probe(bucket)
        if bucket.paced and bucket.state is MEASURING and (index + 1 == len(bucket.slots)
                                                           or bucket.begins_block(index + 1)):
            self._end_paced_block(bucket, index)
        if len(bucket.local) == len(bucket.slots):
            if bucket.state is CHECKING:
                self._end_check_round(bucket)
            else:
                self._end_round(bucket)

    def _end_paced_block(self, bucket: Bucket, index: int) -> None:
        """A paced bucket's block ended at call ``index``: agree its time now (a job can end long before the
        round does, and hands on the blocks it agreed); the fastest block so far leads."""
        start = max(i for i in bucket.block_starts() if i <= index)
        for name, seconds in self._agree_blocks(bucket, start):
            bucket.agreed.setdefault(name, []).append(seconds)
        bucket.agreed_upto = index + 1
        bucket.lead_with_best()

    def _end_round(self, bucket: Bucket) -> None:
        """The warm-up or a measured round has run: the next measured round, or settled."""
        if bucket.state is MEASURING:  # agree on its times, then keep them
            if bucket.agreed_upto < len(bucket.local):  # (a paced bucket agreed each block as it ended)
                for name, seconds in self._agree_blocks(bucket, bucket.agreed_upto):
                    bucket.agreed.setdefault(name, []).append(seconds)
            if bucket.measuring == 1:
                times = bucket.best_times()
                best = min(times.values())
                bucket.dropped = [n for n in bucket.candidates  # (one left out unmeasured stays dropped)
                                  if n in bucket.dropped or times.get(n, float("inf")) > DROP * best]
        number = bucket.measuring + 1  # the next round (1 after the warm-up)
        alive = [n for n in bucket.candidates if n not in bucket.dropped]
        if number > bucket.rounds and len(alive) > 1 and bucket.extra < EXTRA_ROUNDS:
            times = bucket.best_times()
            best = min(times[n] for n in alive)
            near = sorted((n for n in alive if times[n] <= best * (1 + NEAR)),
                          key=lambda n: (times[n], bucket.candidates.index(n)))[:2]  # the best and its closest
            more = len(near) * bucket.reps
            watched = best >= WATCH_S  # the settled one's calls are timed anyway: the watch decides
            if len(near) > 1 and not watched and bucket.explored + more <= MAX_CALLS and self._may_explore(bucket, 0, more):
                bucket.extra += 1
                bucket.rounds += 1
                bucket.dropped += [n for n in alive if n not in near]
                alive = near
        if number > bucket.rounds or len(alive) == 1:
            times = bucket.best_times()
            bucket.settle_on(min(alive, key=lambda n: (times[n], bucket.candidates.index(n))))
            self.notes.append(describe(bucket))
            sibling = self._sibling(bucket.key)
            if sibling is not None and sibling.state in (WARMING, MEASURING):  # explored now and then:
                self._adopt(sibling, bucket)                                   # settle it too
            return
        shift = (number - 1) % len(alive)
        bucket.measure(number, alive[shift:] + alive[:shift])

    def watched(self, bucket: Bucket, seconds: float) -> None:
        """The time this rank took for a call of a WATCHED bucket's settled algorithm (no barrier before
        it). Agreed as the least over the ranks: the rank that entered last waited for nobody, so its time
        is the algorithm's own, not how late the framework let the others go. Where the median of the last
        ``WATCH_CALLS`` calls is slower than a measured rival by more than ``SWITCH``, the rival runs from
        now on and the settled one keeps that median as its time: one block can fall on the fast mode of
        an algorithm that is slow every other call, and what a job's calls show is what counts. A median,
        so that one call slowed by something else on the machine does not hand a good choice away."""
        agreed = -float(self.agree(np.array([-seconds], np.float64))[0])
        self.agreements += 1
        self.watches += 1
        bucket.watched.append(agreed)
        trial = bucket.trial
        if trial is not None and len(bucket.watched) == 2:
            # two calls slower than the algorithm the trial stands in for: so is their median, end it now
            if min(bucket.watched) > bucket.best_times()[trial]:
                return self._switch(bucket, trial, min(bucket.watched), "tried")
        typical = bucket.watched_median
        if typical is None:
            return
        if trial is not None:  # the trial's verdict: back, or the tried algorithm stays (watched as any)
            if typical >= bucket.best_times()[trial]:
                return self._switch(bucket, trial, typical, "tried")
            bucket.trial = None
            self._tell_sibling(bucket, bucket.settled, typical)
            self.notes.append(describe(bucket) + f" (tried: {bucket.settled} ran {typical * 1e3:.3f} ms per call, "
                              "it stays)")
        if bucket.restored and not bucket.kept_compared:
            bucket.kept_compared = True
            kept = bucket.best_times().get(bucket.settled)
            # off its kept block and off its kept calls: a block from a barrier can sit far from the
            # job's calls (the servers: 910 against 601 ms), and calls vary between jobs (1.5x at 16 MiB)
            if kept and _off(typical, kept) and (bucket.kept_watched is None or _off(typical, bucket.kept_watched)):
                self._forget_kept(bucket, typical)
                return
        times = bucket.best_times()
        rivals = [n for n in times if n != bucket.settled]
        if not rivals:
            return
        rival = min(rivals, key=lambda n: (times[n], bucket.candidates.index(n)))
        if typical > times[rival] * (1 + SWITCH):
            self._switch(bucket, rival, typical, "watched")
        elif not bucket.restored and bucket.trials < TRIALS:
            self._try_rival(bucket, rivals, times, typical)

    def _try_rival(self, bucket: Bucket, rivals: list[str], times: Mapping[str, float], typical: float) -> None:
        """Where one qualifies, run a rival on watched calls in place of the settled algorithm (TRIAL). A
        rival's time is a block's, from a barrier and the slowest rank's, and one block: the settled one's
        are its calls as the job makes them, beside the backward pass and other calls, which slow some
        schedules more than others. The nearest untried rival within TRIAL qualifies, and the model's
        favourite whatever its block (it is tried first): its block ran in the job's first calls, which are
        slower for every algorithm (docs/results/auto_learn_rules.md). Neither qualifies where the model
        calls it a twin of the settled one (the same bytes over the same links, predicted within SWITCH:
        their blocks differ by noise alone)."""
        predicted = bucket.predicted_s
        mine = predicted.get(bucket.settled, 0.0)
        favourite = min(bucket.candidates, key=lambda n: predicted.get(n, float("inf")))
        near = [n for n in sorted(rivals, key=lambda n: (n != favourite, times[n], bucket.candidates.index(n)))
                if n not in bucket.tried and (times[n] <= TRIAL * typical or n == favourite)
                and abs(predicted.get(n, 0.0) - mine) > SWITCH * mine]
        if not near:
            return
        old = self._hand_over(bucket, near[0], typical)
        bucket.trials += 1
        bucket.trial = old
        self.notes.append(describe(bucket) + f" (trying {near[0]} on watched calls: {old} ran "
                          f"{typical * 1e3:.3f} ms per call)")

    @staticmethod
    def _hand_over(bucket: Bucket, rival: str, typical: float) -> str:
        """``rival`` runs the watched calls from now on; the settled one keeps ``typical`` (its calls' median)
        as its time. Returns the one handed over from."""
        old = bucket.settled
        bucket.agreed[old] = [typical]
        bucket.mark_tried(old, rival)
        bucket.settle_on(rival)
        return old

    def _switch(self, bucket: Bucket, rival: str, typical: float, how: str) -> None:
        """The watched algorithm's calls ran ``typical`` each, slower than ``rival``: the rival runs from now
        on (``how``: "watched", or "tried" where a trial lost and the algorithm it stood in for comes back)."""
        old = self._hand_over(bucket, rival, typical)
        bucket.watch_switches += how == "watched"  # a trial that lost changed nothing
        self._tell_sibling(bucket, old, typical)
        self.notes.append(describe(bucket) + f" ({how}: {old} ran {typical * 1e3:.3f} ms per call)")

    def _tell_sibling(self, bucket: Bucket, name: str, typical: float) -> None:
        """``name``'s watched calls in ``bucket`` ran ``typical`` each: the same time for its WATCHED sibling
        (long calls are the bytes they move, fused or not), where it counts as tried; where that beats the
        sibling's choice (its last watched calls, else its time) by more than ``SWITCH``, the sibling runs
        ``name`` from its next call: a class called now and then (a step's last gradients arriving apart)
        would otherwise wait several steps for calls of its own. Equal on every rank: agreed data only."""
        sibling = self._sibling(bucket.key)
        if sibling is None or sibling.state is not WATCHED or sibling.trial is not None or sibling.restored \
                or name not in sibling.candidates:
            return
        sibling.agreed[name] = [typical]
        sibling.mark_tried(name)
        old = sibling.settled
        mine = sibling.watched_median
        if mine is None:
            mine = sibling.best_times().get(old)
        if name != old and mine is not None and mine > typical * (1 + SWITCH):
            sibling.mark_tried(old)  # (it ran the sibling's watched calls up to now)
            sibling.settle_on(name)
            sibling.watch_switches += 1
            self.notes.append(describe(sibling) + f" (its sibling's calls: {name} ran {typical * 1e3:.3f} ms "
                              f"per call, {old} {mine * 1e3:.3f})")

    def _forget_kept(self, bucket: Bucket, typical: float) -> None:
        """A restored bucket whose settled algorithm runs ``typical`` per call, STALE off its kept time: keep
        that time alone, and re-check at once the two rivals its kept times ranked nearest (MPI's own among
        them), so that the rivals' times too are this job's; the others are measured no more. Where the
        exploring budget has no room, the kept times stay (the watch and later re-checks still use them)."""
        kept = bucket.best_times()
        rivals = _rivals(bucket, kept, within=False)
        room = bool(rivals) and self._may_explore(bucket, 0, (1 + len(rivals)) * bucket.reps * CHECK_ROUNDS)
        if room:
            bucket.agreed = {bucket.settled: [typical]}
            bucket.stale = True
        self.notes.append(describe(bucket) + f" (kept times not this job's: {bucket.settled} ran "
                          f"{typical * 1e3:.3f} ms per call against {kept[bucket.settled] * 1e3:.3f} kept; "
                          + (f"re-checking {', '.join(rivals)})" if room else "no rival to re-check now)"))
        if room:
            bucket.since = 0
            bucket.check([bucket.settled] + rivals)

    def restore(self, bucket: Bucket) -> None:
        """Start ``bucket``'s class (``Bucket.from_kept``) settled, or where it had not settled, exploring
        from where an earlier job stopped: the candidates it did not measure, after a block of its leader
        (this job's calls may run apart from that job's), each paced where this learner paces; before the
        class's first call, equally on every rank."""
        if bucket.state not in (NEW, SETTLED, WATCHED):
            raise ValueError(f"auto {bucket_label(bucket.key)} is {bucket.state.value}: only a kept bucket "
                             "can be restored")
        if bucket.key in self.buckets:
            raise ValueError(f"auto {bucket_label(bucket.key)} already has a bucket on this lane")
        self.buckets[bucket.key] = bucket
        if bucket.state is NEW:
            self._go_on(bucket)

    def _go_on(self, bucket: Bucket) -> None:
        """A kept class that had not settled: lead with its best kept block, then a round of the leader and the
        candidates not measured yet (settled at once where none is left)."""
        bucket.lead_with_best()
        measured = bucket.best_times()
        left = [n for n in bucket.candidates if n not in measured and n not in bucket.dropped]
        if not left:
            bucket.settle_on(bucket.leader)
            self.notes.append(describe(bucket))
            return
        bucket.paced = self._paces(bucket)
        names = [bucket.leader] + left
        self._explore(bucket, names, self._cold(names, min(bucket.predicted_s.get(n, float("inf")) for n in names)))

    def settled(self, key: tuple) -> str | None:
        bucket = self.buckets.get(key)
        return bucket.settled if bucket is not None else None

    def take_notes(self) -> list[str]:
        notes, self.notes = self.notes, []
        return notes

    def summary(self) -> list[str]:
        """Where the buckets started (:attr:`origin`, when known), then one line per bucket, in size order:
        what was measured and chosen (for --explain)."""
        lines = [describe(b) for _, b in sorted(self.buckets.items(), key=lambda kv: _order(kv[0]))]
        return [self.origin] + lines if self.origin else lines


def _native_not_first(names: list[str], predicted: Mapping[str, float]) -> list[str]:
    """``names`` in the model's order, except that in a class the model does not call short, MPI's own
    goes behind the next candidate where the model predicts that one within ``NEAR`` of it: across nodes
    the model times MPI's own as the link bound (a black box, fitted on calls made alone), and commlib's
    schedules as the same bytes plus their reductions, so MPI's own is the favourite of every long class
    by construction, not by evidence. The first candidate runs a new class's first calls (the job's
    slowest: MPI's own set-up among them) and leads a paced class's rests (docs/results/auto_learn_rules.md);
    MPI's own is still measured, and chosen where it is faster."""
    if (len(names) < 2 or names[0] != "native" or min(predicted.values()) < SMALL_S
            or predicted[names[1]] > predicted["native"] * (1 + NEAR)):
        return names
    return [names[1], "native"] + names[2:]


def _rivals(bucket: Bucket, times: Mapping[str, float], within: bool = True) -> list[str]:
    """The (at most two) algorithms a re-check of ``bucket`` measures beside the settled one, nearest in
    ``times`` first, MPI's own among them whenever it qualifies: those within RECHECK (short calls: DROP)
    of the settled one's time, or (``within`` False) any not dropped."""
    mine = times.get(bucket.settled)
    if mine is None:
        return []
    near = (DROP if bucket.short else RECHECK) if within else float("inf")
    rivals = sorted((n for n in times if n != bucket.settled and times[n] <= near * mine
                     and (within or n not in bucket.dropped)),
                    key=lambda n: (times[n], bucket.candidates.index(n)))
    if "native" in rivals[2:]:  # MPI's own, the baseline, is checked whenever it qualifies
        rivals.remove("native")
        rivals.insert(1, "native")
    return rivals[:2]


def _off(seconds: float, kept: float) -> bool:
    """Whether ``seconds`` lies more than ``STALE`` times either way from ``kept``."""
    return not 1 / STALE <= seconds / kept <= STALE


def _order(key: tuple):
    return tuple("" if v is None else v for v in key)


def bucket_label(key: tuple) -> str:
    """``256K-512K fp16 (fused)``: the size class, the codec, and whether the calls were fused."""
    power, codec, many = key
    lo, hi = (1 << (power - 1)) if power else 0, 1 << power
    text = f"{_size(lo)}-{_size(hi)}"
    if codec:
        text += f" {codec}"
    return text + (" (fused)" if many else "")


def _size(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{n}"


def describe(bucket: Bucket) -> str:
    """``auto learned 1M-2M: ring 1.02 ms (model 0.95) < native 1.10 ms ... -> ring``."""
    times = bucket.best_times()
    if bucket.settled is None:
        return (f"auto {bucket_label(bucket.key)}: exploring {', '.join(bucket.candidates)} "
                f"({bucket.explored} calls so far)")
    if not times:
        return f"auto {bucket_label(bucket.key)}: {bucket.settled} (the model's choice, not measured)"
    parts = []
    for name in sorted(times, key=lambda n: times[n]):
        mark = " dropped" if name in bucket.dropped else " cut" if name in bucket.cut else ""
        parts.append(f"{name} {times[name] * 1e3:.3f} ms (model {bucket.predicted_s[name] * 1e3:.3f}){mark}")
    extra = f", {bucket.extra} near-tie round(s)" if bucket.extra else ""
    left_out = [name for name in bucket.dropped if name not in times]
    if left_out:
        extra += f", {', '.join(left_out)} left out (slower in a smaller class)"
    if bucket.rests:
        extra += f", {bucket.rests} calls of the leader between blocks (paced)"
    if bucket.seeded:
        extra += ", from its " + ("single" if bucket.key[2] else "fused") + " calls' times"
    if bucket.restored:
        extra += ", from an earlier job's times" + (" (not this job's: forgotten)" if bucket.stale else "")
    checks = f", {bucket.checks} re-check(s), {bucket.switches} switch(es)" if bucket.checks else ""
    if bucket.watch_switches:
        checks += f", {bucket.watch_switches} switch(es) on watched calls"
    return (f"auto learned {bucket_label(bucket.key)} in {bucket.explored} calls{extra}{checks}: "
            + ", ".join(parts) + f" -> {bucket.settled}")
