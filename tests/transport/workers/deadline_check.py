"""Worker for tests/transport/test_failures.py: the transport's deadline on one host, without a cluster.

Rank 0 waits (with a 1 s timeout) in a receive that rank 1 never answers: it raises PeerLostError naming
rank 1 once the deadline has passed; then an allreduce and a barrier that rank 1 never joins raise the same
recorded error without waiting again. Rank 1 waits until rank 0 is done, then both leave without
collective teardown (os._exit: the abandoned requests stay behind), removing MPICH's shared-memory file
first. Named cases on both ranks (tests/spmd.py).
"""

import os
import sys
import time

import numpy as np
from mpi4py import MPI

import spmd
from commlib.errors import PeerLostError
from commlib.ops import ReduceOp
from commlib.transport.deadline import Deadline, unlink_mapped_shared_memory
from commlib.transport.mpi import MPITransport

#: far above the timeout (1 s) and its grace (a quarter of it) on any load: the bound is the feature here
#: (a silent peer is reported, not waited for forever), not how promptly a loaded machine reports it
REPORTED_WITHIN_S = 30.0

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
deadline = Deadline(1.0, comm.Get_group(), ["hostA", "hostB"])
transport = MPITransport.duplicate(comm, deadline=deadline)
first: list = []  # the error of the first wait


@spmd.case
def both_ranks_start():
    transport.barrier()


@spmd.case
def a_wait_for_a_silent_rank_raises_once_the_deadline_passed():
    if rank != 0:
        return  # rank 1 is the silent one
    start = time.monotonic()
    try:
        transport.recv(np.empty(4, np.float32), 1)
    except PeerLostError as exc:
        took = time.monotonic() - start
        assert exc.ranks == (1,) and exc.what == "a receive", (exc.ranks, exc.what)
        assert "rank 1 (host hostB)" in str(exc) and "COMMLIB_TIMEOUT=1" in str(exc), str(exc)
        assert took >= 1.0, f"raised after {took:.2f} s, before the 1 s deadline"
        assert took < REPORTED_WITHIN_S, took
        print(f"receive timed out after {took:.2f} s: {exc}", flush=True)
        first.append(exc)
    else:
        raise AssertionError("the receive returned")


@spmd.case
def later_waits_raise_the_recorded_error_without_waiting():
    if rank != 0:
        return
    assert deadline.lost is first[0]
    for name, call in (("allreduce", lambda: transport.allreduce_native_(np.ones(4, np.float32), ReduceOp.SUM)),
                       ("barrier", transport.barrier)):
        try:
            call()
        except PeerLostError as exc:
            assert exc is first[0], f"{name} raised a new error (it waited again): {exc}"
        else:
            raise AssertionError(f"{name} returned")


@spmd.case
def rank_1_waits_for_rank_0():
    if rank == 0:
        comm.send("done", dest=1, tag=99)
    else:
        assert comm.recv(source=0, tag=99) == "done"


if __name__ == "__main__":
    spmd.main()
    sys.stdout.flush()
    comm.Barrier()  # on COMM_WORLD, which the abandoned requests do not use
    unlink_mapped_shared_memory()  # os._exit skips MPI_Finalize, which would remove MPICH's node segment
    os._exit(0)
