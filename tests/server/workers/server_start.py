"""A job whose last rank never starts commlib (it initialised MPI and hangs): init() must fail on every
worker once COMMLIB_START_TIMEOUT has passed, naming that rank. Named cases on every worker
(tests/spmd.py); then the workers end the job, which cannot go on without that rank."""

import time

from mpi4py import MPI

import commlib as cl
import spmd

WORKERS = 2  # the ranks that run this script (the last rank of the job runs something else)


@spmd.case
def init_fails_naming_the_rank_that_never_started():
    start = time.monotonic()
    try:
        cl.init()
    except cl.CommlibError as exc:
        assert "did not start" in str(exc) and "COMMLIB_START_TIMEOUT" in str(exc), str(exc)
        print(f"start failed after {time.monotonic() - start:.1f} s: {exc}", flush=True)
    else:
        raise AssertionError("init() succeeded without the last rank")


if __name__ == "__main__":
    spmd.main()
    # every worker has reported before the job ends: a barrier of the workers alone (the last rank hangs)
    workers = MPI.COMM_WORLD.Create_group(MPI.COMM_WORLD.Get_group().Incl(list(range(WORKERS))))
    workers.Barrier()
    MPI.COMM_WORLD.Abort(3)
