"""Process sets on 1-4 ranks: every collective inside a set against numpy, sets running side by side with
the world, the set's own node layout, and the errors (a rank outside the set, ranks that differ, removal).
"""

import numpy as np

import commlib as cl
import spmd
from commlib import api

rank, size = spmd.rank_and_size()
world = evens = odds = mine = others = again = None
n = me = 0
ranks: list = []


def expect(exc_type, fn, *needles):
    try:
        fn()
    except exc_type as exc:
        missing = [n for n in needles if n not in str(exc)]
        assert not missing, f"rank {rank}: error lacks {missing}: {exc}"
        return
    raise AssertionError(f"rank {rank}: no {exc_type.__name__} raised")


@spmd.case
def init():
    global world
    cl.init()
    world = cl.global_process_set
    assert world.process_set_id == 0 and world.ranks == list(range(size)) and world.size() == size
    assert world.rank() == rank and world.included()


@spmd.case
def a_duplicate_of_the_world_is_refused():
    # one rank: the only possible set is the world's: a duplicate, as in Horovod
    expect(ValueError, lambda: cl.add_process_set([0]), "duplicate")


@spmd.case
def sets_beside_the_world():
    global evens, odds, mine, others, n, ranks, me
    evens = cl.add_process_set([r for r in range(size) if r % 2 == 0])
    odds = cl.add_process_set(cl.ProcessSet([r for r in range(size) if r % 2 == 1]))
    mine = evens if rank % 2 == 0 else odds
    others = odds if rank % 2 == 0 else evens
    assert evens.process_set_id == 1 and odds.process_set_id == 2
    assert mine.included() and mine.size() == len(mine.ranks) and mine.rank() == mine.ranks.index(rank)
    assert others.included() is False and others.rank() == -1

    n = mine.size()
    ranks = mine.ranks
    me = mine.rank()


@spmd.case
def allreduce_inside_a_set():
    for dtype in (np.float32, np.float64, np.int32, np.int64, np.float16):
        x = np.arange(7, dtype=dtype) + rank
        want = sum(np.arange(7, dtype=np.float64) + r for r in ranks)
        got = cl.allreduce(x, op=cl.Sum, name=f"sum.{np.dtype(dtype).name}", process_set=mine)
        assert np.array_equal(got.astype(np.float64), want), (dtype, got, want)
        if np.dtype(dtype).kind == "f":
            got = cl.allreduce(x, name=f"avg.{np.dtype(dtype).name}", process_set=mine)
            assert np.allclose(got.astype(np.float64), want / n), (dtype, got)


@spmd.case
def unnamed_tensors_are_counted_per_set():
    # unnamed tensors are counted per set: interleave world and set calls, different numbers per set
    for i in range(3 + rank % 2):
        assert np.all(cl.allreduce(np.ones(3), op=cl.Sum, process_set=mine) == n)
    assert np.all(cl.allreduce(np.ones(3), op=cl.Sum) == size)


@spmd.case
def fusion_inside_a_set():
    # fusion inside the set: many small asynchronous allreduces at once
    handles = [cl.allreduce_async(np.full(5, rank + i, np.float32), op=cl.Sum, name=f"f{i}", process_set=mine)
               for i in range(20)]
    for i, h in enumerate(handles):
        assert np.all(cl.synchronize(h) == sum(r + i for r in ranks))
    got = cl.grouped_allreduce([np.full(3, rank, np.float64), np.full(2, 1.0)], op=cl.Sum, process_set=mine)
    assert np.all(got[0] == sum(ranks)) and np.all(got[1] == n)


@spmd.case
def allgather():
    # allgather: rows differ per rank; result in set-rank order
    got = cl.allgather(np.full((rank + 1, 2), rank, np.int64), process_set=mine)
    assert np.array_equal(got, np.concatenate([np.full((r + 1, 2), r, np.int64) for r in ranks]))


@spmd.case
def broadcast():
    # broadcast: the root is a world rank
    for root in ranks:
        got = cl.broadcast(np.full(4, rank, np.int32), root_rank=root, process_set=mine)
        assert np.all(got == root)
    expect(cl.CommlibError, lambda: cl.broadcast(np.zeros(2), root_rank=others.ranks[0], name="badroot",
                                                process_set=mine), "root_rank", "not in process set")


@spmd.case
def reducescatter():
    # reducescatter over the set's ranks (earlier ranks take the extra rows)
    rows = 2 * n + 1
    x = np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) * (rank + 1)
    total = np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) * sum(r + 1 for r in ranks)
    bounds = np.cumsum([0] + [rows // n + (1 if i < rows % n else 0) for i in range(n)])
    got = cl.reducescatter(x, op=cl.Sum, process_set=mine)
    assert np.array_equal(got, total[bounds[me]:bounds[me + 1]]), got


@spmd.case
def alltoall():
    # alltoall: splits per set rank
    x = np.repeat(np.arange(n, dtype=np.float32)[:, None], 2, axis=1) + 10 * rank
    out, received = cl.alltoall(x, splits=[1] * n, process_set=mine)
    assert np.array_equal(received, [1] * n)
    assert np.array_equal(out[:, 0], [10 * r + me for r in ranks])
    expect(cl.CommlibError, lambda: cl.alltoall(x, splits=[1] * (n + 1), name="badsplits", process_set=mine), "splits")


@spmd.case
def barrier_and_objects():
    cl.barrier(process_set=mine)
    assert cl.broadcast_object({"r": rank} if rank == ranks[-1] else None, root_rank=ranks[-1],
                               process_set=mine) == {"r": ranks[-1]}
    assert cl.allgather_object(rank, process_set=mine) == ranks


@spmd.case
def join_inside_a_set():
    # join inside the set: the last set rank to join, as a world rank
    for batch in range(me + 1):
        got = cl.allreduce(np.ones(2, np.float32), op=cl.Sum, name=f"join.{batch}", process_set=mine)
        assert np.all(got == sum(1 for i in range(n) if i + 1 > batch))
    assert cl.join(process_set=mine) == ranks[-1]


@spmd.case
def a_sets_node_layout_comes_from_the_worlds():
    # the set's node layout comes from the world's (COMMLIB_LOCAL_SIZE=2 on 4 ranks: nodes {0,1} and {2,3})
    member = api._rt().sets.member(mine)
    world_nodes = api._rt().topology.node_of_rank
    assert member.topology.size == n
    assert member.topology.cross_size == len({world_nodes[r] for r in ranks}), member.topology


@spmd.case
def errors():
    # errors
    if n >= 2:  # a mismatch inside a set names world ranks
        expect(cl.CommlibError, lambda: cl.allreduce(np.zeros(2 + me), name="mismatch", process_set=mine),
               "'mismatch'", f"rank {ranks[0]}: (2,)", f"rank {ranks[1]}: (3,)")
    expect(cl.ProcessSetError, lambda: cl.allreduce(np.ones(2), name="outside", process_set=others),
           "not in process set", str(others.process_set_id))
    expect(ValueError, lambda: cl.add_process_set(list(evens.ranks)), "duplicate")
    expect(cl.ProcessSetError, lambda: cl.add_process_set([0] if rank == 0 else list(range(size))),
           "different ranks", "rank 0: [0]")


@spmd.case
def removal_and_ids_used_again():
    global again
    assert cl.remove_process_set(world) is False
    if size == 4:
        both = cl.add_process_set([size - 1, 0])   # any order: sorted
        assert both.ranks == [0, size - 1] and both.process_set_id == 3
        if both.included():
            assert np.all(cl.allreduce(np.ones(1), op=cl.Sum, process_set=both) == both.size())
        assert cl.remove_process_set(both) is True
        assert both.process_set_id is None and both.size() is None
    if size >= 3:  # a set from an mpi4py communicator (ranks outside it pass MPI.COMM_NULL)
        from mpi4py import MPI

        sub = MPI.COMM_WORLD.Split(0 if rank < 2 else MPI.UNDEFINED, rank)
        pair = cl.add_process_set(cl.ProcessSet(sub))
        assert pair.ranks == [0, 1] and pair.included() == (rank < 2), pair
        if rank < 2:
            assert np.all(cl.allreduce(np.ones(2), op=cl.Sum, process_set=pair) == 2)
            sub.Free()
        assert cl.remove_process_set(pair)
    assert cl.remove_process_set(evens) is True
    expect(cl.ProcessSetError, lambda: cl.allreduce(np.ones(2), name="removed", process_set=evens), "not registered")
    assert cl.remove_process_set(evens) is False
    again = cl.add_process_set(range(0, size, 2))
    assert again.process_set_id == 1   # the smallest free id
    if again.included():
        assert np.all(cl.allreduce(np.ones(2), op=cl.Sum, process_set=again) == again.size())
    assert np.all(cl.allreduce(np.ones(2), op=cl.Sum, name="world.end") == size)


@spmd.case
def shutdown_unregisters_the_sets():
    cl.shutdown()
    if again is not None:  # registered in removal_and_ids_used_again (not run on one rank)
        assert again.process_set_id is None


@spmd.case
def init_registers_process_sets_at_once():
    # init(process_sets=...) registers them at once
    first = cl.ProcessSet([0])
    cl.init(process_sets=[first])
    assert first.process_set_id == 1 and first.included() == (rank == 0)
    if rank == 0:
        assert np.all(cl.allreduce(np.ones(2), op=cl.Sum, process_set=first) == 1)
    cl.shutdown()


if __name__ == "__main__":
    if size == 1:  # the world's set is the only one there can be
        spmd.main(["init", "a_duplicate_of_the_world_is_refused", "shutdown_unregisters_the_sets"])
    else:
        spmd.main([name for name in spmd.names() if name != "a_duplicate_of_the_world_is_refused"])
