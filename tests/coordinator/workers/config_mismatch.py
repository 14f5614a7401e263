"""Settings every rank decides by itself (fusion, lanes, cache) must agree: when they differ, init raises
on every rank, naming the variable and each rank's value. A setting that is invalid on one rank only
fails init there, and on every other rank with an error naming that rank (never a hang); so does a rank
that does not call init() again."""

import os

from mpi4py import MPI

import commlib as cl
import spmd
from spmd import expect_error

rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
last = size - 1


@spmd.case
def differing_fusion_thresholds_fail_init_on_every_rank():
    os.environ["COMMLIB_FUSION_THRESHOLD"] = "64M" if rank == 0 else "1M"
    expect_error(cl.ConfigError, "COMMLIB_FUSION_THRESHOLD must be the same on every rank (rank 0: 67108864, "
                 "rank 1: 1048576", cl.init, "mismatched fusion threshold")
    del os.environ["COMMLIB_FUSION_THRESHOLD"]


@spmd.case
def a_setting_invalid_on_one_rank_fails_init_on_every_rank():
    if rank == last:
        os.environ["COMMLIB_ALGORITHM"] = "fastest"
        expect_error(cl.ConfigError, "unknown algorithm 'fastest'", cl.init, "invalid setting here")
        del os.environ["COMMLIB_ALGORITHM"]
    else:
        expect_error(cl.ConfigError, f"failed on another rank (rank {last}: COMMLIB_ALGORITHM='fastest' is invalid",
                     cl.init, "invalid setting on another rank")


@spmd.case
def then_agreeing_settings_init():
    cl.init()
    assert cl.allreduce(rank * 1.0 + 1.0, op=cl.Sum, name="ok") == size * (size + 1) / 2
    cl.shutdown()


@spmd.case
def init_again_without_one_rank_fails_naming_it():
    # the layout is known from the cases above: a rank that never calls init() again must not hold the
    # others in MPI; they fail within the start deadline, naming it
    if rank != last:
        os.environ["COMMLIB_START_TIMEOUT"] = "2"
        expect_error(cl.CommlibError, f"rank {last} did not call commlib.init() again within 2 s",
                     cl.init, "init without the last rank")
        del os.environ["COMMLIB_START_TIMEOUT"]
    MPI.COMM_WORLD.Barrier()  # the last case: the job then ends, as it must once a rank has gone its way


if __name__ == "__main__":
    spmd.main()
