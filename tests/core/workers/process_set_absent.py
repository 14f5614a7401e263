"""A rank that never calls add_process_set: the others' add fails within commlib's deadline, naming it.

    COMMLIB_TIMEOUT=1 mpiexec -n 2 python process_set_absent.py                 # a world-wide set, [0]
    COMMLIB_TIMEOUT=1 mpiexec -n 3 python process_set_absent.py members_only    # a members-only set, [0, 1, 2]

The last rank never calls add_process_set (it sleeps past the others' error, then leaves); the others add
the set. Their add must raise PeerLostError naming the last rank after about the timeout, not wait for ever.
After a lost peer a process ends the job at exit (docs/failures.md), so the job fails once the others have
reported their case.
"""

import sys
import time

import commlib as cl
from commlib.errors import PeerLostError
import spmd

RANK, SIZE = spmd.rank_and_size()
TIMEOUT_S = 1.0
MEMBERS_ONLY = sys.argv[1:] == ["members_only"]
ABSENT = SIZE - 1


@spmd.case
def init():
    cl.init()


@spmd.case
def the_set_is_not_agreed_and_the_absent_rank_is_named():
    if RANK == ABSENT:
        time.sleep(TIMEOUT_S + 8)  # the others report first: their exit then ends the job
        return
    start = time.monotonic()
    try:
        cl.add_process_set(list(range(SIZE)) if MEMBERS_ONLY else [0], members_only=MEMBERS_ONLY)
    except PeerLostError as exc:
        waited = time.monotonic() - start
        # its own timeout names the agreement; another member's notice, if it comes first, names the rank too
        assert exc.ranks == (ABSENT,) and ("add_process_set" in str(exc) or "gave up" in str(exc)), (exc.ranks, exc)
        assert TIMEOUT_S <= waited < TIMEOUT_S + 30, waited
    else:
        raise AssertionError(f"add_process_set returned without rank {ABSENT}")


if __name__ == "__main__":
    spmd.main()
