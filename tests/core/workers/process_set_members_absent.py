"""A member that never calls add_process_set(members_only=True): the others' add fails within commlib's
deadline, naming it.

    COMMLIB_TIMEOUT=1 mpiexec -n 3 python process_set_members_absent.py

Ranks 0 and 1 add the members-only set [0, 1, 2]; rank 2 never does (it sleeps past their error, then
leaves). Their add must raise PeerLostError naming rank 2 after about the timeout, not wait for ever. After a
lost peer a process ends the job at exit (docs/failures.md), so the job fails once ranks 0 and 1 have
reported their case.
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
def the_set_is_not_agreed_and_the_absent_member_is_named():
    if RANK == 2:
        time.sleep(TIMEOUT_S + 8)  # the others report first: their exit then ends the job
        return
    start = time.monotonic()
    try:
        cl.add_process_set([0, 1, 2], members_only=True)
    except PeerLostError as exc:
        waited = time.monotonic() - start
        # its own timeout names the agreement; the other member's notice, if it comes first, names rank 2 too
        assert exc.ranks == (2,) and ("members_only" in str(exc) or "gave up" in str(exc)), (exc.ranks, exc)
        assert TIMEOUT_S <= waited < TIMEOUT_S + 30, waited
    else:
        raise AssertionError("add_process_set returned without rank 2")


if __name__ == "__main__":
    spmd.main()
