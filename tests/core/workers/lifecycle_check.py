"""MPI worker for tests/core/test_lifecycle.py: what a Horovod user's script meets at init() and at exit.
Every check is a named case on every rank (tests/spmd.py); what happens at exit is printed as
``rank R: ...`` lines (os.write, so that they keep their order).

- ``mpi_not_initialized``: the script set ``mpi4py.rc.initialize = False``: init() initializes MPI with
  MPI_THREAD_MULTIPLE, the collectives run, and at exit commlib's exit hook and a handler the script
  registered after init() run before MPI is finalized, which then happens (MPI_Finalize deletes
  MPI_COMM_SELF's attributes: the delete callback reports it).
- ``elastic_settings DIR``: the elastic loop's settings come from the runtime (init(elastic_dir=...,
  elastic_in_process=True) with no COMMLIB_* variable set), also after the runtime is rebuilt over the
  survivors (here: all the ranks).
- ``duplicate_sets``: init(process_sets=[...]) with one set twice (the same ranks; the same communicator
  and its clone) raises ValueError on every rank and leaves commlib uninitialized; init() with a corrected
  list then works.
"""

import atexit
import os
import sys

import numpy as np

MODE = sys.argv[1]

if MODE == "mpi_not_initialized":
    import mpi4py

    mpi4py.rc.initialize = False

from mpi4py import MPI  # noqa: E402

import commlib as cl  # noqa: E402
import spmd  # noqa: E402

RANK = spmd.rank_and_size()[0]  # from the launcher: MPI may not be initialized yet


def say(rank: int, text: str) -> None:
    os.write(1, f"rank {rank}: {text}\n".encode())


@spmd.case
def initialized_with_thread_multiple():
    assert not MPI.Is_initialized(), "the script's mpi4py.rc.initialize = False did not hold"
    cl.init()
    assert_equal(MPI.Query_thread(), MPI.THREAD_MULTIPLE)
    assert_equal(cl.mpi_threads_supported(), True)


@spmd.case
def collectives_with_priority():
    rank, size = cl.rank(), cl.size()
    x = np.full(4, rank + 1, np.float32)
    assert np.array_equal(cl.allreduce(x, op=cl.Sum, name="a", priority=2), np.full(4, size * (size + 1) / 2))
    y = x.copy()
    cl.allreduce_(y, op=cl.Sum, name="b", priority=1)
    assert np.array_equal(y, np.full(4, size * (size + 1) / 2))
    both = cl.synchronize(cl.grouped_allreduce_async([x, x * 2], op=cl.Sum, name="c", priority=3))
    assert np.array_equal(both[1], 2 * both[0])


def exit_work() -> None:
    """What the exit lines report: the script's own exit handler, then MPI_Finalize."""
    rank = RANK

    def on_self_freed(comm, keyval, value):  # MPI_Finalize deletes MPI_COMM_SELF's attributes first
        say(rank, f"MPI finalized; commlib initialized then: {cl.is_initialized()}")
        return MPI.SUCCESS

    keyval = MPI.Comm.Create_keyval(delete_fn=on_self_freed)
    MPI.COMM_SELF.Set_attr(keyval, 1)

    def script_exit_work():
        say(rank, f"script's exit handler; MPI finalized then: {MPI.Is_finalized()}")

    atexit.register(script_exit_work)
    # exits without shutdown(): commlib's exit hook, the script's handler, then MPI_Finalize


def assert_equal(got, expected):
    assert got == expected, f"{got!r} != {expected!r}"


FIRST = None  # the set of rank 0, given twice, then in the corrected init()


def refused(sets, what):
    try:
        cl.init(process_sets=sets)
    except ValueError as exc:
        assert "duplicate" in str(exc).lower(), exc
    else:
        raise AssertionError(f"init() accepted {what}")
    assert not cl.is_initialized(), "commlib stayed initialized after the refused init()"
    assert all(s.process_set_id is None for s in sets), [s.process_set_id for s in sets]


@spmd.case
def same_ranks_twice():
    global FIRST
    FIRST = cl.ProcessSet([0])
    refused([FIRST, cl.ProcessSet([0])], "the same ranks twice")


@spmd.case
def communicator_and_its_clone():
    world = MPI.COMM_WORLD
    sub = world.Split(0 if world.Get_rank() == 0 else MPI.UNDEFINED, world.Get_rank())
    clone = sub.Dup() if sub != MPI.COMM_NULL else MPI.COMM_NULL
    refused([cl.ProcessSet(sub), cl.ProcessSet(clone)], "a communicator and its clone")


@spmd.case
def corrected_init_works():
    world = MPI.COMM_WORLD
    evens = cl.ProcessSet(range(0, world.Get_size(), 2))
    cl.init(process_sets=[FIRST, evens] if world.Get_size() > 2 else [FIRST])
    assert cl.is_initialized() and FIRST.process_set_id == 1, FIRST
    if FIRST.included():
        total = cl.allreduce(np.ones(3, np.float32), op=cl.Sum, name="x", process_set=FIRST)
        assert np.array_equal(total, np.ones(3)), total
    assert np.array_equal(cl.allreduce(np.ones(2), op=cl.Sum, name="w"), np.full(2, world.Get_size()))
    cl.shutdown()


@spmd.case
def environment_before_init():
    from commlib.elastic import control, recover

    assert_equal(control.directory(), None)
    assert_equal(recover.enabled(), False)


@spmd.case
def init_settings():
    from commlib.elastic import control, recover

    cl.init(elastic_dir=sys.argv[2], elastic_in_process=True)
    assert_equal(control.directory(), sys.argv[2])
    assert_equal(recover.enabled(), True)


@spmd.case
def between_loss_and_rebuild():
    from commlib import lifecycle
    from commlib.elastic import control

    lifecycle.abandon([])  # as recovery does, then over the survivors (every rank: none was lost)
    assert_equal(cl.is_initialized(), False)
    assert_equal(control.directory(), sys.argv[2])


@spmd.case
def rebuilt_runtime_keeps_init_settings():
    from commlib import lifecycle
    from commlib.elastic import control, recover

    lifecycle.rebuild(MPI.COMM_WORLD.Dup())
    assert cl.is_initialized() and cl.size() == MPI.COMM_WORLD.Get_size()
    assert_equal(control.directory(), sys.argv[2])
    assert_equal(recover.enabled(), True)
    assert np.array_equal(cl.allreduce(np.ones(2), op=cl.Sum, name="after"), np.full(2, cl.size()))
    cl.shutdown()


PLANS = {"mpi_not_initialized": ["initialized_with_thread_multiple", "collectives_with_priority"],
         "duplicate_sets": ["same_ranks_twice", "communicator_and_its_clone", "corrected_init_works"],
         "elastic_settings": ["environment_before_init", "init_settings", "between_loss_and_rebuild",
                              "rebuilt_runtime_keeps_init_settings"]}

if __name__ == "__main__":
    spmd.main(PLANS[MODE])
    if MODE == "mpi_not_initialized":
        exit_work()  # exits without shutdown(): commlib's exit hook, the script's handler, then MPI_Finalize
