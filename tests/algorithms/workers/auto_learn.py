"""Worker: ``auto`` learning on a real job - every rank runs the same algorithm on every call while it
explores (also when one rank's clock disagrees wildly), every size class settles within 20 calls, results
stay right, and with COMMLIB_AUTO_LEARN=0 auto is the model's choice and nothing is measured. Paced
(``--pace``), the ranks still run alike, and classes the model calls long rest between blocks instead.

    mpiexec -n P python auto_learn.py [--local-size K] [--skew] [--pace SHARE]

``--skew``: the last rank's learner reads a clock running 50x fast with noise, so its own times rank the
algorithms differently from the other ranks'.
"""

from __future__ import annotations

import argparse
import random

import numpy as np
from mpi4py import MPI

from commlib.algorithms import learn, select
from commlib.config import Config
from commlib.engine import Engine
from commlib.ops import ReduceOp
from commlib.topology import Topology
from commlib.transport.mpi import MPITransport
import spmd

SIZES = (1 << 10, 48 << 10, 1 << 20, 3 << 20)  # bytes; 48 KiB and 1 MiB classes differ from 3 MiB's
CALLS = 24


parser = argparse.ArgumentParser()
parser.add_argument("--local-size", type=int)
parser.add_argument("--skew", action="store_true")
parser.add_argument("--off", action="store_true", help="COMMLIB_AUTO_LEARN=0")
parser.add_argument("--pace", type=float, default=0.0, help="COMMLIB_AUTO_PACE (0: explore at once)")
args = parser.parse_args()
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
engine = ctx = learning = None
picks: list = []


@spmd.case
def init():
    global engine, ctx, learning
    config = Config.load(local_size=args.local_size, auto_learn=not args.off, auto_pace=args.pace)
    engine = Engine(MPITransport.duplicate(comm), Topology.detect(comm, args.local_size), config)
    ctx = engine.context
    learning = select.learner(ctx)
    if args.off:
        assert learning is None, "COMMLIB_AUTO_LEARN=0 must not make a learner"
        return
    original = learning.pick

    def logged(bucket):
        name = original(bucket)
        picks.append((bucket.key, name or bucket.settled))
        return name
    learning.pick = logged
    if args.skew and rank == size - 1:
        rng = random.Random(rank)
        real = learning.clock
        learning.clock = lambda: real() * 50 + rng.random()


@spmd.case
def every_call_gives_mpis_sum():
    rng = np.random.default_rng(rank)
    for call in range(CALLS):
        for nbytes in SIZES:
            count = nbytes // 4
            x = rng.integers(-8, 8, count).astype(np.float32)
            want = np.empty_like(x)
            comm.Allreduce(x, want, MPI.SUM)
            got = x.copy()
            engine.allreduce_(got, ReduceOp.SUM)
            assert np.array_equal(got, want), f"call {call}, {nbytes} B: wrong sum"
        # several buffers fused in place (the coordinator's path for large tensors)
        bufs = [rng.integers(-8, 8, n).astype(np.float32) for n in (200_000, 300_000)]
        wants = [comm.allreduce(b, MPI.SUM) for b in bufs]
        engine.allreduce_many_(bufs, ReduceOp.SUM)
        for b, w in zip(bufs, wants):
            assert np.array_equal(b, w), f"call {call}: wrong fused sum"


@spmd.case
def half_types_learn_apart_with_mpis_own_last():
    """MPI reduces float16 through a Python callback: its size classes are its own, and MPI's own is
    ranked (so measured) last, and only where calls are short; float32 of the same size keeps the model's
    order and its own class."""
    nbytes = 1 << 20
    half = select.ranked(ctx, nbytes, None, np.float16)
    plain = select.ranked(ctx, nbytes)
    native = [c for c in plain if c.algorithm == "native"]
    if native and native[0].predicted_s < learn.SMALL_S:
        assert half[-1].algorithm == "native", [c.algorithm for c in half]
    else:
        assert "native" not in [c.algorithm for c in half], half
    long = select.ranked(ctx, 1 << 30, None, np.float16)
    assert "native" not in [c.algorithm for c in long], long  # predicted far over SMALL_S anywhere
    assert [c for c in half if c.algorithm != "native"] == [c for c in plain if c.algorithm != "native"]
    assert select.ranked(ctx, nbytes, None, np.float32) == select.ranked(ctx, nbytes)  # the model's order
    assert select.choose(ctx, nbytes, None, np.float16).algorithm != "native"
    assert select.bucket_key(nbytes, None, False, np.float16)[1] == "float16"
    assert select.bucket_key(nbytes, None, False, np.float32) == select.bucket_key(nbytes)
    rng = np.random.default_rng(rank)
    for call in range(CALLS):
        x = rng.integers(-8, 8, nbytes // 2).astype(np.float16)
        want = np.sum(comm.allgather(x.astype(np.float64)), axis=0)
        engine.allreduce_(x, ReduceOp.SUM)
        assert np.array_equal(x.astype(np.float64), want), f"call {call}: wrong float16 sum"
    if learning is None:
        return
    bucket = learning.buckets[select.bucket_key(nbytes, None, False, np.float16)]
    assert "float16" in learn.bucket_label(bucket.key)
    if "native" in bucket.candidates:
        assert bucket.candidates[-1] == "native", bucket.candidates


@spmd.case
def hierarchical_weighed_only_where_a_node_holds_ranks():
    """Where every node holds one rank, hierarchical and its pipelined form repeat the flat algorithms'
    exchanges: auto leaves them out (and the layout it keeps says so), though a configured one still runs,
    fused buffers too, and sums right."""
    topo = ctx.topology
    flat = topo.cross_size > 1 and topo.max_local_size == 1
    weighed = {s.name for s in select.candidates(ctx, None)}
    assert ({"hierarchical", "hierarchical_pipelined"} & weighed == set()) == flat, (str(topo), weighed)
    assert set(select.layout_of(ctx)["algorithms"]) == weighed
    assert all(c.algorithm in weighed for c in select.ranked(ctx, 64 << 20))
    rng = np.random.default_rng(rank)
    for algorithm in ("hierarchical", "hierarchical_pipelined"):
        assert select.choice_of(ctx, algorithm, 3 << 20).algorithm == algorithm
        bufs = [rng.integers(-8, 8, n).astype(np.float32) for n in (300_001, 5)]
        wants = [comm.allreduce(b, MPI.SUM) for b in bufs]
        engine.allreduce_many_(bufs, ReduceOp.SUM, algorithm=algorithm)
        assert all(np.array_equal(b, w) for b, w in zip(bufs, wants)), f"{algorithm}: wrong fused sum"


@spmd.case
def off_auto_is_the_models_choice():
    assert ctx.learner is None
    for nbytes in SIZES:
        assert select.current(ctx, nbytes) == select.choose(ctx, nbytes)


@spmd.case
def every_rank_ran_and_learned_alike():
    every = comm.allgather(picks)
    assert all(p == every[0] for p in every), f"ranks picked differently: {[p[:40] for p in every]}"
    summaries = comm.allgather(learning.summary())
    assert all(s == summaries[0] for s in summaries), summaries


@spmd.case
def every_size_class_settled_within_its_budget():
    for key, bucket in learning.buckets.items():
        if key[0] <= 3:
            continue  # none here; a 1-element call would be its own class
        assert bucket.settled is not None, f"{learn.bucket_label(key)} did not settle in {CALLS} calls"
        # at most 20 calls to settle (near-tie rounds included), plus each re-check's 2 rounds of at most 3
        # algorithms x 2 calls
        checked = bucket.checks * 3 * 2 * learn.CHECK_ROUNDS
        assert bucket.explored <= 20 + checked, f"{learn.bucket_label(key)} explored {bucket.explored} calls"
        assert bucket.settled in bucket.candidates
    checks = sum(b.checks for b in learning.buckets.values())
    assert learning.explored <= len(learning.buckets) * 20 + checks * 3 * 2 * learn.CHECK_ROUNDS
    assert learning.agreements <= ((learn.ROUNDS + 1 + learn.EXTRA_ROUNDS) * len(learning.buckets)
                                   + learn.CHECK_ROUNDS * checks + learning.watches)


@spmd.case
def paced_classes_rested_and_short_ones_did_not():
    """Each class the model calls long ran its leader between blocks (every rank alike: the case before),
    unless its leader's calls took WATCH_S or more (a skewed clock's rank makes every agreed time so);
    classes it calls short explored at once."""
    long = [b for b in learning.buckets.values() if not b.short]
    assert long, [learn.bucket_label(k) for k in learning.buckets]
    for bucket in long:
        if min(bucket.best_times().values(), default=0.0) < learn.WATCH_S:
            assert bucket.rests > 0, f"{learn.bucket_label(bucket.key)} never rested: {learn.describe(bucket)}"
        else:
            assert not bucket.paced, learn.describe(bucket)
    if not args.skew:
        assert any(b.rests for b in long), [learn.describe(b) for b in long]
    short = [b for b in learning.buckets.values() if b.short]
    assert all(b.rests == 0 for b in short), [learn.describe(b) for b in short if b.rests]


@spmd.case
def auto_runs_what_it_learned():
    for nbytes in SIZES:
        assert select.current(ctx, nbytes).algorithm == learning.settled(select.bucket_key(nbytes))
    if rank == 0:
        print("\n".join(learning.summary()))
        print(f"{len(learning.buckets)} classes, {learning.explored} exploring calls of {learning.calls}", flush=True)


@spmd.case
def close():
    engine.close()


if __name__ == "__main__":
    learned = ["every_rank_ran_and_learned_alike", "every_size_class_settled_within_its_budget",
               "auto_runs_what_it_learned"]
    paced = ["every_rank_ran_and_learned_alike", "paced_classes_rested_and_short_ones_did_not"]
    spmd.main(["init", "every_call_gives_mpis_sum", "half_types_learn_apart_with_mpis_own_last",
               "hierarchical_weighed_only_where_a_node_holds_ranks",
               *(["off_auto_is_the_models_choice"] if args.off else paced if args.pace else learned), "close"])
