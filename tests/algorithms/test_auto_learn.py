"""``auto`` learning (commlib/algorithms/learn.py): decisions are a function of agreed data only, so ranks
choose alike even when their clocks disagree; exploration is bounded; learning can be turned off.

The in-process tests run several learners as ranks on threads, agreeing through a MAX over a barrier, as
the lane's communicator does; the MPI tests run the Engine on real jobs (workers/auto_learn.py)."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from commlib.algorithms import cost, learn, select, spec
from commlib.algorithms.select import Choice
from mpirun import run_mpi


class Agreement:
    """MAX over ``ranks`` threads' vectors, as ``allreduce_native_(v, MAX)`` on a communicator."""

    def __init__(self, ranks: int):
        self._barrier = threading.Barrier(ranks)
        self._vectors: dict[int, np.ndarray] = {}
        self._result = None

    def agree_for(self, rank: int):
        def agree(vector: np.ndarray) -> np.ndarray:
            self._vectors[rank] = vector.copy()
            if self._barrier.wait() == 0:
                self._result = np.maximum.reduce(list(self._vectors.values()))
            self._barrier.wait()
            out = self._result.copy()
            self._barrier.wait()
            return out
        return agree


def ranking(times: dict[str, float]):
    """A model ranking: the algorithms with these predicted times, fastest first."""
    return lambda: sorted((Choice(n, 1 << 20, t) for n, t in times.items()), key=lambda c: c.predicted_s)


def simulate(ranks: int, calls: int, truth, predicted, clocks=None, keys=((20, None, False),), noise=0.3):
    """Run ``calls`` calls per key on ``ranks`` threaded learners; a call of algorithm A takes ``truth[A]``
    (+ noise per rank) on that rank's clock; ``truth`` may be a function of the call's index returning
    such a dict (the machine changes during the job), and may hold such a dict per key; ``keys`` too may
    be a function of the call's index.
    Returns (picks per rank, learners)."""
    agreement = Agreement(ranks)
    picks = [[] for _ in range(ranks)]
    learners = []
    for r in range(ranks):
        state = {"t": 0.0}
        rng = random.Random(r)
        scale = clocks[r] if clocks else 1.0
        learner = learn.Learner(agreement.agree_for(r), clock=lambda s=state: s["t"])
        learners.append((learner, state, rng, scale))

    def rank_main(r):
        learner, state, rng, scale = learners[r]
        for call in range(calls):
            now = truth(call) if callable(truth) else truth
            for key in (keys(call) if callable(keys) else keys):
                bucket = learner.bucket(key, ranking(predicted))
                name = learner.pick(bucket)
                ran = name or bucket.settled
                picks[r].append((key, ran))
                if name is not None or bucket.watching:
                    start = learner.clock()
                    state["t"] += now.get(key, now)[ran] * scale * (1 + noise * rng.random())
                    if name is not None:
                        learner.record(bucket, learner.clock() - start)
                    else:
                        learner.watched(bucket, learner.clock() - start)
    run_ranks(ranks, rank_main)
    return picks, [entry[0] for entry in learners]


def run_ranks(ranks: int, rank_main) -> None:
    """Run ``rank_main(r)`` for every simulated rank on a thread of its own; fail if one hangs."""
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a simulated rank hung"


def simulate_arrivals(ranks: int, calls: int, truth, predicted, exit_skew, seed: int, with_sync=True):
    """``ranks`` threaded learners on one shared virtual clock, as ranks of a collective called back to
    back: a call of A ends ``truth[A]`` after the last rank entered it, and each rank leaves it up to
    ``exit_skew[A]`` later than that (its own share of the last steps, a descheduled rank), entering the
    next call when it leaves; so a rank that enters early times its wait for the others as well. The
    learners' ``sync`` is a barrier on that clock (``with_sync=False``: none). Returns the learners."""
    arrivals, agreement = Agreement(ranks), Agreement(ranks)
    learners = []
    for r in range(ranks):
        state = {"t": 0.0}
        barrier = arrivals.agree_for(r)

        def sync(state=state, barrier=barrier):
            state["t"] = float(barrier(np.array([state["t"]]))[0])
        learner = learn.Learner(agreement.agree_for(r), clock=lambda s=state: s["t"],
                                sync=sync if with_sync else (lambda: None))
        learners.append((learner, state, random.Random(seed * 100 + r), barrier))

    def rank_main(r):
        learner, state, rng, barrier = learners[r]
        for _ in range(calls):
            bucket = learner.bucket((12, None, False), ranking(predicted))
            name = learner.pick(bucket)
            ran = name or bucket.settled
            start = state["t"]
            last_in = float(barrier(np.array([start]))[0])  # the collective: ends after the last rank entered
            state["t"] = last_in + truth[ran] + exit_skew.get(ran, 0.0) * rng.random()
            if name is not None:
                learner.record(bucket, state["t"] - start)
    run_ranks(ranks, rank_main)
    return [entry[0] for entry in learners]


# 4 ranks, 4 KiB, as measured on 2 hosts x 2 ranks alone on 2 cores: recursive doubling 120 us per call,
# MPI's own 175 us, hierarchical 245 us; ranks leave hierarchical up to 3 ms apart; the model puts
# hierarchical first, recursive doubling second (so recursive doubling's block follows hierarchical's)
SKEWED = dict(truth={"recursive_doubling": 120e-6, "native": 175e-6, "hierarchical": 245e-6},
              predicted={"hierarchical": 66e-6, "recursive_doubling": 68e-6, "native": 105e-6},
              exit_skew={"hierarchical": 3e-3, "recursive_doubling": 20e-6, "native": 20e-6})


@pytest.mark.parametrize("seed", range(6))
def test_measured_blocks_start_together(seed):
    """Timed from each rank's own start, the block after hierarchical's measures mostly how late the last
    rank left hierarchical; every measured block starts from the lane's barrier, so the learner sees the
    calls themselves and picks recursive doubling, on every rank, within 20 calls."""
    learners = simulate_arrivals(4, 24, seed=seed, **SKEWED)
    assert {lr.settled((12, None, False)) for lr in learners} == {"recursive_doubling"}
    assert learners[0].buckets[(12, None, False)].explored <= learn.MAX_CALLS


def test_without_the_barrier_late_ranks_decide():
    """The same jobs with no barrier before the measured blocks: the learner does not find recursive
    doubling (what the barrier is for)."""
    settled = [simulate_arrivals(4, 24, seed=seed, with_sync=False, **SKEWED)[0].settled((12, None, False))
               for seed in range(6)]
    assert settled.count("recursive_doubling") < 3, settled


def test_blocks_of_consecutive_calls_show_what_a_call_leaves_to_the_next():
    """The ring takes 560 ms on a call after another algorithm's and 1120 ms on one after its own (2 hosts x
    1 rank at 64 MiB: 840 ms per call in twos), MPI's own 570 ms either way. Timing single calls in rotating
    order measures the ring at 560 ms; blocks of consecutive calls show its slower call, 1120 (long calls: a block's slowest call), and the learner keeps MPI's
    own."""
    state = {"t": 0.0, "last": None}
    learner = learn.Learner(lambda v: v, clock=lambda: state["t"])

    def cost(name):
        return {"ring": 1.12 if state["last"] == "ring" else 0.56, "native": 0.57}[name]
    for _ in range(30):
        bucket = learner.bucket((27, None, False), ranking({"ring": 54e-3, "native": 54.5e-3}))
        name = learner.pick(bucket)
        ran = name or bucket.settled
        start = state["t"]
        state["t"] += cost(ran)
        state["last"] = ran
        if name is not None:
            learner.record(bucket, state["t"] - start)
    bucket = learner.buckets[(27, None, False)]
    assert bucket.settled == "native", learner.summary()
    assert bucket.best_times()["ring"] == pytest.approx(1.12)  # long calls: a block's slower call


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_ranks_choose_alike_when_their_clocks_disagree(ranks):
    """The last rank's clock runs 40x fast and ranks the algorithms the other way round: every rank still
    runs the same algorithm on every call and settles on the same one."""
    predicted = {"ring": 1e-3, "rabenseifner": 1.5e-3, "native": 3e-3}
    truth = {"ring": 2e-3, "rabenseifner": 1e-3, "native": 1.2e-3}
    clocks = [1.0] * (ranks - 1) + [40.0]
    picks, learners = simulate(ranks, 30, truth, predicted, clocks)
    assert all(p == picks[0] for p in picks)
    settled = {lr.settled((20, None, False)) for lr in learners}
    assert len(settled) == 1, settled


def test_learns_the_fastest_where_the_model_is_wrong():
    """The model prefers the ring; rabenseifner is twice as fast in truth: auto settles on it."""
    predicted = {"ring": 1e-3, "rabenseifner": 1.5e-3, "native": 3e-3}
    truth = {"ring": 2e-3, "rabenseifner": 1e-3, "native": 2.5e-3}
    picks, learners = simulate(2, 25, truth, predicted)
    assert learners[0].settled((20, None, False)) == "rabenseifner"
    assert picks[0][-1][1] == "rabenseifner"
    assert any("auto learned" in line and "-> rabenseifner" in line for line in learners[0].summary())


def test_exploration_is_bounded():
    """At most 20 calls explore per size class (settled by then), the candidates the model puts far behind
    are never run, and the clearly slow ones run one measured block before being dropped."""
    predicted = {"ring": 4e-3, "rabenseifner": 4.8e-3, "hierarchical": 5.2e-3, "torus2d": 5.6e-3,
                 "recursive_doubling": 200e-3, "native": 8e-3}
    truth = {"ring": 4e-3, "rabenseifner": 20e-3, "hierarchical": 4e-3, "torus2d": 4e-3,
             "recursive_doubling": 4e-3, "native": 36e-3}
    picks, learners = simulate(2, 40, truth, predicted)
    learner = learners[0]
    bucket = learner.buckets[(20, None, False)]
    ran = [name for _, name in picks[0]]
    exploring = ran[:bucket.explored]
    assert bucket.explored <= 20 and bucket.settled is not None
    assert all(name == bucket.settled for name in ran[bucket.explored:])
    assert "recursive_doubling" not in ran  # predicted 50x the best: not a candidate
    assert len(bucket.candidates) <= learn.MAX_CANDIDATES + 1
    assert set(bucket.dropped) == {"rabenseifner", "native"}
    # dropped after the first measured round: its warm-up and one measured block, none in the later rounds
    assert exploring.count("rabenseifner") == 1 + learn.REPS
    # ring, hierarchical and torus2d tie in truth: the two best of them ran the near-tie rounds; one agreement
    # per round, and (calls predicted over 2 ms) one per measured block's first call
    blocks = len(bucket.candidates) * learn.ROUNDS + 2 * bucket.extra
    assert learner.agreements == learn.ROUNDS + bucket.extra + blocks and bucket.extra == learn.EXTRA_ROUNDS


@pytest.mark.parametrize("predicted_s, extra", [(1e-4, 1), (4e-3, learn.EXTRA_ROUNDS)], ids=["small", "large"])
def test_near_ties_get_more_rounds_within_20_calls(predicted_s, extra):
    """Two candidates within NEAR of each other after the scheduled rounds: those two alone run up to
    EXTRA_ROUNDS more rounds, every rank alike (one rank's clock 40x fast), all within 20 calls (short
    calls, which had two scheduled rounds, have room for one); a clear winner gets none."""
    predicted = {"ring": predicted_s, "rabenseifner": 1.2 * predicted_s, "native": 1.5 * predicted_s}
    tied = {"ring": 1e-3, "rabenseifner": 1.02e-3, "native": 3e-3}
    picks, learners = simulate(3, 30, tied, predicted, clocks=[1.0, 1.0, 40.0], noise=0.05)
    assert all(p == picks[0] for p in picks)
    bucket = learners[0].buckets[(20, None, False)]
    assert bucket.extra == extra and bucket.explored <= learn.MAX_CALLS
    assert bucket.settled in ("ring", "rabenseifner")
    assert all(name == bucket.settled for _, name in picks[0][bucket.explored:])
    assert "near-tie round(s)" in learners[0].summary()[0]
    clear = {"ring": 1e-3, "rabenseifner": 2e-3, "native": 3e-3}
    _, learners = simulate(2, 30, clear, predicted, noise=0.05)
    assert learners[0].buckets[(20, None, False)].extra == 0


def test_long_calls_settle_without_near_tie_rounds():
    """Near-tied candidates get more rounds where calls are short; where they take WATCH_S or more the
    bucket settles after the scheduled round (4 measured calls here: no warm-up where the model
    predicts LARGE_S or more) and the settled algorithm's calls are watched instead."""
    predicted = {"ring": 40e-3, "native": 44e-3}
    _, learners = simulate(2, 30, {"ring": 10e-3, "native": 10.3e-3}, predicted, noise=0.0)
    assert learners[0].buckets[(20, None, False)].extra == learn.EXTRA_ROUNDS
    _, learners = simulate(2, 30, {"ring": 1.0, "native": 1.03}, predicted, noise=0.0)
    bucket = learners[0].buckets[(20, None, False)]
    assert bucket.extra == 0 and bucket.settled == "ring" and bucket.explored == 2 * learn.REPS
    assert bucket.watching and "near-tie" not in learners[0].summary()[0]


@pytest.mark.parametrize("ranks", [2, 3])
def test_long_blocks_clearly_slower_end_after_their_first_call(ranks):
    """Calls of 50 ms or more (the model predicting 2 ms or more): a block whose first call is more than
    CUT slower than the best so far ends there - recursive doubling (1.27 s) and hierarchical_pipelined
    (0.82 s) against rabenseifner's 0.71 s run once instead of a block of two - while MPI's own, within
    CUT, runs its whole block; every rank alike though their clocks disagree. The first candidate (nothing
    to compare with) always runs its block, and calls under 50 ms are never cut. MPI's own, the model's
    favourite by a hair, is not that candidate: slow, it is cut too."""
    predicted = {"rabenseifner": 0.0675, "native": 0.0672, "hierarchical_pipelined": 0.077,
                 "recursive_doubling": 0.0756}
    truth = {"rabenseifner": 0.706, "native": 0.730, "hierarchical_pipelined": 0.823, "recursive_doubling": 1.27}
    clocks = [1.0, 1.5, 0.7][:ranks]
    picks, learners = simulate(ranks, 12, truth, predicted, clocks=clocks, noise=0.0)
    assert all(p == picks[0] for p in picks)
    bucket = learners[0].buckets[(20, None, False)]
    explored = [name for _, name in picks[0][:bucket.explored]]
    assert bucket.cut == ["recursive_doubling", "hierarchical_pipelined"], learners[0].summary()
    assert [explored.count(n) for n in bucket.candidates] == [learn.REPS, learn.REPS, 1, 1]
    assert all(learner.buckets[(20, None, False)].settled == "rabenseifner" for learner in learners)
    assert learners[0].summary()[0].endswith("recursive_doubling 1905.000 ms (model 75.600) cut -> rabenseifner")

    assert bucket.candidates[:2] == ["rabenseifner", "native"]  # MPI's own, predicted within NEAR: second

    slow_first = dict(truth, rabenseifner=1.27, recursive_doubling=0.718)  # the first is the slow one
    picks, learners = simulate(2, 12, slow_first, predicted, noise=0.0)
    bucket = learners[0].buckets[(20, None, False)]
    explored = [name for _, name in picks[0][:bucket.explored]]
    assert explored[:learn.REPS] == ["rabenseifner"] * learn.REPS and bucket.cut == ["hierarchical_pipelined"]
    assert bucket.settled == "recursive_doubling"

    slow_native = dict(truth, native=1.27)  # the model's favourite is slow: one call of it
    picks, learners = simulate(2, 12, slow_native, predicted, noise=0.0)
    bucket = learners[0].buckets[(20, None, False)]
    explored = [name for _, name in picks[0][:bucket.explored]]
    assert explored.count("native") == 1 and "native" in bucket.cut and bucket.settled == "rabenseifner"

    underestimated = {name: t / 10 for name, t in predicted.items()}  # 7-8 ms predicted, 0.7-1.3 s run
    picks, learners = simulate(2, 16, truth, underestimated, noise=0.0)
    bucket = learners[0].buckets[(20, None, False)]
    assert bucket.cut == ["recursive_doubling", "hierarchical_pipelined"] and bucket.settled == "rabenseifner"

    shorter = {name: t / 30 for name, t in truth.items()}  # 24-42 ms: a block's time is its mean
    picks, learners = simulate(2, 12, shorter, predicted, noise=0.0)
    bucket = learners[0].buckets[(20, None, False)]
    explored = [name for _, name in picks[0][:bucket.explored]]
    assert bucket.cut == [] and explored.count("recursive_doubling") == learn.REPS


def test_mpi_own_leads_only_where_the_model_puts_it_clearly_first_or_calls_are_short():
    """MPI's own goes behind a commlib schedule predicted within NEAR of it in a class the model does not
    call short; predicted faster by more than NEAR, or in a short class, it keeps the model's place."""
    learner = learn.Learner(lambda v: v)
    cases = {21: ({"native": 0.0672, "ring": 0.0675}, ["ring", "native"]),
             22: ({"native": 0.050, "ring": 0.060}, ["native", "ring"]),
             23: ({"native": 1.00e-3, "ring": 1.05e-3}, ["native", "ring"])}
    for power, (predicted, order) in cases.items():
        assert learner.bucket((power, None, False), ranking(predicted)).candidates == order, predicted


@pytest.mark.parametrize("native_small", [0.44, 0.30])
def test_a_loser_in_a_smaller_class_of_long_calls_is_left_out_of_a_larger_one(native_small):
    """Two classes of long calls explored in the same steps, the smaller first in each (as a DDP job's
    16 and 84 MB buckets): MPI's own, 1.57x the best at 16 MiB (cut after one call there), is left out
    unmeasured at 64 MiB, where it would take 1.7 s against 0.6; within RECHECK at 16 MiB it is
    measured at 64 MiB as well. Every rank alike."""
    small, large = (24, None, False), (26, None, False)
    predicted = {"ps": 0.08, "ring": 0.12, "native": 0.121}
    truth = {small: {"ps": 0.28, "ring": 0.31, "native": native_small},
             large: {"ps": 0.6, "ring": 0.85, "native": 1.7}}
    picks, learners = simulate(2, 12, truth, predicted, keys=(small, large), noise=0.0)
    assert picks[0] == picks[1]
    ran = [name for key, name in picks[0] if key == large]
    bucket = learners[0].buckets[large]
    assert bucket.settled == "ps"
    if native_small > learn.RECHECK * 0.28:
        assert "native" not in ran and "native" in bucket.dropped
        assert "native left out (slower in a smaller class)" in learn.describe(bucket)
    else:
        assert ran.count("native") == 1 and "native" in bucket.cut


@pytest.mark.parametrize("ranks", [2, 3])
def test_watch_gives_up_an_algorithm_whose_calls_turn_slow(ranks):
    """Long calls (0.7 s): recursive doubling measures fastest while the bucket explores, then every other
    call of it takes 1.3 s; the ring takes 0.72 s every call. The watch of the settled calls hands over to
    the ring within a few calls, on every rank at the same call, and keeps it (the ring's calls stay as
    measured); short calls (under WATCH_S) are never watched."""
    predicted = {"recursive_doubling": 0.05, "ring": 0.055, "native": 0.06}

    def truth(i):
        slow = i >= 16 and i % 2
        return {"recursive_doubling": 1.3 if slow else 0.70, "ring": 0.72, "native": 1.0}
    picks, learners = simulate(ranks, 40, truth, predicted, noise=0.0)
    assert all(p == picks[0] for p in picks)
    bucket = learners[0].buckets[(20, None, False)]
    ran = [name for _, name in picks[0]]
    first_settled = ran[bucket.explored]
    assert first_settled == "recursive_doubling", learners[0].summary()
    assert bucket.settled == "ring" and bucket.watch_switches == 1, learners[0].summary()
    assert ran[24:] == ["ring"] * 16  # handed over within the first watched calls of the slow mode
    assert bucket.best_times()["recursive_doubling"] == pytest.approx(1.3)  # the median it showed
    assert "switch(es) on watched calls" in learners[0].summary()[0]
    agreements = learners[0].agreements
    short = {"recursive_doubling": 1e-3, "ring": 1.1e-3, "native": 3e-3}
    _, learners = simulate(2, 40, short, {k: v / 50 for k, v in predicted.items()}, noise=0.0)
    bucket = learners[0].buckets[(20, None, False)]
    assert not bucket.watching and bucket.watched == []
    assert agreements > learners[0].agreements  # the long calls' watch agreed on each call


@pytest.mark.parametrize("single_first", [False, True])
def test_long_calls_settle_on_what_their_fused_sibling_measured(single_first):
    """Long calls (0.7 s), fused on most calls and now and then one alone (a training step's last
    gradients arriving apart): the single calls settle on what the fused calls measured, watched, on
    every rank alike - at once where the fused ones settled first, else when they settle (the single
    calls' own exploration, one call now and then, is dropped). Short calls explore each kind alone."""
    predicted = {"recursive_doubling": 0.05, "ring": 0.055, "native": 0.06}
    truth = {"recursive_doubling": 0.75, "ring": 0.80, "native": 0.70}
    fused, single = (27, None, True), (27, None, False)

    def keys(i):
        if single_first:
            return (single, fused) if i % 5 == 0 else (fused,)
        return (fused,) if i < 20 else (fused, single)
    picks, learners = simulate(2, 30, truth, predicted, keys=keys, noise=0.0)
    assert picks[0] == picks[1]
    first, alone = learners[0].buckets[fused], learners[0].buckets[single]
    assert first.settled == "native" and first.explored == 3 * learn.REPS - 1 and first.cut == ["ring"]
    assert alone.settled == "native" and alone.seeded and alone.watching
    assert alone.explored == (1 if single_first else 0)  # call 0, before call 4 settled the fused
    singles = [name for key, name in picks[0] if key == single]
    assert singles[alone.explored:] == ["native"] * (len(singles) - alone.explored)
    assert "from its fused calls' times" in " ".join(learners[0].summary())
    short = {name: t / 100 for name, t in truth.items()}
    _, learners = simulate(2, 60, short, {k: v / 100 for k, v in predicted.items()},
                           keys=lambda i: (fused,) if i < 30 else (fused, single), noise=0.0)
    assert learners[0].buckets[single].explored > 0 and not learners[0].buckets[single].seeded


def test_short_calls_recheck_early_and_wide():
    """Short calls (4 KiB across hosts): recursive doubling measures 1.33x MPI's own while the bucket
    explores and 0.77x after (noisy blocks with 4 ranks on 2 cores). The first re-check comes after
    RECHECK_SHORT settled calls and includes it although it was more than RECHECK times slower: the
    bucket runs it from there on, on every rank alike."""
    predicted = {"recursive_doubling": 68e-6, "native": 105e-6}
    explore = {"recursive_doubling": 224e-6, "native": 169e-6}
    later = {"recursive_doubling": 140e-6, "native": 181e-6}
    picks, learners = simulate(2, 80, lambda i: explore if i < 20 else later, predicted, noise=0.0)
    assert picks[0] == picks[1]
    bucket = learners[0].buckets[(20, None, False)]
    ran = [name for _, name in picks[0]]
    settled_at = bucket.explored - bucket.checks * 2 * learn.REPS * learn.CHECK_ROUNDS
    assert ran[settled_at] == "native"
    assert bucket.settled == "recursive_doubling" and bucket.switches == 1
    switched = settled_at + learn.RECHECK_SHORT + 2 * learn.REPS * learn.CHECK_ROUNDS
    assert ran[switched:] == ["recursive_doubling"] * (len(ran) - switched)


def test_recheck_corrects_a_wrong_settle_on_every_rank_and_stays_bounded():
    """The bucket settles on the ring (then the faster); from call 20 on, MPI's own is faster (the machine
    changed, or the first calls were unlucky): a re-check after RECHECK_FIRST settled calls switches to it,
    on every rank at the same call although one rank's clock runs 40x fast. Re-checks come after 4x as
    many calls each time and run only algorithms measured near the settled one, so over 400 calls they
    cost few calls; an algorithm measured far slower is never run again."""
    predicted = {"ring": 1e-3, "rabenseifner": 1.1e-3, "native": 1.3e-3}
    before = {"ring": 1.0e-3, "rabenseifner": 4e-3, "native": 1.15e-3}
    after = {"ring": 1.0e-3, "rabenseifner": 4e-3, "native": 0.7e-3}
    calls = 400
    picks, learners = simulate(2, calls, lambda i: before if i < 20 else after, predicted, clocks=[1.0, 40.0],
                               noise=0.05)
    assert picks[0] == picks[1]
    bucket = learners[0].buckets[(20, None, False)]
    assert bucket.settled == "native" and bucket.switches == 1
    ran = [name for _, name in picks[0]]
    last_half = ran[calls // 2:]
    assert last_half.count("native") >= len(last_half) - 12  # at most one re-check of 3 x 2 x 2 calls
    settled_calls = calls - 20
    assert bucket.checks <= 3 and bucket.explored <= 20 + bucket.checks * 3 * 2 * learn.CHECK_ROUNDS
    assert (bucket.explored - 20) < 0.1 * settled_calls
    assert ran[60:].count("rabenseifner") == 0  # measured 4x the ring: never re-checked
    assert any("re-checked: was ring" in line for line in learners[0].take_notes())


def test_recheck_keeps_a_right_choice():
    """Nothing changed: the re-checks keep the settled algorithm (a rival must win by more than SWITCH)."""
    predicted = {"ring": 1e-3, "native": 1.1e-3}
    truth = {"ring": 1.0e-3, "native": 1.05e-3}
    picks, learners = simulate(2, 200, truth, predicted, noise=0.01)
    bucket = learners[0].buckets[(20, None, False)]
    assert bucket.settled == "ring" and bucket.checks >= 1 and bucket.switches == 0
    assert picks[0] == picks[1]


def test_small_messages_settle_in_two_rounds():
    """Below 2 ms predicted: a warm-up call each, then a round of a block of 2 consecutive calls each, then
    a second of those not dropped (over 2x the best), the order rotated: two agreements; a second size
    class warms up only what had not run when it started."""
    predicted = {"ring": 1e-4, "recursive_doubling": 1.2e-4, "native": 1.5e-4}
    truth = {"ring": 3e-4, "recursive_doubling": 1e-4, "native": 1.5e-4}
    keys = ((12, None, False), (14, None, False))
    picks, learners = simulate(2, 20, truth, predicted, keys=keys)
    learner = learners[0]
    first, second = (learner.buckets[k] for k in keys)
    assert first.dropped == second.dropped == ["ring"]  # 3x the best after the first round
    assert first.explored == 3 + 2 * 3 + 2 * 2 and second.explored == 2 + 2 * 3 + 2 * 2  # ring had run
    assert first.settled == second.settled == "recursive_doubling"
    assert learner.agreements == 4


def test_exploration_budget_across_size_classes():
    """Beyond FREE_CALLS exploring calls, a new size class explores only while exploring calls stay under
    BUDGET of all calls; else it takes the model's choice at once."""
    learner = learn.Learner(lambda v: v)
    learner.explored = learn.FREE_CALLS
    learner.calls = 1000
    bucket = learner.bucket((21, None, False), ranking({"ring": 1e-3, "native": 1.1e-3}))
    assert bucket.settled == "ring" and bucket.explored == 0
    learner.calls = 100_000  # a long job: room again
    bucket = learner.bucket((22, None, False), ranking({"ring": 1e-3, "native": 1.1e-3}))
    assert bucket.settled is None


def test_equal_predictions_count_once_and_native_is_always_measured():
    """On 2 ranks across 2 nodes ring, rabenseifner and hierarchical make the same exchanges (the model
    predicts them equal): one of them is measured; MPI's own allreduce is measured even when the model puts
    it far behind."""
    model, shape = cost.DEFAULTS, cost.Shape((0, 1))
    specs = [s for s in spec.SPECS if s.cost(model, 64 << 20, shape, None, 1 << 20) < cost.INF]
    ranked = select.rank_all(model, 64 << 20, shape, specs, None, 1 << 20)
    bucket = learn.Learner(lambda v: v).bucket((27, None, False), lambda: ranked)
    assert len({"ring", "rabenseifner", "hierarchical"} & set(bucket.candidates)) == 1
    assert "native" in bucket.candidates
    slow_native = [Choice(c.algorithm, c.segment_bytes, c.predicted_s * (100 if c.algorithm == "native" else 1))
                   for c in ranked]
    bucket = learn.Learner(lambda v: v).bucket((27, None, False), lambda: sorted(
        slow_native, key=lambda c: c.predicted_s))
    assert "native" in bucket.candidates


def test_mpi_among_the_models_first_does_not_crowd_out_a_candidate():
    """2 hosts x 2 ranks, 64 KiB, default model: hierarchical, MPI's own, hierarchical_pipelined, torus2d
    (predicted as hierarchical_pipelined) and recursive doubling come within 1.5x of each other. MPI's own
    is measured besides MAX_CANDIDATES of commlib's: recursive doubling, measured fastest at 64 KiB under
    load on that layout, is among them."""
    model, shape = cost.DEFAULTS, cost.Shape((0, 0, 1, 1))
    specs = [s for s in spec.SPECS if s.cost(model, 64 << 10, shape, None, 1 << 20) < cost.INF]
    ranked = select.rank_all(model, 64 << 10, shape, specs, None, 1 << 20)
    assert [c.algorithm for c in ranked[:2]] == ["hierarchical", "native"]
    bucket = learn.Learner(lambda v: v).bucket((17, None, False), lambda: ranked)
    assert "native" in bucket.candidates and "recursive_doubling" in bucket.candidates
    assert len([n for n in bucket.candidates if n != "native"]) == learn.MAX_CANDIDATES


def test_default_model_prefers_mpi_across_two_hosts_of_one_rank():
    """Without a profile, 2 hosts x 1 rank: MPI's own allreduce streams over the network as well as the ring
    (measured 0.8x the ring at 64 MiB at 1 Gbit/s), so the model does not prefer a Python schedule to it."""
    model, shape = cost.DEFAULTS, cost.Shape((0, 1))
    for nbytes in (16 << 20, 64 << 20, 100 << 20):
        specs = [s for s in spec.SPECS if s.cost(model, nbytes, shape, None, 1 << 20) < cost.INF]
        assert select.rank_all(model, nbytes, shape, specs, None, 1 << 20)[0].algorithm == "native"


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs, args", [
    pytest.param(2, [], id="2ranks"),
    pytest.param(3, ["--skew"], id="3ranks-skewed-clock"),
    pytest.param(4, ["--local-size", "2", "--skew"], id="2x2-skewed-clock"),
    pytest.param(2, ["--local-size", "1"], id="2x1"),
    pytest.param(2, ["--off"], id="2ranks-off"),
    pytest.param(4, ["--local-size", "2", "--pace", "0.05"], id="2x2-paced"),
])
def test_learning_on_a_real_job(nprocs, args):
    last = ("off_auto_is_the_models_choice" if "--off" in args
            else "paced_classes_rested_and_short_ones_did_not" if "--pace" in args
            else "auto_runs_what_it_learned")
    run_mpi(nprocs, "auto_learn.py", *args, timeout=240, cases=[last])
