"""Settings every rank decides by itself (fusion, lanes, cache) must agree: when they differ, init raises
on every rank, naming the variable and each rank's value."""

import os

from mpi4py import MPI

from worker import expect_error, run


def main():
    rank = MPI.COMM_WORLD.Get_rank()
    import commlib as cl

    os.environ["COMMLIB_FUSION_THRESHOLD"] = "64M" if rank == 0 else "1M"
    expect_error(cl.ConfigError, "COMMLIB_FUSION_THRESHOLD must be the same on every rank (rank 0: 67108864, "
                 "rank 1: 1048576", cl.init, "mismatched fusion threshold")
    del os.environ["COMMLIB_FUSION_THRESHOLD"]
    cl.init()  # agreeing settings: fine
    assert cl.allreduce(MPI.COMM_WORLD.Get_rank() * 1.0 + 1.0, op=cl.Sum, name="ok") == 3.0
    cl.shutdown()
    print(f"rank {rank}: mismatch raised, then init worked", flush=True)


run(main)
