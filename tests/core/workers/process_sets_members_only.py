"""Members-only process sets on 4 ranks: sets registered by their own ranks while the others do something
else, collectives on them against numpy, ids apart from the world's, removal by the members, and shutdown
with such sets still registered.

    mpiexec -n 4 python process_sets_members_only.py
"""

import time

import numpy as np

import commlib as cl
import spmd
from commlib.errors import ProcessSetError
from commlib.process_sets import MEMBERS_ONLY_IDS

rank, size = spmd.rank_and_size()
pairs = trio = cross = None


def data(r: int) -> np.ndarray:
    return np.arange(6, dtype=np.float32) * (r + 1) + r


def check_collectives(ps) -> None:
    """allreduce, broadcast and allgather on ``ps`` equal numpy's over its ranks."""
    assert ps.included() and ps.members_only and ps.process_set_id >= MEMBERS_ONLY_IDS, ps
    got = cl.allreduce(data(rank), op=cl.Sum, process_set=ps)
    assert np.allclose(got, sum(data(r) for r in ps.ranks)), (rank, ps, got)
    root = ps.ranks[-1]
    got = cl.broadcast(data(rank), root_rank=root, process_set=ps)
    assert np.array_equal(got, data(root)), (rank, ps, got)
    got = cl.allgather(data(rank).reshape(2, 3), process_set=ps)
    assert np.array_equal(got, np.concatenate([data(r).reshape(2, 3) for r in ps.ranks])), (rank, ps, got)


@spmd.case
def init():
    assert size == 4, "run on 4 ranks"
    cl.init()


@spmd.case
def two_disjoint_sets_each_made_by_its_members():
    global pairs
    mine = [0, 1] if rank < 2 else [2, 3]
    if rank >= 2:
        time.sleep(0.5)  # the pairs register at different times: neither waits for the other
    pairs = cl.add_process_set(mine, members_only=True)
    assert pairs.ranks == mine and pairs.rank() == mine.index(rank)
    check_collectives(pairs)


@spmd.case
def a_set_made_while_the_others_run_collectives_of_the_world_set():
    global trio
    if rank < 3:
        trio = cl.add_process_set([0, 1, 2], members_only=True)
        check_collectives(trio)
        assert trio.process_set_id != pairs.process_set_id
    got = cl.allreduce(np.full(3, rank, np.float64), op=cl.Sum)  # rank 3 waits here for the others
    assert np.all(got == sum(range(size))), got


@spmd.case
def overlapping_sets_have_different_ids_on_their_common_rank():
    global cross
    if rank in (1, 3):
        cross = cl.add_process_set([1, 3], members_only=True)
        check_collectives(cross)
        ids = {cross.process_set_id, pairs.process_set_id} | ({trio.process_set_id} if trio else set())
        assert len(ids) == (3 if trio else 2), ids


@spmd.case
def world_sets_keep_their_ids_and_run_beside_members_only_ones():
    world_set = cl.add_process_set([1, 2, 3])  # every rank: its id is the world's smallest free one
    assert world_set.process_set_id == 1 and not world_set.members_only, world_set
    if world_set.included():
        got = cl.allreduce(np.ones(4), op=cl.Sum, process_set=world_set)
        assert np.all(got == 3), got
    check_collectives(pairs)
    assert cl.remove_process_set(world_set)


@spmd.case
def a_rank_outside_the_set_cannot_add_it_members_only():
    try:
        cl.add_process_set([r for r in range(size) if r != rank], members_only=True)
    except ProcessSetError as exc:
        assert "members_only" in str(exc) and "not in" in str(exc), exc
    else:
        raise AssertionError("accepted a rank outside the set")


@spmd.case
def the_members_remove_their_set_alone():
    if rank < 2:
        assert cl.remove_process_set(pairs)
        assert pairs.process_set_id is None
        again = cl.add_process_set([0, 1], members_only=True)
        check_collectives(again)
    got = cl.allreduce(np.ones(2), op=cl.Sum)
    assert np.all(got == size), got


@spmd.case
def shutdown_with_members_only_sets_registered():
    cl.shutdown()


if __name__ == "__main__":
    spmd.main()
