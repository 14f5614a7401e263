"""Worker: the cma allreduce when cross-memory attach fails on one rank only.

Rank 1 is handed a process id that does not exist (as if its peer had died), so the kernel refuses its
copies; every rank must raise a CommlibError naming the failing rank, promptly, and the engine must keep
working afterwards. Also checks the probe's verdict and that COMMLIB_CMA=0 keeps auto off cma.
"""

from __future__ import annotations

import os

import numpy as np
from mpi4py import MPI

from commlib.algorithms import select
from commlib.compression import Compression
from commlib.config import Config
from commlib.engine import Engine
from commlib.errors import CommlibError
from commlib.ops import ReduceOp
from commlib.topology import Topology
from commlib.transport.mpi import MPITransport
from commlib.transport.peer_memory import PeerMemory
import spmd


comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
engine: Engine


@spmd.case
def the_probe_says_what_the_kernel_allows():
    global engine
    engine = Engine(MPITransport(comm.Dup()), Topology.detect(comm), Config.load())
    if os.environ["CMA_EXPECTED"] != "1":  # the kernel refuses: commlib must have found out, and say why
        reason = engine.context.peer_memory_reason
        assert engine.context.peer_memory is None and "cannot read" in reason, reason
        assert select.choose(engine.context, 1 << 20).algorithm != "cma"
        return
    assert engine.context.peer_memory is not None, engine.context.peer_memory_reason
    assert select.choose(engine.context, 1 << 20).algorithm == "cma"
    assert select.choose(engine.context, 1 << 20, Compression.fp16).algorithm == "cma"
    buf = np.ones(1 << 16, np.float32)
    engine.allreduce_(buf, ReduceOp.SUM, algorithm="cma")
    assert np.all(buf == size), buf[:4]


def needs_cma():
    if engine.context.peer_memory is None:
        spmd.skip("cross-memory attach is refused here (checked by the_probe_says_what_the_kernel_allows)")


@spmd.case
def a_failed_copy_on_rank_1_raises_on_every_rank():
    needs_cma()
    peers = engine.context.peer_memory
    if rank == 1:  # a dead peer: no process has this id (pid_max is at most 2**22)
        engine.context.peer_memory = PeerMemory([1 << 30] * size, rank)
    try:
        engine.allreduce_(np.ones(1 << 16, np.float32), ReduceOp.SUM, algorithm="cma")
    except CommlibError as exc:
        text = str(exc)
        assert "cma allreduce failed" in text and ("on rank 1" in text or "on this rank" in text), text
        if rank == 1:
            assert "No such process" in text, text
    else:
        raise AssertionError(f"rank {rank}: a failed cross-memory copy on rank 1 raised nothing")
    engine.context.peer_memory = peers


@spmd.case
def the_engine_keeps_working():
    needs_cma()
    buf = np.full(5, 2.0, np.float32)
    engine.allreduce_(buf, ReduceOp.SUM, algorithm="cma")
    assert np.all(buf == 2.0 * size), buf


@spmd.case
def commlib_cma_0_keeps_auto_off_cma():
    needs_cma()
    off = Engine(MPITransport(comm.Dup()), Topology.detect(comm), Config.load(cma=False))
    assert off.context.peer_memory is None and "COMMLIB_CMA=0" in off.context.peer_memory_reason
    assert select.choose(off.context, 64 << 20).algorithm != "cma"
    off.close()


@spmd.case
def close():
    engine.close()


if __name__ == "__main__":
    spmd.main()
