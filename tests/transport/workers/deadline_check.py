"""Worker for tests/transport/test_failures.py: the transport's deadline on one host, without a cluster.

Rank 0 waits (with a 1 s timeout) in a receive, an allreduce and a barrier that rank 1 never joins; each
must raise PeerLostError naming rank 1 within about a second, and, after the first, the next wait at once.
Rank 1 waits until rank 0 is done, then both leave without collective teardown (os._exit: the abandoned
requests stay behind), removing MPICH's shared-memory file first.
"""

import os
import sys
import time

import numpy as np
from mpi4py import MPI

from commlib.errors import PeerLostError
from commlib.ops import ReduceOp
from commlib.transport.deadline import Deadline, unlink_mapped_shared_memory
from commlib.transport.mpi import MPITransport

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
deadline = Deadline(1.0, comm.Get_group(), ["hostA", "hostB"])
transport = MPITransport.duplicate(comm, deadline=deadline)
transport.barrier()  # both ranks are here
if rank == 0:
    start = time.monotonic()
    try:
        transport.recv(np.empty(4, np.float32), 1)
    except PeerLostError as exc:
        took = time.monotonic() - start
        assert exc.ranks == (1,) and exc.what == "a receive", (exc.ranks, exc.what)
        assert "rank 1 (host hostB)" in str(exc) and "COMMLIB_TIMEOUT=1" in str(exc), str(exc)
        assert 1.0 <= took < 3.0, took
        print(f"receive timed out after {took:.2f} s: {exc}", flush=True)
    else:
        raise AssertionError("the receive returned")
    for name, call in (("allreduce", lambda: transport.allreduce_native_(np.ones(4, np.float32), ReduceOp.SUM)),
                       ("barrier", transport.barrier)):
        start = time.monotonic()
        try:
            call()
        except PeerLostError as exc:
            assert time.monotonic() - start < 0.5 and exc.ranks == (1,), (name, exc.ranks)
        else:
            raise AssertionError(f"{name} returned")
    comm.send("done", dest=1, tag=99)
    print("deadline_check OK", flush=True)
else:
    assert comm.recv(source=0, tag=99) == "done"
sys.stdout.flush()
comm.Barrier()  # on COMM_WORLD, which the abandoned requests do not use
unlink_mapped_shared_memory()  # os._exit skips MPI_Finalize, which would remove MPICH's node segment
os._exit(0)
