"""Worker: every allreduce algorithm x op x dtype x size against numpy references, on this job's ranks.

    mpiexec -n P python algo_check.py [--local-size K | --round-robin N]

``--round-robin N`` places rank r on node r % N (nodes that are not blocks of consecutive ranks, as a
cyclic placement by the launcher gives).

Inputs are seeded by (rank, case), so every rank computes every rank's input and the reference. Checks
also that all ranks end with bitwise identical results. Named cases on every rank (tests/spmd.py).
"""

from __future__ import annotations

import argparse
import hashlib
import os

import numpy as np
from mpi4py import MPI

from commlib.algorithms import ALGORITHMS, AlgorithmContext, run_allreduce
from commlib.compression import Compression
from commlib.config import Config
from commlib.dtypes import BFLOAT16, FLOAT16, REDUCIBLE
from commlib.errors import CommlibError, ConfigError
from commlib.ops import ReduceOp
from commlib.topology import Topology
from commlib.transport.mpi import MPITransport
import spmd
from spmd import expect_error

OPS = (ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT)
SUBNORMAL = {FLOAT16: 2.0 ** -24, BFLOAT16: 2.0 ** -133}  # smallest positive subnormal of the wire format
EPS = {FLOAT16: 2.0 ** -11, BFLOAT16: 2.0 ** -8, np.dtype(np.float32): 2.0 ** -24, np.dtype(np.float64): 2.0 ** -53}


def make_input(rank: int, dtype: np.dtype, op: ReduceOp, n: int, case: int) -> np.ndarray:
    rng = np.random.default_rng([rank, case, n, int(op)])
    if dtype.kind in "iu":
        if op is ReduceOp.PRODUCT:
            low, high = (0, 4) if dtype.kind == "u" else (-2, 3)
        else:
            info = np.iinfo(dtype)
            bound = min(info.max // 8, 10 ** 12)
            low, high = (0, bound) if dtype.kind == "u" else (-bound, bound)
        return rng.integers(low, high, n).astype(dtype)
    if op is ReduceOp.PRODUCT:
        return rng.uniform(0.5, 1.5, n).astype(dtype)
    return (rng.standard_normal(n) * 4).astype(dtype)


def reference(inputs: list[np.ndarray], op: ReduceOp) -> np.ndarray:
    stack = np.stack(inputs)
    if stack.dtype == np.bool_:  # Sum and Max: or; Product and Min: and
        return (np.any if op in (ReduceOp.SUM, ReduceOp.MAX) else np.all)(stack, axis=0)
    wide = stack.astype(np.float64) if stack.dtype.kind not in "iu" else stack
    func = {ReduceOp.SUM: np.sum, ReduceOp.MIN: np.min, ReduceOp.MAX: np.max, ReduceOp.PRODUCT: np.prod}[op]
    return func(wide, axis=0)


def tolerance(inputs, op, eps, steps):
    """Bound of ``steps`` roundings of relative size ``eps`` on the partial results."""
    stack = np.abs(np.stack(inputs).astype(np.float64))
    if op is ReduceOp.SUM:
        return steps * eps * stack.sum(axis=0) + 1e-30
    if op is ReduceOp.PRODUCT:
        return steps * eps * stack.prod(axis=0) * 2 + 1e-30
    return np.zeros(stack.shape[1:])  # min/max only select values: exact


class Checker:
    def __init__(self, comm):
        self.comm = comm
        self.p = comm.size
        self.rank = comm.rank
        self.checks = 0

    def identical(self, buf: np.ndarray, what: str) -> None:
        digest = hashlib.sha1(buf.tobytes()).hexdigest()
        every = self.comm.allgather(digest)
        if len(set(every)) != 1:
            raise AssertionError(f"{what}: ranks ended with different results (digests {every})")

    def allreduce(self, ctx, algorithm, dtype, op, n, case, codec=None):
        p = self.p
        inputs = [make_input(r, dtype, op, n, case) for r in range(p)]
        buf = inputs[self.rank].copy()
        what = f"{algorithm} {dtype} {op.name} n={n} codec={codec} p={p}"
        run_allreduce(ctx, buf, op, algorithm, codec)
        if n == 0:
            assert buf.size == 0, what
            self.checks += 1
            return
        ref = reference(inputs, op)
        if dtype.kind in "iub" and codec is None:
            expected = ref.astype(dtype)
            if not np.array_equal(buf, expected):
                bad = np.flatnonzero(buf != expected)[:5]
                raise AssertionError(f"{what}: wrong at {bad.tolist()}: got {buf[bad]}, want {expected[bad]}")
        else:
            if codec is not None:
                eps, steps = EPS[codec.wire_dtype], 2 * p + 2
            elif dtype in (FLOAT16, BFLOAT16):
                eps, steps = EPS[dtype], p + 1  # input exact, one rounding per reduction step
            else:
                eps, steps = EPS[dtype], 2 * p
            tol = tolerance(inputs, op, eps, steps)
            if p == 1:
                tol = np.zeros_like(tol)
            if op in (ReduceOp.MIN, ReduceOp.MAX) and codec is not None and p > 1:
                tol = np.abs(ref) * eps  # the result crossed the wire once
            if codec is not None and p > 1:
                # Below the wire format's normal range the spacing is absolute: a value that small is
                # rounded to a multiple of the smallest subnormal (5.96e-8 in float16), not to eps relative.
                tol = np.maximum(tol, steps * float(SUBNORMAL[codec.wire_dtype]))
            err = np.abs(buf.astype(np.float64) - ref)
            if not np.all(err <= tol):
                i = int(np.argmax(err - tol))
                raise AssertionError(f"{what}: element {i} is {buf[i]}, want {ref[i]} (error {err[i]:.3g} > {tol[i]:.3g})")
        self.identical(buf, what)
        self.checks += 1


class Job:
    """This job's topology, algorithm contexts and checker, shared by the cases."""

    def __init__(self, local_size: int | None, round_robin: int | None):
        self.comm = comm = MPI.COMM_WORLD
        self.p = p = comm.size
        self.local_size = local_size
        self.check = Checker(comm)
        if round_robin:
            self.topology = Topology.from_node_ids(comm.rank, [r % round_robin for r in range(p)])
        else:
            self.topology = Topology.detect(comm, local_size)
        self.contexts = []
        self.sizes = sorted({0, 1, max(p - 1, 0), p + 1, 7, 13, 1031})
        self.case = 0  # seeds the inputs: every check gets its own
        # several segments already at 1K
        self.small = self.context(ring_segment_bytes=1024, small_message_bytes=256, cma_segment_bytes=64)
        self.large = self.context(ring_segment_bytes=256 << 10)
        self.algorithms = ["auto"] + [a for a in ALGORITHMS if a != "ps"]  # ps needs servers: tests/server
        if not self.topology.uniform:
            self.algorithms.remove("torus2d")  # default grid needs equal nodes: checked as an error below
        if self.small.peer_memory is None:
            self.algorithms.remove("cma")  # several (emulated) nodes: checked as an error below

    def context(self, **settings):
        config = Config.load({}, local_size=self.local_size, **settings)
        ctx = AlgorithmContext.create(MPITransport.duplicate(self.comm), self.topology, config)
        self.contexts.append(ctx)
        return ctx

    def allreduce(self, ctx, algorithm, dtype, op, n, codec=None):
        self.case += 1
        self.check.allreduce(ctx, algorithm, dtype, op, n, self.case, codec)


job: Job  # made in __main__ (another worker may import this one for its Checker)


@spmd.case
def cma_probe_agrees_with_the_kernel():
    if job.topology.cross_size == 1 and job.p > 1:  # one node: tests/mpirun.py finds out what the kernel allows
        assert (job.small.peer_memory is not None) == (os.environ["CMA_EXPECTED"] == "1"), job.small.peer_memory_reason
        if job.small.peer_memory is not None:
            assert job.large.peer_memory is not None, "cross-memory attach probed differently for two contexts"


@spmd.case
def every_algorithm_op_dtype_size():
    for algorithm in job.algorithms:
        for dtype in REDUCIBLE:
            for op in OPS:
                for n in job.sizes:
                    job.allreduce(job.small, algorithm, dtype, op, n)


@spmd.case
def codecs_on_float32():
    """Every algorithm that supports a codec."""
    for algorithm in [a for a in job.algorithms if a != "native"]:
        for codec in (Compression.fp16, Compression.bf16):
            for op in OPS:
                for n in (0, 1, job.p + 1, 1031):
                    job.allreduce(job.small, algorithm, np.dtype(np.float32), op, n, codec)


@spmd.case
def many_pipeline_segments():
    """A few MiB: many pipeline segments per ring step."""
    big = 3 * (1 << 18) + 13  # 3 MiB of float32 plus a remainder
    for algorithm in job.algorithms:
        job.allreduce(job.large, algorithm, np.dtype(np.float32), ReduceOp.SUM, big)
        if algorithm != "native":
            job.allreduce(job.large, algorithm, np.dtype(np.float32), ReduceOp.SUM, big, Compression.bf16)
    job.allreduce(job.large, "ring", BFLOAT16, ReduceOp.SUM, big)


@spmd.case
def torus2d_on_explicit_grids():
    p = job.p
    for nx in [d for d in range(1, p + 1) if p % d == 0]:
        ctx = job.context(torus_shape=(nx, p // nx), ring_segment_bytes=1024)
        for dtype in (np.dtype(np.float32), np.dtype(np.int32), FLOAT16):
            for n in job.sizes:
                job.allreduce(ctx, "torus2d", dtype, ReduceOp.SUM, n)
        job.allreduce(ctx, "torus2d", np.dtype(np.float32), ReduceOp.SUM, 1031, Compression.fp16)


@spmd.case
def errors_on_every_rank_alike():
    small, p, f32 = job.small, job.p, np.ones(8, np.float32)
    expect_error(ConfigError, "unknown algorithm", lambda: run_allreduce(small, f32, ReduceOp.SUM, "bogus"),
                 "bad algorithm name")
    bad_grid = job.context(torus_shape=(p + 1, 1))
    expect_error(ConfigError, "COMMLIB_TORUS_SHAPE", lambda: run_allreduce(bad_grid, f32, ReduceOp.SUM, "torus2d"),
                 "bad torus shape")
    if not job.topology.uniform:
        expect_error(ConfigError, "COMMLIB_TORUS_SHAPE", lambda: run_allreduce(small, f32, ReduceOp.SUM, "torus2d"),
                     "default torus on uneven nodes")
    expect_error(ConfigError, "native", lambda: run_allreduce(small, f32, ReduceOp.SUM, "native", Compression.fp16),
                 "native with a codec")
    expect_error(CommlibError, "contiguous",
                 lambda: run_allreduce(small, np.ones(8, np.float32)[::2], ReduceOp.SUM, "ring"), "non-contiguous buffer")
    expect_error(TypeError, "float32", lambda: run_allreduce(small, np.ones(8), ReduceOp.SUM, "ring", Compression.bf16),
                 "codec on float64")
    if p > 1 and job.topology.cross_size > 1:
        expect_error(CommlibError, "nodes", lambda: run_allreduce(small, f32, ReduceOp.SUM, "cma"), "cma across nodes")
    if p > 1:
        off = job.context(cma=False)
        expect_error(CommlibError, "COMMLIB_CMA=0", lambda: run_allreduce(off, f32.copy(), ReduceOp.SUM, "cma"),
                     "cma switched off")
        assert AlgorithmContext.create(off.transport, job.topology, off.config).peer_memory is None


@spmd.case
def close_every_context():
    for ctx in job.contexts:
        ctx.close()
        ctx.transport.free()
    total = job.comm.allreduce(job.check.checks)
    if job.comm.rank == 0:
        print(f"{job.check.checks} allreduce checks per rank ({total} in all) on {job.p} ranks, {job.topology}",
              flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--local-size", type=int, default=None)
    parser.add_argument("--round-robin", type=int, default=None)
    args = parser.parse_args()
    job = Job(args.local_size, args.round_robin)
    spmd.main()
