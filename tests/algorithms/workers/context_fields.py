"""Worker: what the algorithms remember across calls lives in typed fields of the AlgorithmContext, each
made on first use by the module that owns it, kept between calls, dropped with the cost model it came
from (Engine.use_model) and by close().

    mpiexec -n 2 python context_fields.py

Named cases on every rank (tests/spmd.py).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
from mpi4py import MPI

from commlib.algorithms import cost, run_allreduce, select
from commlib.config import Config
from commlib.engine import Engine
from commlib.ops import ReduceOp
from commlib.topology import Topology
from commlib.transport.mpi import MPITransport
import spmd

FIELDS = ("shape", "rankings", "inplace_limit", "learner", "server_shape", "cma_shares")


def checked_sum(engine: Engine, comm, count: int) -> None:
    x = np.arange(count, dtype=np.float32) + comm.Get_rank()
    want = comm.allreduce(x, MPI.SUM)
    engine.allreduce_(x, ReduceOp.SUM)
    assert np.array_equal(x, want), f"{count} floats: wrong sum"


comm = MPI.COMM_WORLD
engine = Engine(MPITransport.duplicate(comm), Topology.detect(comm), Config.load())
ctx = engine.context
learner = None


@spmd.case
def every_field_starts_empty():
    assert all(getattr(ctx, name) is None for name in FIELDS), {name: getattr(ctx, name) for name in FIELDS}


@spmd.case
def first_use_makes_the_learner_shape_ranking_and_limit():
    global learner
    checked_sum(engine, comm, 1024)  # auto, learning: the learner, the shape and a ranking are made
    learner = ctx.learner
    assert learner is not None and select.learner(ctx) is learner
    assert ctx.shape is select.shape_of(ctx) and ctx.shape.ranks == comm.Get_size()
    assert ctx.rankings is not None and len(ctx.rankings) == 1
    limit = engine.fusion_inplace_bytes
    assert ctx.inplace_limit == limit and limit > 0


@spmd.case
def a_new_model_drops_its_decisions_and_keeps_what_was_learned():
    # a model in which what the old one chose is far slower (MPI's own, or commlib's Python schedules):
    # decisions from the old model are dropped, what was learned and the shape of the job are kept
    before = select.choose(ctx, 64 << 10).algorithm
    slower = {"native_alpha_s": 1.0} if before == "native" else {"call_s": 1.0}
    engine.use_model(dataclasses.replace(ctx.cost_model, source="test", **slower))
    assert ctx.rankings is None and ctx.inplace_limit is None
    assert ctx.learner is learner and ctx.shape is not None
    assert select.choose(ctx, 64 << 10).algorithm != before, before
    checked_sum(engine, comm, 1024)
    checked_sum(engine, comm, 3000)


@spmd.case
def cma_keeps_its_balanced_shares():
    if not (os.environ.get("CMA_EXPECTED") == "1" and ctx.peer_memory is not None):
        spmd.skip("cross-memory attach is not available here")
    buf = np.ones(1 << 18, np.float32)
    run_allreduce(ctx, buf, ReduceOp.SUM, "cma")
    assert ctx.cma_shares is not None and np.all(buf == comm.Get_size())


@spmd.case
def close_drops_every_field():
    engine.close()
    assert all(getattr(ctx, name) is None for name in FIELDS), {name: getattr(ctx, name) for name in FIELDS}


if __name__ == "__main__":
    spmd.main()
