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
from spmd import run


def main() -> None:
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    engine = Engine(MPITransport(comm.Dup()), Topology.detect(comm), Config.load())
    peers = engine.context.peer_memory
    if os.environ["CMA_EXPECTED"] != "1":  # the kernel refuses: commlib must have found out, and say why
        assert peers is None and "cannot read" in engine.context.peer_memory_reason, engine.context.peer_memory_reason
        assert select.choose(engine.context, 1 << 20).algorithm != "cma"
        engine.close()
        print(f"rank {rank}: cma unavailable here, as the kernel says; cma failure checks OK", flush=True)
        return
    assert peers is not None, engine.context.peer_memory_reason
    assert select.choose(engine.context, 1 << 20).algorithm == "cma"
    assert select.choose(engine.context, 1 << 20, Compression.fp16).algorithm == "cma"

    buf = np.ones(1 << 16, np.float32)
    engine.allreduce_(buf, ReduceOp.SUM, algorithm="cma")
    assert np.all(buf == size), buf[:4]

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
    buf = np.full(5, 2.0, np.float32)
    engine.allreduce_(buf, ReduceOp.SUM, algorithm="cma")
    assert np.all(buf == 2.0 * size), buf

    off = Engine(MPITransport(comm.Dup()), Topology.detect(comm), Config.load(cma=False))
    assert off.context.peer_memory is None and "COMMLIB_CMA=0" in off.context.peer_memory_reason
    assert select.choose(off.context, 64 << 20).algorithm != "cma"
    off.close()
    engine.close()
    print(f"rank {rank}: cma failure checks OK", flush=True)


if __name__ == "__main__":
    run(main)
