"""The learner's bucket as a state machine (commlib/algorithms/learn.py): the moves a bucket makes, that
the table of moves (``learn.NEXT``) is exactly what the learner uses, the data each state keeps, and a
settled bucket kept as data and restored into a later learner (what "auto that remembers" builds on).

One learner stands for every rank here (its agreement is the identity); tests/algorithms/test_auto_learn.py runs
several ranks and real jobs."""

from __future__ import annotations

import json
import random

import pytest

from commlib.algorithms import learn
from commlib.algorithms.learn import CHECKING, MEASURING, NEW, SETTLED, WARMING, WATCHED, Bucket, Learner
from commlib.algorithms.select import Choice


def ranking(predicted: dict[str, float]):
    return lambda: sorted((Choice(n, 1 << 20, t) for n, t in predicted.items()), key=lambda c: c.predicted_s)


class Job:
    """One learner driven call by call on a virtual clock: a call of A takes ``truth(i)[A]`` seconds."""

    def __init__(self, predicted, truth, learner: Learner | None = None):
        self.clock = 0.0
        self.syncs = 0
        self.learner = learner or Learner(lambda v: v, clock=lambda: self.clock, sync=self._sync)
        self.predicted, self.truth, self.i = predicted, truth, 0
        self.states: list[tuple] = []  # (key, state) of every bucket after every call

    def _sync(self):
        self.syncs += 1

    def call(self, key=(20, None, False)) -> str:
        truth = self.truth(self.i) if callable(self.truth) else self.truth
        self.i += 1
        bucket = self.learner.bucket(key, ranking(self.predicted))
        name = self.learner.pick(bucket)
        ran = name or bucket.settled
        if name is not None or bucket.watching:
            start = self.clock
            self.clock += truth[ran]
            if name is not None:
                self.learner.record(bucket, self.clock - start)
            else:
                self.learner.watched(bucket, self.clock - start)
        self.states += [(k, b.state) for k, b in self.learner.buckets.items()]
        return ran

    def run(self, calls: int, key=(20, None, False)) -> list[str]:
        return [self.call(key) for _ in range(calls)]

    def path(self, key=(20, None, False)) -> list[learn.State]:
        """The states the bucket of ``key`` passed through, each once per stay."""
        out = []
        for k, state in self.states:
            if k == key and (not out or out[-1] is not state):
                out.append(state)
        return out


SHORT = {"ring": 1e-4, "recursive_doubling": 1.2e-4, "native": 1.5e-4}


def test_short_calls_warm_measure_settle_and_check():
    """Short calls: each candidate warms up once (no barrier), two measured rounds of blocks (a barrier
    before each block), settled; after RECHECK_SHORT settled calls a re-check of the settled algorithm and
    the rivals within DROP of it, after which it is settled again."""
    job = Job(SHORT, {"ring": 3e-4, "recursive_doubling": 1e-4, "native": 1.5e-4})
    ran = job.run(3)
    assert job.path() == [WARMING, MEASURING] and job.syncs == 0  # the warm-up: no barrier
    assert sorted(ran) == sorted(SHORT)
    job.run(2 * 3 + 2 * 2 - 1)
    bucket = job.learner.buckets[(20, None, False)]
    assert bucket.state is MEASURING and bucket.measuring == 2 and bucket.dropped == ["ring"]
    job.run(1)
    assert bucket.state is SETTLED and bucket.settled == "recursive_doubling"
    assert job.syncs == 3 + 2  # one barrier per measured block
    assert bucket.slots == bucket.local == [] and bucket.checking == []
    job.run(learn.RECHECK_SHORT - 1)
    assert bucket.state is SETTLED and bucket.since == learn.RECHECK_SHORT - 1
    job.run(1)
    assert bucket.state is CHECKING and bucket.checking == ["recursive_doubling", "native"]
    assert bucket.since == 0 and bucket.next_check == 4 * learn.RECHECK_SHORT
    job.run(2 * 2 * learn.CHECK_ROUNDS - 1)
    assert bucket.state is SETTLED and bucket.checks == 1 and bucket.checking == [] and bucket.checked == {}
    assert job.path() == [WARMING, MEASURING, SETTLED, CHECKING, SETTLED]


def test_long_calls_are_watched_and_a_watch_may_hand_over_to_short_calls():
    """Long calls settle WATCHED (no warm-up where the model predicts LARGE_S); when the watched
    algorithm's calls turn slow the rival takes over: WATCHED again where the rival's time is long, and
    SETTLED (untimed) where it is short, a move no other test makes."""
    predicted = {"ring": 0.06, "native": 0.07}
    job = Job(predicted, lambda i: {"ring": 0.06 if i < 10 else 1.0, "native": 0.08})
    job.run(2 * learn.REPS)
    bucket = job.learner.buckets[(20, None, False)]
    assert bucket.state is WATCHED and bucket.settled == "ring"
    job.run(10)
    assert bucket.state is WATCHED and bucket.settled == "native" and bucket.watch_switches == 1
    job = Job(predicted, lambda i: {"ring": 0.06 if i < 10 else 1.0, "native": 0.08})
    job.run(2 * learn.REPS)
    bucket = job.learner.buckets[(20, None, False)]
    bucket.agreed["native"] = [0.01]  # a rival whose calls are short (as a re-check could have measured)
    job.run(10)
    assert bucket.settled == "native" and bucket.state is SETTLED and not bucket.watching
    assert job.path() == [MEASURING, WATCHED, SETTLED]


def test_a_watched_bucket_tries_its_rivals_on_watched_calls():
    """Long calls: the servers' one measured block fell on a slow moment (0.93 s a call against 0.76 s
    afterwards) and the ring (0.85 s) settled. After WATCH_CALLS watched calls of the ring, the rival within
    TRIAL of them runs as many watched calls; faster, it stays, and is not tried again. A rival that is
    slower on its trial too gives way after two calls; one beyond TRIAL is never tried; a twin of the
    settled one in the model's eyes is not tried against it; at most TRIALS trials per bucket."""
    predicted = {"ps": 0.07, "ring": 0.08}
    key = (27, None, False)
    job = Job(predicted, lambda i: {"ps": 0.93 if i < learn.REPS else 0.76, "ring": 0.85})
    ran = job.run(2 * learn.REPS, key)
    bucket = job.learner.buckets[key]
    assert ran == ["ps"] * learn.REPS + ["ring"] * learn.REPS
    assert bucket.state is WATCHED and bucket.settled == "ring"
    assert job.run(learn.WATCH_CALLS, key) == ["ring"] * learn.WATCH_CALLS
    assert bucket.settled == "ps" and bucket.trial == "ring" and bucket.tried == ["ring", "ps"]
    assert bucket.to_kept()["settled"] == "ring"  # a trial under way is not kept
    assert job.run(learn.WATCH_CALLS, key) == ["ps"] * learn.WATCH_CALLS
    assert bucket.settled == "ps" and bucket.trial is None
    assert any("tried: ps ran 760.000 ms per call, it stays" in note for note in job.learner.notes)
    assert job.run(20, key) == ["ps"] * 20 and bucket.agreed["ring"] == [pytest.approx(0.85)]
    assert job.path(key) == [MEASURING, WATCHED]

    job = Job(predicted, {"ps": 0.95, "ring": 0.85})  # the rival is slower on its trial too
    job.run(2 * learn.REPS + learn.WATCH_CALLS, key)
    bucket = job.learner.buckets[key]
    assert bucket.settled == "ps" and bucket.trial == "ring"
    assert job.run(2, key) == ["ps", "ps"]
    assert bucket.settled == "ring" and bucket.trial is None and bucket.watch_switches == 0
    assert job.run(20, key) == ["ring"] * 20
    assert bucket.agreed["ps"] == [pytest.approx(0.95)]

    # a rival beyond TRIAL of the settled one's calls is never tried, unless it is the model's favourite
    job = Job({"ring": 0.07, "ps": 0.08}, {"ps": 1.2, "ring": 0.85})
    assert set(job.run(2 * learn.REPS + 20, key)[2 * learn.REPS:]) == {"ring"}

    # a twin of the ring in the model's eyes (predicted within SWITCH) measured between them is not tried
    # against it; the servers are, then the twin against them: it loses, after two calls; no third trial
    predicted = {"ps": 0.07, "ring": 0.08, "rabenseifner": 0.081}
    job = Job(predicted, lambda i: {"ps": 0.93 if i < learn.REPS else 0.76, "ring": 0.85,
                                    "rabenseifner": 0.87 if i < 3 * learn.REPS else 0.84})
    job.run(3 * learn.REPS + learn.WATCH_CALLS, key)
    bucket = job.learner.buckets[key]
    assert bucket.settled == "ps" and bucket.tried == ["ring", "ps"]
    ran = job.run(learn.WATCH_CALLS + 2 + 20, key)
    assert ran == ["ps"] * learn.WATCH_CALLS + ["rabenseifner"] * 2 + ["ps"] * 20
    assert bucket.tried == ["ring", "ps", "rabenseifner"] and bucket.trials == learn.TRIALS
    assert bucket.agreed["rabenseifner"] == [pytest.approx(0.84)] and bucket.watch_switches == 0


def test_the_models_favourite_is_tried_whatever_its_block():
    """The favourite runs the job's first block, in the job's first calls, which are the slowest for every
    algorithm (a DDP job's first steps): beaten there beyond TRIAL, it still gets its trial on watched
    calls, and stays where they are faster; where they are slower too, it gives way after two calls."""
    predicted = {"ps": 0.07, "ring": 0.08}
    key = (27, None, False)
    job = Job(predicted, lambda i: {"ps": 1.2 if i < learn.REPS else 0.76, "ring": 0.85})
    ran = job.run(2 * learn.REPS + learn.WATCH_CALLS, key)
    bucket = job.learner.buckets[key]
    assert ran == ["ps"] * learn.REPS + ["ring"] * (learn.REPS + learn.WATCH_CALLS)
    assert bucket.settled == "ps" and bucket.trial == "ring"
    assert job.run(learn.WATCH_CALLS + 20, key) == ["ps"] * (learn.WATCH_CALLS + 20)
    assert bucket.trial is None and bucket.agreed["ring"] == [pytest.approx(0.85)]

    job = Job(predicted, {"ps": 1.2, "ring": 0.85})  # slower on its watched calls too
    job.run(2 * learn.REPS + learn.WATCH_CALLS, key)
    bucket = job.learner.buckets[key]
    assert bucket.settled == "ps" and bucket.trial == "ring"
    assert job.run(2 + 20, key) == ["ps", "ps"] + ["ring"] * 20
    assert bucket.watch_switches == 0 and bucket.trials == 1

    # twins in the model's eyes (predicted within SWITCH): the favourite's block stands
    job = Job({"ps": 0.080, "ring": 0.081}, {"ps": 1.2, "ring": 0.85})
    assert set(job.run(2 * learn.REPS + 20, key)[2 * learn.REPS:]) == {"ring"}


def test_what_a_watch_or_trial_finds_is_the_watched_siblings_time_too():
    """Long calls, fused or not, are the bytes they move: the servers' trial won on single calls gives the
    fused class, settled on the ring from the same blocks, the servers' watched time, and the fused class
    runs them from its next call instead of trying them itself. A slower time leaves its choice alone."""
    predicted = {"ps": 0.07, "ring": 0.08}
    single, fused = (27, None, False), (27, None, True)
    job = Job(predicted, lambda i: {"ps": 0.93 if i < learn.REPS else 0.76, "ring": 0.85})
    job.run(2 * learn.REPS, single)
    assert job.call(fused) == "ring"  # adopted from the single calls' blocks
    job.run(2 * learn.WATCH_CALLS, single)  # the trial of ps, which stays
    alone, together = job.learner.buckets[single], job.learner.buckets[fused]
    assert alone.settled == "ps" and together.settled == "ps" and together.state is WATCHED
    assert together.agreed["ps"] == [pytest.approx(0.76)] and "ps" in together.tried
    assert together.trials == 0 and together.watch_switches == 1
    assert any("(its sibling's calls: ps ran 760.000 ms per call, ring 850.000)" in n for n in job.learner.notes)
    assert set(job.run(10, fused)) == {"ps"}

    job = Job(predicted, {"ps": 0.95, "ring": 0.85})  # the trial loses: the fused class keeps the ring
    job.run(2 * learn.REPS, single)
    job.call(fused)
    job.run(learn.WATCH_CALLS + 2, single)
    together = job.learner.buckets[fused]
    assert together.settled == "ring" and together.agreed["ps"] == [pytest.approx(0.95)]


def test_a_class_with_one_candidate_or_no_room_settles_at_once():
    """One candidate, or a learner past its exploring budget: the bucket goes from NEW to SETTLED on the
    model's first choice, and its calls never wait at a barrier."""
    job = Job({"ring": 1e-3}, {"ring": 1e-3})
    job.run(5)
    assert job.path() == [SETTLED] and job.syncs == 0
    job = Job({"ring": 1e-3, "native": 1.1e-3}, {"ring": 1e-3, "native": 1e-4})
    job.learner.explored, job.learner.calls = learn.FREE_CALLS, 1000
    assert set(job.run(5)) == {"ring"} and job.path() == [SETTLED] and job.syncs == 0


@pytest.mark.parametrize("predicted_s, exploring", [(0.05, MEASURING), (1e-3, WARMING)],
                         ids=["measuring", "warming"])
def test_an_exploring_sibling_is_adopted_mid_round(predicted_s, exploring):
    """A single-call class still exploring when its fused sibling settles on long calls stops where it
    is and starts WATCHED on the sibling's times: from MEASURING, or from WARMING where the model
    predicted short calls that turned out long."""
    predicted = {"recursive_doubling": predicted_s, "ring": 1.1 * predicted_s, "native": 1.2 * predicted_s}
    job = Job(predicted, {"recursive_doubling": 0.75, "ring": 0.80, "native": 0.70})
    fused, single = (27, None, True), (27, None, False)
    job.call(single)
    assert job.learner.buckets[single].state is exploring
    for _ in range(learn.MAX_CALLS):  # until the fused class settles
        job.call(fused)
        if job.learner.buckets[fused].state is WATCHED:
            break
    assert job.learner.buckets[fused].state is WATCHED
    alone = job.learner.buckets[single]
    assert alone.state is WATCHED and alone.seeded and alone.settled == "native" and alone.local == []
    assert job.path(single) == [exploring, WATCHED]


def test_moves_outside_the_table_are_refused():
    """Every move goes through the table: a settled bucket cannot start measuring again, an exploring one
    cannot be re-checked, a settled one cannot warm up."""
    bucket = Bucket((20, None, False), ["ring", "native"], {"ring": 1e-3, "native": 2e-3}, reps=2, rounds=1)
    bucket.warm_up(["ring"])
    with pytest.raises(RuntimeError, match="no move from warming to checking"):
        bucket.check(["ring", "native"])
    bucket.measure(1, ["ring", "native"])
    bucket.settle_on("ring")
    with pytest.raises(RuntimeError, match="no move from settled to measuring"):
        bucket.measure(2, ["ring"])
    with pytest.raises(RuntimeError, match="no move from settled to warming"):
        bucket.warm_up(["native"])


def _random_job(seed: int) -> Job:
    rng = random.Random(seed)
    scale = rng.choice([1e-4, 1e-3, 5e-3, 0.02, 0.08, 0.5])
    names = rng.sample(["ring", "rabenseifner", "hierarchical", "recursive_doubling", "native"], rng.randint(1, 4))
    predicted = {n: scale * rng.uniform(0.5, 3) for n in names}
    wrong = rng.choice([1.0, 1.0, 0.1, 10.0, 100.0])  # how far the model is off
    phases = [{n: wrong * scale * rng.uniform(0.3, 3) for n in names} for _ in range(3)]
    job = Job(predicted, lambda i: phases[min(i // 150, 2)])
    if rng.random() < 0.1:
        job.learner.explored, job.learner.calls = learn.FREE_CALLS, 10_000
    keys = [(20, None, False), (20, None, True)]
    for i in range(rng.choice([40, 300, 600])):
        for key in keys[:1 + (i % rng.randint(1, 4) == 0)]:
            job.call(key)
    return job


def test_the_table_of_moves_is_what_the_learner_does(monkeypatch):
    """Over many simulated jobs (short and long calls, machines that change, siblings, spent budgets)
    every move a bucket makes is in ``learn.NEXT`` (else ``_enter`` raises), every move the table allows
    happens (it holds no move the learner never makes), and the flags the per-call path reads follow the
    state."""
    seen = set()
    enter = Bucket._enter

    def spy(self, state):
        seen.add((self.state, state))
        enter(self, state)
        # what the per-call path reads instead of the state follows it
        assert self.running == (state in (SETTLED, WATCHED)) and self.untimed == (state is SETTLED)
    monkeypatch.setattr(Bucket, "_enter", spy)
    for seed in range(300):
        _random_job(seed)
    allowed = {(a, b) for a, targets in learn.NEXT.items() for b in targets}
    assert seen - allowed == set()
    # rare moves, each made by a test of its own: adoption at creation (test_auto_learn.py's sibling test),
    # adoption during the warm-up and a hand-over to short calls (tests above)
    rare = {(NEW, WATCHED), (WARMING, WATCHED), (WATCHED, SETTLED)}
    assert allowed - seen <= rare, sorted((a.value, b.value) for a, b in allowed - seen - rare)


# -- kept between jobs (issue 36 builds the keeping on these) -----------------------------------------------
def test_a_settled_bucket_is_kept_as_json_and_restored_settled():
    """A settled bucket's data goes through JSON; a new learner restored from it runs the settled
    algorithm from its first call (no warm-up, no measured call, no barrier), says so in its summary, and
    re-checks it after RECHECK_SHORT calls as a bucket that has just settled."""
    truth = {"ring": 3e-4, "recursive_doubling": 1e-4, "native": 1.5e-4}
    first = Job(SHORT, truth)
    first.run(40)
    kept = json.loads(json.dumps(first.learner.buckets[(20, None, False)].to_kept()))
    restored = Bucket.from_kept(kept)
    assert restored.state is SETTLED and restored.settled == "recursive_doubling" and restored.restored
    assert restored.agreed == first.learner.buckets[(20, None, False)].agreed
    assert restored.explored == 0 and restored.since == 0 and restored.next_check == learn.RECHECK_SHORT
    later = Job(SHORT, truth)
    later.learner.restore(restored)
    assert later.run(learn.RECHECK_SHORT - 1) == ["recursive_doubling"] * (learn.RECHECK_SHORT - 1)
    assert later.syncs == 0 and later.learner.explored == 0
    assert "from an earlier job's times" in later.learner.summary()[0]
    later.run(1)
    assert restored.state is CHECKING


def test_long_calls_restore_watched_and_a_check_under_way_is_left_out():
    """A bucket of long calls restores WATCHED; one kept during a re-check keeps what it had settled
    before the check (the check's partial times are not kept)."""
    job = Job({"ring": 0.06, "native": 0.07}, {"ring": 0.06, "native": 0.08})
    job.run(2 * learn.REPS)
    bucket = job.learner.buckets[(20, None, False)]
    assert Bucket.from_kept(bucket.to_kept()).state is WATCHED
    job = Job(SHORT, {"ring": 3e-4, "recursive_doubling": 1e-4, "native": 1.5e-4})
    job.run(13 + learn.RECHECK_SHORT + 1)
    bucket = job.learner.buckets[(20, None, False)]
    assert bucket.state is CHECKING
    before = {name: list(times) for name, times in bucket.agreed.items()}
    job.run(1)
    kept = bucket.to_kept()
    assert kept["agreed"] == before and kept["settled"] == bucket.settled


def test_a_watched_choice_keeps_its_calls_time_beside_its_block():
    """A watched class keeps, beside its blocks, the median of its choice's last WATCH_CALLS calls
    (``watched_s``): the servers' block ran 0.91 s, their calls in the job 0.60 s. A later job whose calls
    run 0.60 s (off the block, on the calls) or 0.95 s (the other way round) keeps the kept times; only
    calls off both (0.35 s: another network) forget them and re-check."""
    predicted = {"ps": 0.07, "ring": 0.08, "native": 0.09}
    key = (27, None, False)
    first = Job(predicted, lambda i: {"ps": 0.91 if i < learn.REPS else 0.60, "ring": 1.3, "native": 1.6})
    first.run(learn.REPS + 1 + 1 + learn.WATCH_CALLS, key)  # ps's block, the cut ring and native, watched
    bucket = first.learner.buckets[key]
    assert bucket.settled == "ps" and bucket.state is WATCHED
    kept = bucket.to_kept()
    assert kept["agreed"]["ps"] == [pytest.approx(0.91)] and kept["watched_s"] == pytest.approx(0.60)
    assert json.loads(json.dumps(kept)) == kept
    for calls, stale in ((0.60, False), (0.95, False), (0.35, True)):
        later = Job(predicted, {"ps": calls, "ring": 1.3, "native": 1.6})
        later.learner.restore(Bucket.from_kept(kept))
        later.run(learn.WATCH_CALLS, key)
        restored = later.learner.buckets[key]
        assert restored.kept_compared and restored.stale is stale, calls
        if not stale:  # kept again as it came, for the next job
            assert restored.to_kept()["watched_s"] == pytest.approx(calls)
    older = dict(kept)
    del older["watched_s"]  # a file kept before watched_s: the block alone decides
    later = Job(predicted, {"ps": 0.60, "ring": 1.3, "native": 1.6})
    later.learner.restore(Bucket.from_kept(older))
    later.run(learn.WATCH_CALLS, key)
    assert later.learner.buckets[key].stale


def test_what_cannot_be_kept_or_restored_is_an_error():
    """An exploring bucket has nothing to keep; data that is not a kept bucket, or names an algorithm its
    candidates do not hold, is a ValueError saying so; a class already on the lane is not replaced."""
    job = Job(SHORT, {"ring": 3e-4, "recursive_doubling": 1e-4, "native": 1.5e-4})
    job.run(2)
    with pytest.raises(ValueError, match="has not settled"):
        job.learner.buckets[(20, None, False)].to_kept()
    job.run(30)
    kept = job.learner.buckets[(20, None, False)].to_kept()
    with pytest.raises(ValueError, match="not a settled auto bucket"):
        Bucket.from_kept({"key": [20, None, False]})
    with pytest.raises(ValueError, match="torus2d not among its candidates"):
        Bucket.from_kept(dict(kept, settled="torus2d"))
    with pytest.raises(ValueError, match="already has a bucket"):
        job.learner.restore(Bucket.from_kept(kept))


def test_kept_times_of_other_conditions_are_forgotten_and_rechecked_at_once():
    """Kept on a fast network (ring fastest), restored where every call is slower and MPI's own is now
    the fastest: the first WATCH_CALLS watched calls run STALE off the kept time, so the rivals' kept
    times are forgotten and a re-check of the settled algorithm and its two nearest rivals starts at
    once; it settles on native with this job's times. Within STALE of the kept time, nothing changes."""
    predicted = {"ring": 0.06, "recursive_doubling": 0.065, "native": 0.07}
    first = Job(predicted, {"ring": 0.06, "recursive_doubling": 0.07, "native": 0.08})
    first.run(20)
    kept = first.learner.buckets[(20, None, False)].to_kept()
    assert kept["settled"] == "ring"

    slower = {"ring": 0.15, "recursive_doubling": 0.20, "native": 0.12}
    later = Job(predicted, slower)
    later.learner.restore(Bucket.from_kept(kept))
    ran = later.run(learn.WATCH_CALLS)
    bucket = later.learner.buckets[(20, None, False)]
    assert ran == ["ring"] * learn.WATCH_CALLS and bucket.stale and bucket.state is CHECKING
    assert bucket.checking == ["ring", "recursive_doubling", "native"]
    assert bucket.agreed == {"ring": [pytest.approx(0.15)]}
    assert "kept times not this job's: ring ran 150.000 ms per call against 60.000 kept" in later.learner.notes[0]
    later.run(3 * bucket.reps * learn.CHECK_ROUNDS + 5)
    assert bucket.settled == "native" and bucket.state is WATCHED
    assert bucket.best_times() == pytest.approx(slower)
    assert "not this job's: forgotten" in later.learner.summary()[0]

    near = Job(predicted, {"ring": 0.065, "recursive_doubling": 0.075, "native": 0.085})  # within STALE
    near.learner.restore(Bucket.from_kept(kept))
    assert near.run(10) == ["ring"] * 10
    bucket = near.learner.buckets[(20, None, False)]
    assert not bucket.stale and bucket.kept_compared and bucket.state is WATCHED
    assert bucket.best_times()["native"] == pytest.approx(0.08)  # the kept rivals' times stay
