"""A job that learns (``new``: its layout has not run before) or starts from what an earlier job of its layout
kept (``seen``), with COMMLIB_AUTO_CACHE set by the test: what auto's learner says it started from, that a
kept class starts settled and does not explore on its first call, and that every rank holds the same."""

import sys

import numpy as np

import commlib as cl
import spmd
from commlib import lifecycle
from commlib.algorithms.learn import KEPT

SCENARIO = sys.argv[1]
SIZES = (4 << 10, 64 << 10, 1 << 20)


def learner():
    return lifecycle.current().world_context.learner


@spmd.case
def init():
    cl.init()


@spmd.case
def the_learner_says_where_it_started():
    buf = np.ones(SIZES[1] // 4, np.float32)  # (not eager across nodes: eager tensors take no algorithm)
    cl.allreduce_(buf, op=cl.Sum, name="first")  # the lane's learner is made on its first auto call
    origin = learner().origin
    expected = "this layout ran before" if SCENARIO == "seen" else "a new layout"
    assert expected in origin and origin in learner().summary()[0], origin
    key = ((SIZES[1]).bit_length(), None, False)
    bucket = learner().buckets[key]
    if SCENARIO == "seen":  # started settled: its first call ran the settled algorithm, no exploring
        assert bucket.restored and bucket.explored == 0 and bucket.state in KEPT, bucket
    else:
        assert not bucket.restored and bucket.explored == 1, bucket


@spmd.case
def every_size_class_settles_alike_on_every_rank():
    for nbytes in SIZES:
        buf = np.ones(nbytes // 4, np.float32)
        for _ in range(40):
            got = cl.allreduce_(buf.copy(), op=cl.Sum, name=f"size.{nbytes}")
            assert np.all(got == cl.size()), got
    summaries = cl.allgather_object(learner().summary())
    assert all(s == summaries[0] for s in summaries), summaries
    states = {key: bucket.state.value for key, bucket in learner().buckets.items()}
    assert states and all(bucket.state in KEPT for bucket in learner().buckets.values()), states


@spmd.case
def shutdown():
    cl.shutdown()  # rank 0 keeps what settled


if __name__ == "__main__":
    spmd.main()
