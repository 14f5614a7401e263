"""Worker for jobs across emulated hosts (tests/testing/test_cluster.py): the checks of algo_check.py and
torch_optimizer.py, cut to what a change of transport (TCP between hosts, shared memory within) can break,
so that three cluster shapes stay within a few minutes.

    python cluster_check.py allreduce    every algorithm (and auto) x float32/float16/int32 x sum/max x
                                         sizes 0..1031 and 3 MiB, float32 also with fp16 on the wire;
                                         cma and (on uneven hosts) the default torus refuse clearly
    python cluster_check.py torch        DistributedOptimizer equals one process on the combined batch
    python cluster_check.py reinit [N]   N init/allreduce/shutdown cycles in a row

The node layout comes from MPI (Topology.detect without COMMLIB_LOCAL_SIZE). Each is one case
(tests/spmd.py; CASES below), after on_cluster.py's node_layout.
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

import spmd
from spmd import expect_error, import_worker

#: argv[1] -> the case it runs
CASES = {"allreduce": "every_algorithm_across_hosts", "torch": "torch_optimizer_matches_one_process",
         "reinit": "init_after_shutdown_cycles"}


def check_bulk(comm, topology) -> None:
    """Allreduces across hosts large enough that the engine's waits are patient (engine.PATIENT_BYTES):
    one buffer and two reduced together, every rank's own values, against numpy."""
    from commlib.config import Config
    from commlib.engine import PATIENT_BYTES, Engine
    from commlib.transport.mpi import MPITransport

    engine = Engine(MPITransport.duplicate(comm), topology, Config.load({}))
    n = PATIENT_BYTES // 4 + 5
    everyone = [np.random.default_rng(r).standard_normal(n).astype(np.float32) for r in range(comm.size)]
    expected = np.sum(everyone, axis=0, dtype=np.float64)
    for algorithm in ("ring", "hierarchical_pipelined", "native"):
        assert engine._bulk(n * 4)
        buf = everyone[comm.rank].copy()
        engine.allreduce_(buf, algorithm=algorithm, name=f"bulk {algorithm}")
        np.testing.assert_allclose(buf, expected, rtol=1e-5, atol=1e-4, err_msg=algorithm)
        first, second = everyone[comm.rank][:n // 3].copy(), everyone[comm.rank][n // 3:].copy()
        engine.allreduce_many_([first, second], algorithm=algorithm, name=f"bulk many {algorithm}")
        np.testing.assert_allclose(np.concatenate([first, second]), expected, rtol=1e-5, atol=1e-4,
                                   err_msg=f"{algorithm}, two buffers")
    engine.close()


@spmd.case
def every_algorithm_across_hosts() -> None:
    Checker = import_worker("algo_check").Checker

    from commlib.algorithms import ALGORITHMS, AlgorithmContext, run_allreduce
    from commlib.compression import Compression
    from commlib.config import Config
    from commlib.dtypes import FLOAT16
    from commlib.errors import CommlibError, ConfigError
    from commlib.ops import ReduceOp
    from commlib.topology import Topology
    from commlib.transport.mpi import MPITransport

    comm = MPI.COMM_WORLD
    p = comm.size
    topology = Topology.detect(comm)
    assert topology.cross_size > 1, f"expected several hosts, MPI sees {topology}"
    check = Checker(comm)

    def context(**settings):
        config = Config.load({}, **settings)
        return AlgorithmContext.create(MPITransport.duplicate(comm), topology, config)

    small = context(ring_segment_bytes=1024, small_message_bytes=256)
    large = context(ring_segment_bytes=256 << 10)
    assert small.peer_memory is None and "nodes" in small.peer_memory_reason, small.peer_memory_reason
    algorithms = ["auto"] + [a for a in ALGORITHMS if a not in ("cma", "ps")]  # ps needs servers: tests/server/test_server.py
    if not topology.uniform:
        algorithms.remove("torus2d")
    sizes = sorted({0, 1, max(p - 1, 0), p + 1, 13, 1031})
    f32, i32 = np.dtype(np.float32), np.dtype(np.int32)
    case = 0
    for algorithm in algorithms:
        for dtype in (f32, FLOAT16, i32):
            for op in (ReduceOp.SUM, ReduceOp.MAX):
                for n in sizes:
                    case += 1
                    check.allreduce(small, algorithm, dtype, op, n, case)
        if algorithm != "native":
            for n in sizes:
                case += 1
                check.allreduce(small, algorithm, f32, ReduceOp.SUM, n, case, Compression.fp16)
        big = 3 * (1 << 18) + 13
        for codec in (None, Compression.fp16) if algorithm != "native" else (None,):
            case += 1
            check.allreduce(large, algorithm, f32, ReduceOp.SUM, big, case, codec)

    check_bulk(comm, topology)
    ones = np.ones(8, np.float32)
    expect_error(CommlibError, "nodes", lambda: run_allreduce(small, ones, ReduceOp.SUM, "cma"), "cma across hosts")
    if not topology.uniform:
        expect_error(ConfigError, "COMMLIB_TORUS_SHAPE", lambda: run_allreduce(small, ones, ReduceOp.SUM, "torus2d"),
                     "default torus on uneven hosts")
    for ctx in (small, large):
        ctx.close()
        ctx.transport.free()
    if comm.rank == 0:
        print(f"{check.checks} checks per rank of {algorithms} on {p} ranks, {topology}", flush=True)


@spmd.case
def torch_optimizer_matches_one_process() -> None:
    import commlib.torch as hvd
    check_equivalence = import_worker("torch_optimizer").check_equivalence

    hvd.init()
    assert hvd.cross_size() > 1, f"expected several hosts, commlib sees {hvd.cross_size()}"
    check_equivalence(hvd.rank(), hvd.size())
    hvd.shutdown()


@spmd.case
def init_after_shutdown_cycles() -> None:
    """init/shutdown cycles back to back: a message of one cycle must never reach the next (MPI
    recycles a freed communicator's context id, so a message still in flight when it is freed would)."""
    import commlib as cl

    for cycle in range(int(sys.argv[2]) if len(sys.argv) > 2 else 20):
        cl.init()
        got = cl.allreduce(np.full(4, cl.rank() + cycle, np.float32), op=cl.Sum, name=f"cycle{cycle}")
        want = sum(r + cycle for r in range(cl.size()))
        assert np.all(got == want), (cycle, got, want)
        cl.shutdown()


if __name__ == "__main__":
    spmd.main([CASES[sys.argv[1]]])
