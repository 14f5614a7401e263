"""Paced exploring (commlib/algorithms/learn.py, COMMLIB_AUTO_PACE): in classes the model calls long, what
the candidates' calls cost over the best measured so far stays near the pace's share of the class's calls
from the first call on, the leader runs between blocks, and the class still settles on the fastest.

One learner stands for every rank (its agreement is the identity), driven on a virtual clock."""

from __future__ import annotations

import json

import pytest

from commlib.algorithms import learn
from commlib.algorithms.learn import SETTLED, WARMING, Learner
from test_learn_states import SHORT, Job

PACE = 0.05
KEY = (25, None, False)
# predicted over SMALL_S and under LARGE_S (a warm-up call each); measured 2x-7x apart, as DDP's 16-32 MiB
# buckets on 1 host x 2 ranks
PREDICTED = {"cma": 2.6e-3, "ring": 3.3e-3, "hierarchical_pipelined": 3.7e-3, "native": 6e-3}
TRUTH = {"cma": 6e-3, "ring": 13e-3, "hierarchical_pipelined": 40e-3, "native": 20e-3}


def paced_job(predicted=PREDICTED, truth=TRUTH, pace=PACE) -> Job:
    job = Job(predicted, truth)
    job.learner = Learner(lambda v: v, clock=lambda: job.clock, sync=job._sync, pace=pace)
    return job


def excess_after_each_call(job: Job, calls: int, best: float) -> list[float]:
    """What the calls so far cost over running the fastest on each, after each call."""
    out, total = [], 0.0
    for _ in range(calls):
        total += TRUTH[job.call(KEY)] - best
        out.append(total)
    return out


def test_exploring_costs_its_share_from_the_first_call():
    """After every call, the candidates' cost over the fastest is at most the pace's share of the calls so
    far plus one warm-up call and block of the slowest candidate: paid once, then rested off. Unpaced, the
    same class pays every candidate in its first calls."""
    best, worst = min(TRUTH.values()), max(TRUTH.values())
    paced = excess_after_each_call(paced_job(), 2000, best)
    slack = (1 + learn.REPS) * (worst - best)
    for n, excess in enumerate(paced, 1):
        assert excess <= PACE * n * best + slack, f"after {n} calls exploring cost {excess * 1e3:.1f} ms"
    at_once = excess_after_each_call(paced_job(pace=0.0), 30, best)
    assert at_once[-1] > PACE * 30 * best + slack  # the bound above is one unpaced exploring breaks


def test_the_leader_runs_between_blocks_and_the_class_settles_on_the_fastest():
    job = paced_job()
    ran = job.run(2000, KEY)
    bucket = job.learner.buckets[KEY]
    assert bucket.state is SETTLED and bucket.settled == "cma", learn.describe(bucket)
    assert bucket.rests > 0 and ran.count("cma") >= 2000 - bucket.explored
    assert job.syncs <= bucket.explored  # a rest waits for no barrier
    assert "between blocks (paced)" in learn.describe(bucket)


def test_a_faster_rival_earns_its_calls_and_leads():
    """The model's favourite is the slow one: the rival it ranks next runs once earned, leads from its first
    agreed call (the rests run it), and its gain pays the next blocks: the class settles sooner than at
    the favourite's pace."""
    truth = {"cma": 30e-3, "ring": 10e-3, "hierarchical_pipelined": 40e-3, "native": 20e-3}
    job = paced_job(truth=truth)
    ran = job.run(400, KEY)
    bucket = job.learner.buckets[KEY]
    assert bucket.settled == "ring", learn.describe(bucket)
    first_ring = ran.index("ring")
    assert first_ring < 60, ran[:80]
    assert ran[first_ring + 10:].count("cma") <= learn.REPS  # cma no longer leads


def test_short_classes_explore_at_once():
    job = paced_job(predicted=SHORT, truth={"ring": 3e-4, "recursive_doubling": 1e-4, "native": 1.5e-4})
    job.run(3, KEY)
    bucket = job.learner.buckets[KEY]
    assert not bucket.paced and bucket.rests == 0 and job.path(KEY)[0] is WARMING


@pytest.mark.parametrize("pace", [0.0, PACE])
def test_a_settled_bucket_is_kept_and_restored_paced_or_not(pace):
    job = paced_job(pace=pace)
    job.run(2000, KEY)
    kept = job.learner.buckets[KEY].to_kept()
    restored = learn.Bucket.from_kept(kept)
    assert restored.settled == "cma" and not restored.paced


def test_a_job_too_short_to_settle_hands_its_blocks_to_the_next():
    """A class explored paced is kept with the blocks it agreed; a later job's class goes on from there: a
    block of the leader, then only the candidates not measured yet, and settles on the fastest, where a
    fresh job would measure every candidate again."""
    first = paced_job()
    first.run(150, KEY)
    bucket = first.learner.buckets[KEY]
    assert bucket.settled is None and bucket.keepable, learn.describe(bucket)
    kept = json.loads(json.dumps(bucket.to_kept()))
    assert kept["settled"] is None and kept["agreed"], kept
    assert kept["allowance"] == pytest.approx(bucket.allowance)  # what its calls earned goes on too
    measured = set(kept["agreed"])

    later = paced_job()
    restored = learn.Bucket.from_kept(kept)
    later.learner.restore(restored)
    assert restored.allowance == pytest.approx(kept["allowance"])
    kept_leader = min(kept["agreed"], key=lambda n: min(kept["agreed"][n]))
    assert restored.leader == kept_leader
    ran = later.run(2000, KEY)
    assert restored.settled == "cma", learn.describe(restored)
    again = {name for name, times in restored.agreed.items() if len(times) > len(kept["agreed"].get(name, []))}
    assert again - {kept_leader} == set(PREDICTED) - measured, (again, measured)  # each once, none twice
    assert ran[:1] == [kept_leader]


def test_only_a_paced_class_with_agreed_blocks_is_kept_while_exploring():
    job = paced_job()
    job.run(1, KEY)
    assert not job.learner.buckets[KEY].keepable  # nothing agreed yet
    with pytest.raises(ValueError, match="nothing to keep"):
        job.learner.buckets[KEY].to_kept()
    at_once = paced_job(pace=0.0)
    at_once.run(5, KEY)
    assert at_once.learner.buckets[KEY].state is not SETTLED and not at_once.learner.buckets[KEY].keepable


def test_a_class_of_long_calls_explores_at_once():
    """Where the leader's calls take WATCH_S or more, a losing block ends after one call (CUT) and the class
    must settle early for the watch and trials to see the job's own calls: no rests there."""
    truth = {name: 20 * t for name, t in TRUTH.items()}  # 120 ms and up
    job = paced_job(predicted={n: 20 * t for n, t in PREDICTED.items()}, truth=truth)
    job.run(learn.MAX_CALLS, KEY)
    bucket = job.learner.buckets[KEY]
    assert not bucket.paced and bucket.rests == 0 and bucket.settled == "cma", learn.describe(bucket)
