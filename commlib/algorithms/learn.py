"""What ``auto`` learns from the calls it runs: the measured time of each algorithm per size class, agreed
between ranks, so that the choice is right on machines the cost model has never seen.

Per *bucket* - a size class (the message size's power of two: 48 KiB and 60 KiB share one), the codec, and
whether the call reduces one buffer or several fused in place - the learner runs a fixed, short schedule
(every input is equal on every rank, so every rank runs the same algorithm on the same call):

1. Candidates: the cost model's ranking at the bucket's first size (:func:`.select.rank_all`), keeping the
   algorithms predicted within ``SPREAD`` times the best, at most ``MAX_CANDIDATES`` of them besides MPI's
   own allreduce (``native``), which is measured wherever it can run: the model is unsure between those,
   and MPI's own is the baseline auto must never lose to (where the model ranks it among its first, it
   does not take the place of one of commlib's).
   Algorithms predicted exactly alike count once (the model's first): on such a layout they make the same
   exchanges (on 2 ranks ring, rabenseifner and hierarchical all swap halves).
2. Warm-up: each candidate that has not run on this lane yet runs once, untimed (first calls create
   sub-groups and scratch memory); skipped where the model predicts ``LARGE_S`` or more, where set-up costs
   are small beside the call.
3. Measured calls: one round in which each candidate runs a *block* of ``REPS`` consecutive calls,
   and after it candidates slower than ``DROP`` times the best are dropped; where the model predicts
   under ``SMALL_S``, a second round of the others, the order rotated by one (one block may fall on a
   busy moment of the machine; short calls make a second cheap). Every block starts after a
   barrier of the lane (``sync``, untimed): without it a rank that enters early times its wait for the
   others - how late the previous algorithm or the framework let them go, or a rank descheduled where
   ranks outnumber cores - which on 2 hosts x 2 ranks over 2 cores was several times a 4 KiB call and
   ranked the candidates at random. A block, not single calls, because what a job sees is calls back to
   back, and an algorithm's next call can pay for how its last one ended: there, recursive doubling's
   second call ran far faster than its first and MPI's did not; across 2 hosts x 1 rank at 16-64 MiB the
   ring took 560 ms on a call after another algorithm's and 840 ms per call in twos. At the end of a
   round every rank's vector of block times (and of call times) is reduced with MAX over the lane's
   communicator (one small allreduce): from then on every rank holds the same numbers, the slowest
   rank's time of each block from a common start, per call; or, where that is ``WATCH_S`` or more, the
   block's slowest call:
   a job waits for each of its few long calls, and some algorithms' long calls are fast and slow in
   turn (:meth:`Learner._agree_blocks`).
4. Near-ties: where a candidate ends the scheduled rounds within ``NEAR`` of the best, the best and the
   closest such one alone run up to ``EXTRA_ROUNDS`` more rounds, the order rotating (a one-block
   difference between near-equal algorithms is mostly noise; more blocks separate them or show that
   either will do), while the bucket's calls stay within ``MAX_CALLS``. Not where the best's calls take
   ``WATCH_S`` or more: the settled algorithm's calls are then watched (7), which compares it with the
   closest on calls the job needs anyway (on 2 hosts at 1 Gbit/s an 80 MiB call takes 0.7 s: 8 more
   exploring calls would spread the exploring over the first 16 steps of a job).
5. Settled: the candidate with the least agreed time (its fastest block; ties to the model's order) runs
   every later call of the bucket, untimed unless watched (7).
6. Re-checks: a settled bucket is checked again after ``RECHECK_FIRST`` more calls (``RECHECK_SHORT`` where
   the model predicts under ``SMALL_S``: such a check costs a few milliseconds, and a choice settled on
   noisy blocks - 4 ranks on 2 cores across hosts - then runs 16 calls, not 64), then after 4 times as
   many each time: the settled algorithm and the measured ones whose agreed time was within ``RECHECK``
   times it - ``DROP`` times where the model predicts under ``SMALL_S``: on 2 hosts x 2 ranks over 2 cores
   recursive doubling's 4 KiB blocks measured 1.33x MPI's own while exploring and 0.77x in 100 rounds
   after - (at most two besides it; MPI's own among them where it qualifies) run ``CHECK_ROUNDS`` rounds
   as in step 3, and the fastest of that check runs from then on if it beats the settled one by more
   than ``SWITCH``. A choice settled on unlucky calls (the machine was busy, a near-tie fell the wrong
   way) corrects itself; a right one costs a few calls of algorithms measured near it.

7. Watch: where the settled algorithm's agreed time is at least ``WATCH_S``, each of its calls is timed
   and agreed (the least over the ranks, no barrier: one small allreduce, under 1% of such a call); when
   the median of its last ``WATCH_CALLS`` calls is slower than the best measured rival by more than
   ``SWITCH``, the rival takes over and the old one keeps that median as its time. A block of two calls
   can catch an algorithm whose calls are fast and slow in turn on its fast calls; the watch corrects
   that choice within a few calls, where a re-check would come only after ``RECHECK_FIRST``.
8. Siblings: a new bucket of long calls whose sibling (the same size class and codec, fused where it is
   not, or the other way round) has settled with calls of at least ``WATCH_S`` starts settled on the
   sibling's choice and times, watched (7), instead of exploring: such calls are dominated by the bytes
   they move, and a training step whose last gradients now and then arrive apart reduces them one by
   one where it usually fuses them.
Decisions are a function of agreed data only (the model's ranking, the MAX-reduced times and the count
of calls, which every rank sees alike), never of a rank's own clock, so ranks whose clocks disagree still
choose alike. Exploration is bounded: at most ``MAX_CANDIDATES + 1`` algorithms x ``REPS`` measured calls
per bucket, plus one warm-up call per algorithm and lane, plus ``EXTRA_ROUNDS`` rounds of the two
near-tied (at most ``MAX_CALLS`` calls in all, usually 16 or fewer), only among algorithms the model predicts within
``SPREAD`` of the best; a re-check runs at most 3 algorithms measured within ``RECHECK`` (short calls:
``DROP``) of the settled
one, ``CHECK_ROUNDS`` x 2 calls each, after 4x as many calls each time; and once more than ``FREE_CALLS`` calls have explored, a new bucket is explored only while exploring calls stay under
``BUDGET`` of all calls (the rest use the model's choice). ``COMMLIB_AUTO_LEARN=0`` turns learning off:
``auto`` is then the cost model's choice alone.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import numpy as np

SPREAD = 4.0         # candidates: predicted within this factor of the model's best
MAX_CANDIDATES = 3   # besides native
ROUNDS = 1           # scheduled measured rounds after the warm-up (2 below SMALL_S)
SMALL_S = 2e-3       # predicted best below this: a second scheduled round, the order rotated
REPS = 2             # consecutive calls per candidate per round: one block, timed from a barrier
MAX_CALLS = 20       # a bucket settles within this many calls (near-tie rounds only while they fit)
DROP = 2.0           # after the first round: drop candidates slower than this times the best
LARGE_S = 10e-3      # predicted best at least this: no warm-up call (set-up costs are small beside it:
                     # first calls on 2 hosts were at most 2 ms slower than the next, at 1 and 4 MiB)
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

Agree = Callable[[np.ndarray], np.ndarray]  # elementwise MAX over the ranks of a float64 vector


@dataclasses.dataclass
class Bucket:
    """One size class's schedule and what it measured."""

    key: tuple
    candidates: list[str]           # in the model's order
    predicted_s: dict[str, float]   # the model's time of each at the first size seen
    reps: int                       # consecutive calls per candidate per round (a block)
    rounds: int                     # measured rounds
    phase: int = 0                  # 0: warm-up; 1..rounds: measured rounds
    slots: list[str] = dataclasses.field(default_factory=list)    # this phase's calls, in order
    local: list[float] = dataclasses.field(default_factory=list)  # this rank's times of this phase's calls
    agreed: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # agreed time per call, per block
    dropped: list[str] = dataclasses.field(default_factory=list)
    settled: str | None = None
    explored: int = 0               # calls run while exploring
    extra: int = 0                  # near-tie rounds run
    since: int = 0                  # calls since the bucket settled or was last re-checked
    next_check: int = RECHECK_FIRST  # re-check when ``since`` reaches this
    checking: list[str] = dataclasses.field(default_factory=list)  # a re-check's algorithms, settled first
    checked: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # agreed times of this check
    checks: int = 0                 # re-checks run
    switches: int = 0               # of which changed the settled algorithm
    watched: list[float] = dataclasses.field(default_factory=list)  # agreed times of the settled's calls
    watch_switches: int = 0         # settled algorithms given up because their calls ran slower than a rival
    # whether the settled algorithm's calls are timed (Learner.watched): its agreed time is at least
    # WATCH_S, where a clock read and one small allreduce per call cost under 1%. A field, set where the
    # settled algorithm or its time changes (settle_on): a settled call of a few microseconds reads it
    watching: bool = False
    seeded: bool = False            # settled on its sibling's times (Learner._adopt)

    @property
    def short(self) -> bool:
        """The model predicts this class's calls under ``SMALL_S``: a second round, earlier and wider
        re-checks."""
        return min(self.predicted_s.values(), default=0.0) < SMALL_S

    def settle_on(self, name: str | None) -> None:
        """Run ``name`` from now on (untimed, or watched where its agreed time is long)."""
        self.settled = name
        mine = self.agreed.get(name) if name is not None else None
        self.watching = bool(mine) and min(mine) >= WATCH_S

    def best_times(self) -> dict[str, float]:
        """The agreed time of each candidate measured: its fastest agreed block, per call."""
        return {name: min(times) for name, times in self.agreed.items() if times}


class Learner:
    """The learning state of one execution lane (one :class:`~.context.AlgorithmContext`); every rank of the
    lane holds an equal one because it sees the same calls in the same order and the same agreed times."""

    def __init__(self, agree: Agree, clock: Callable[[], float] = time.perf_counter,
                 sync: Callable[[], None] = lambda: None):
        self.agree = agree
        self.sync = sync    # a barrier of the lane: every measured block starts from it
        self.clock = clock  # replaceable in tests: a rank whose clock disagrees must still choose alike
        self.buckets: dict[tuple, Bucket] = {}
        self.calls = 0          # auto calls seen
        self.explored = 0       # of which exploring
        self.agreements = 0     # small MAX allreduces run
        self.watches = 0        # of which for watched calls (one each)
        self.warmed: set[str] = set()  # algorithms that have run on this lane (their set-up is paid)
        self.notes: list[str] = []  # what was learned, one line per settled bucket, for the timeline

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
            if last is not None and c.predicted_s <= last * (1 + TIE):
                continue  # the same predicted time: on this layout the same exchanges (2 ranks: ring,
                # rabenseifner and hierarchical are one swap of halves); the model's first stands for them
            names.append(c.algorithm)
            last = c.predicted_s
        if "native" not in names and any(c.algorithm == "native" for c in ranked):
            names.append("native")
        predicted = {c.algorithm: c.predicted_s for c in ranked if c.algorithm in names}
        bucket = Bucket(key, names, predicted, reps=REPS, rounds=ROUNDS)
        # short calls: a second round (of the candidates not dropped), as one block may fall on a busy
        # moment, and an earlier first re-check
        if bucket.short:
            bucket.rounds, bucket.next_check = ROUNDS + 1, RECHECK_SHORT
        # a first call's set-up (sub-groups, scratch memory) is paid once per algorithm, and is small beside
        # a long call: warm up only what has not run yet, and only where calls are short
        cold = [n for n in names if n not in self.warmed] if best < LARGE_S else []
        if len(names) < 2 or not self._may_explore(bucket, len(cold)):
            bucket.settle_on(names[0] if names else None)
            bucket.phase = bucket.rounds + 1
        elif self._adopt(bucket, self._sibling(key)):
            pass  # settled on the sibling's times, watched
        elif cold:
            bucket.slots = cold  # the warm-up: each once
        else:
            bucket.phase = 1
            bucket.slots = [name for name in names for _ in range(bucket.reps)]
        self.buckets[key] = bucket
        return bucket

    def _sibling(self, key: tuple) -> Bucket | None:
        """The bucket of the same size class and codec, fused where ``key`` is not or the other way round."""
        power, codec, fused = key
        return self.buckets.get((power, codec, not fused))

    def _adopt(self, bucket: Bucket, source: Bucket | None) -> bool:
        """Settle ``bucket`` (new, or still exploring) on what its sibling ``source`` measured (True), where
        ``source`` has settled with calls of at least ``WATCH_S``: such calls are dominated by the bytes
        they move, fused or not, and exploring again runs each candidate twice more at up to a second a
        call (on 2 hosts a training step whose last gradients arrive apart now and then reduces them one
        by one instead of fused). The settled algorithm is watched (step 7) against the sibling's rivals,
        so a difference still shows. Equal on every rank: both buckets are."""
        if source is None or source.settled is None or source.checking:
            return False
        times = {name: list(seconds) for name, seconds in source.agreed.items()
                 if seconds and name in bucket.candidates}
        if not times or min(min(seconds) for seconds in times.values()) < WATCH_S:
            return False
        bucket.agreed = times
        bucket.phase = bucket.rounds + 1
        bucket.slots, bucket.local = [], []
        bucket.seeded = True
        bucket.settle_on(source.settled if source.settled in times else min(times, key=lambda n: min(times[n])))
        self.notes.append(describe(bucket))
        return True

    def _may_explore(self, bucket: Bucket, cold: int, calls: int | None = None) -> bool:
        cost = cold + (len(bucket.candidates) * bucket.rounds * bucket.reps if calls is None else calls)
        return self.explored + cost <= max(FREE_CALLS, BUDGET * self.calls)

    def _agree_blocks(self, bucket: Bucket) -> list[tuple[str, float]]:
        """(name, agreed seconds per call) of each block of this round: every rank's block sums and call
        times, MAX over the ranks in one small allreduce. A block's time is the slowest rank's sum per
        call (per-call maxima would add up each call's wait for the others within the block), or where
        that is at least ``WATCH_S`` its slowest call: a job waits for each of its few long calls, and algorithms
        whose long calls are fast and slow in turn (the ring and rabenseifner at 80 MiB between 2 hosts
        at 1 Gbit/s: 0.70 or 1.05 s per call, the pipelined ring 0.71-0.74 s every call) show it in a
        block's slower call, where the mean of two halves it."""
        reps = bucket.reps
        local = np.asarray(bucket.local, np.float64)
        sums = np.add.reduceat(local, np.arange(0, len(local), reps))
        agreed = self.agree(np.concatenate([sums, local]))  # each rank's block sums, then its calls
        self.agreements += 1
        blocks = len(sums)
        calls = agreed[blocks:].reshape(blocks, reps)
        out = []
        for b in range(blocks):
            mean = float(agreed[b]) / reps  # the slowest rank's block from the common start, per call
            out.append((bucket.slots[b * reps], mean if mean < WATCH_S else float(calls[b].max())))
        return out

    # -- re-checks ---------------------------------------------------------------------------------------
    def _start_check(self, bucket: Bucket) -> bool:
        """Begin a re-check of a settled bucket (True), or put it off when nothing qualifies or the budget
        has no room (False)."""
        bucket.since = 0
        bucket.next_check *= 4
        times = bucket.best_times()
        mine = times.get(bucket.settled)
        if mine is None:
            return False
        near = DROP if bucket.short else RECHECK
        rivals = sorted((n for n in times if n != bucket.settled and times[n] <= near * mine),
                        key=lambda n: (times[n], bucket.candidates.index(n)))
        if "native" in rivals[2:]:  # MPI's own, the baseline, is checked whenever it qualifies
            rivals.remove("native")
            rivals.insert(1, "native")
        rivals = rivals[:2]
        if not rivals or not self._may_explore(bucket, 0, (1 + len(rivals)) * bucket.reps * CHECK_ROUNDS):
            return False
        bucket.checking = [bucket.settled] + rivals
        bucket.checked = {}
        bucket.local = []
        bucket.slots = [name for name in bucket.checking for _ in range(bucket.reps)]
        return True

    def _end_check_round(self, bucket: Bucket) -> None:
        for name, seconds in self._agree_blocks(bucket):
            bucket.checked.setdefault(name, []).append(seconds)
        bucket.local = []
        rounds = len(bucket.checked[bucket.checking[0]])
        if rounds < CHECK_ROUNDS:
            order = bucket.checking[rounds % len(bucket.checking):] + bucket.checking[:rounds % len(bucket.checking)]
            bucket.slots = [name for name in order for _ in range(bucket.reps)]
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
        bucket.checking, bucket.checked, bucket.slots, bucket.watched = [], {}, [], []
        self.notes.append(describe(bucket) + (f" (re-checked: was {old})" if bucket.settled != old
                                              else " (re-checked: kept)"))

    def pick(self, bucket: Bucket) -> str | None:
        """The algorithm of this call; None when the bucket has settled (the caller runs ``settled``). A
        call to measure returns after the lane's barrier: the caller starts its clock then."""
        self.calls += 1
        if bucket.settled is not None and not bucket.checking:
            bucket.since += 1
            if bucket.since < bucket.next_check or not self._start_check(bucket):
                return None
        index = len(bucket.local)
        if (bucket.phase > 0 or bucket.checking) and index % bucket.reps == 0:  # a measured block begins
            self.sync()
        return bucket.slots[index]

    def record(self, bucket: Bucket, seconds: float) -> None:
        """The time this rank measured for the call :meth:`pick` chose; at the end of a round, agree."""
        bucket.local.append(seconds)
        self.warmed.add(bucket.slots[len(bucket.local) - 1])
        bucket.explored += 1
        self.explored += 1
        if len(bucket.local) == len(bucket.slots):
            if bucket.checking:
                self._end_check_round(bucket)
            else:
                self._end_phase(bucket)

    def _end_phase(self, bucket: Bucket) -> None:
        if bucket.phase > 0:  # a measured round: agree on its times, then keep them
            for name, seconds in self._agree_blocks(bucket):
                bucket.agreed.setdefault(name, []).append(seconds)
            if bucket.phase == 1:
                best = min(bucket.best_times().values())
                bucket.dropped = [n for n in bucket.candidates if bucket.best_times()[n] > DROP * best]
        bucket.phase += 1
        bucket.local = []
        alive = [n for n in bucket.candidates if n not in bucket.dropped]
        if bucket.phase > bucket.rounds and len(alive) > 1 and bucket.extra < EXTRA_ROUNDS:
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
        if bucket.phase > bucket.rounds or len(alive) == 1:
            times = bucket.best_times()
            bucket.settle_on(min(alive, key=lambda n: (times[n], bucket.candidates.index(n))))
            bucket.slots = []
            self.notes.append(describe(bucket))
            sibling = self._sibling(bucket.key)
            if sibling is not None and sibling.settled is None:  # explored now and then: settle it too
                self._adopt(sibling, bucket)
            return
        shift = (bucket.phase - 1) % len(alive)
        order = alive[shift:] + alive[:shift]
        bucket.slots = [name for name in order for _ in range(bucket.reps)]

    def watched(self, bucket: Bucket, seconds: float) -> None:
        """The time this rank took for a call of a watched bucket's settled algorithm (no barrier before
        it). Agreed as the least over the ranks: the rank that entered last waited for nobody, so its time
        is the algorithm's own, not how late the framework let the others go. Where the median of the last
        ``WATCH_CALLS`` calls is slower than a measured rival by more than ``SWITCH``, the rival runs from
        now on and the settled one keeps that median as its time: one block can fall on
        the fast mode of an algorithm that is slow every other call (recursive doubling and MPI's own at
        16-80 MiB between 2 hosts at 1 Gbit/s beside a training step ran 0.7 s or 1.0-1.5 s per call; the
        pipelined ring 0.7 s every call), and what a job's calls show is what counts. A median, so that one
        call slowed by something else on the machine does not hand a good choice away."""
        agreed = -float(self.agree(np.array([-seconds], np.float64))[0])
        self.agreements += 1
        self.watches += 1
        bucket.watched.append(agreed)
        if len(bucket.watched) < WATCH_CALLS:
            return
        typical = float(np.median(bucket.watched[-WATCH_CALLS:]))
        times = bucket.best_times()
        rivals = [n for n in times if n != bucket.settled]
        if not rivals:
            return
        rival = min(rivals, key=lambda n: (times[n], bucket.candidates.index(n)))
        if typical > times[rival] * (1 + SWITCH):
            old = bucket.settled
            bucket.agreed[old] = [typical]
            bucket.settle_on(rival)
            bucket.watched = []
            bucket.watch_switches += 1
            self.notes.append(describe(bucket) + f" (watched: {old} ran {typical * 1e3:.3f} ms per call)")

    def settled(self, key: tuple) -> str | None:
        bucket = self.buckets.get(key)
        return bucket.settled if bucket is not None else None

    def take_notes(self) -> list[str]:
        notes, self.notes = self.notes, []
        return notes

    def summary(self) -> list[str]:
        """One line per bucket, in size order: what was measured and chosen (for --explain)."""
        return [describe(b) for _, b in sorted(self.buckets.items(), key=lambda kv: _order(kv[0]))]


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
        mark = " dropped" if name in bucket.dropped else ""
        parts.append(f"{name} {times[name] * 1e3:.3f} ms (model {bucket.predicted_s[name] * 1e3:.3f}){mark}")
    extra = f", {bucket.extra} near-tie round(s)" if bucket.extra else ""
    if bucket.seeded:
        extra += ", from its " + ("single" if bucket.key[2] else "fused") + " calls' times"
    checks = f", {bucket.checks} re-check(s), {bucket.switches} switch(es)" if bucket.checks else ""
    if bucket.watch_switches:
        checks += f", {bucket.watch_switches} switch(es) on watched calls"
    return (f"auto learned {bucket_label(bucket.key)} in {bucket.explored} calls{extra}{checks}: "
            + ", ".join(parts) + f" -> {bucket.settled}")
