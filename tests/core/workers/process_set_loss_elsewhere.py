"""A peer lost in one process set ends this rank's waits in every other set, naming it.

    COMMLIB_TIMEOUT=1 mpiexec -n 3 python process_set_loss_elsewhere.py FOLDER

Ranks 0 and 1 share a set. Rank 2 freezes (SIGSTOP). Rank 0 waits in the pair's set for rank 1; rank 1
meanwhile runs a world allreduce, which needs rank 2, and fails there with PeerLostError naming it.
Rank 1 then stays alive until rank 0 has reported (a marker file in FOLDER): rank 0 must fail within the
deadline because rank 1 lost rank 2, not because rank 1 later exits. After a lost peer a process ends the
job at exit (docs/failures.md), so the job fails once ranks 0 and 1 have reported their case.
"""

import os
import signal
import sys
import time

import numpy as np

import commlib as cl
from commlib.errors import PeerLostError
import spmd

RANK, SIZE = spmd.rank_and_size()
TIMEOUT_S = 1.0
FROZEN = 2
FOLDER = sys.argv[1] if len(sys.argv) > 1 else "."
REPORTED = os.path.join(FOLDER, "rank0.reported")
pair = None


@spmd.case
def init():
    global pair
    assert SIZE == 3, "run on 3 ranks"
    cl.init()
    pair = cl.add_process_set([0, 1])
    assert cl.allreduce(np.ones(4), op=cl.Sum, name="warm.world")[0] == SIZE
    if RANK in pair.ranks:
        assert cl.allreduce(np.ones(4), op=cl.Sum, name="warm.pair", process_set=pair)[0] == 2


def _expect_loss_of_frozen(call, within_s: float) -> None:
    start = time.monotonic()
    try:
        call()
    except PeerLostError as exc:
        waited = time.monotonic() - start
        assert FROZEN in exc.ranks, (exc.ranks, str(exc))
        assert waited < within_s, (waited, str(exc))
    else:
        raise AssertionError(f"rank {RANK}: the call returned although rank {FROZEN} is frozen")


@spmd.case
def a_loss_in_the_world_fails_the_wait_in_the_pair():
    if RANK == FROZEN:
        os.kill(os.getpid(), signal.SIGSTOP)  # the others' exit ends the job (mpiexec kills this process)
        return
    if RANK == 0:  # waits in the pair's set for rank 1, which never comes: it is lost in the world's
        try:
            _expect_loss_of_frozen(lambda: cl.allreduce(np.ones(4), name="pair", process_set=pair),
                                   TIMEOUT_S + 25)
        finally:
            with open(REPORTED, "w"):
                pass
        return
    time.sleep(0.5)  # rank 0 waits in the pair's set by now, and rank 2 is stopped
    _expect_loss_of_frozen(lambda: cl.allreduce(np.ones(4), name="world"), TIMEOUT_S + 25)
    deadline = time.monotonic() + 60  # alive (and not shut down) until rank 0 has its verdict
    while not os.path.exists(REPORTED) and time.monotonic() < deadline:
        time.sleep(0.05)


if __name__ == "__main__":
    spmd.main()
