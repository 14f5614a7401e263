"""A rank that never calls add_process_set: the others' add fails within commlib's deadline, naming it.

    COMMLIB_TIMEOUT=1 mpiexec -n 2 python process_set_absent.py

Rank 0 adds a set; rank 1 never does (it sleeps past rank 0's error, then leaves). Rank 0's add must raise
PeerLostError naming rank 1 after about the timeout, not wait for ever. After a lost peer a process ends
the job at exit (docs/failures.md), so the job fails once rank 0 has reported its case.
"""

import time

import commlib as cl
from commlib.errors import PeerLostError
import spmd

RANK, SIZE = spmd.rank_and_size()
TIMEOUT_S = 1.0


@spmd.case
def init():
    cl.init()


@spmd.case
def the_set_is_not_agreed_and_the_absent_rank_is_named():
    if RANK != 0:
        time.sleep(TIMEOUT_S + 5)  # rank 0 reports first: its exit then ends the job
        return
    start = time.monotonic()
    try:
        cl.add_process_set([0])
    except PeerLostError as exc:
        waited = time.monotonic() - start
        assert "add_process_set" in str(exc) and exc.ranks == (1,), (exc.ranks, exc)
        assert TIMEOUT_S <= waited < TIMEOUT_S + 30, waited
    else:
        raise AssertionError("add_process_set returned without rank 1")


if __name__ == "__main__":
    spmd.main()
