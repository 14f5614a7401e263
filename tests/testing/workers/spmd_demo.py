"""A worker for tests/testing/test_spmd.py: cases that pass, skip, fail on one rank or hang, chosen by argv
(comma-separated case names; default all)."""

import sys
import time

import spmd

rank, size = spmd.rank_and_size()


@spmd.case
def passes():
    assert sum(range(4)) == 6


@spmd.case
def skips_on_rank_0():
    if rank == 0:
        spmd.skip("this case does not apply to rank 0")


@spmd.case
def mpi_barrier():
    from mpi4py import MPI

    assert MPI.COMM_WORLD.Get_rank() == rank and MPI.COMM_WORLD.Get_size() == size
    MPI.COMM_WORLD.Barrier()


@spmd.case
def fails_on_the_last_rank():
    assert rank != size - 1, f"rank {rank} is the last"


@spmd.case
def hangs_on_rank_0():
    if rank == 0:
        time.sleep(600)


if __name__ == "__main__":
    spmd.main(sys.argv[1].split(",") if len(sys.argv) > 1 else None)
