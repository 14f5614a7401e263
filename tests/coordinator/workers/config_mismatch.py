"""Settings every rank decides by itself (fusion, lanes, cache) must agree: when they differ, init raises
on every rank, naming the variable and each rank's value. A setting that is invalid on one rank only
fails init there, and on every other rank with an error naming that rank (never a hang)."""

import os

from mpi4py import MPI

from spmd import expect_error, run


def main():
    rank = MPI.COMM_WORLD.Get_rank()
    import commlib as cl

    os.environ["COMMLIB_FUSION_THRESHOLD"] = "64M" if rank == 0 else "1M"
    expect_error(cl.ConfigError, "COMMLIB_FUSION_THRESHOLD must be the same on every rank (rank 0: 67108864, "
                 "rank 1: 1048576", cl.init, "mismatched fusion threshold")
    del os.environ["COMMLIB_FUSION_THRESHOLD"]
    last = MPI.COMM_WORLD.Get_size() - 1
    if rank == last:
        os.environ["COMMLIB_ALGORITHM"] = "fastest"
        expect_error(cl.ConfigError, "unknown algorithm 'fastest'", cl.init, "invalid setting here")
        del os.environ["COMMLIB_ALGORITHM"]
    else:
        expect_error(cl.ConfigError, f"failed on another rank (rank {last}: COMMLIB_ALGORITHM='fastest' is invalid",
                     cl.init, "invalid setting on another rank")
    cl.init()  # agreeing settings: fine
    size = MPI.COMM_WORLD.Get_size()
    assert cl.allreduce(rank * 1.0 + 1.0, op=cl.Sum, name="ok") == size * (size + 1) / 2
    cl.shutdown()
    print(f"rank {rank}: mismatch raised, then init worked", flush=True)


run(main)
