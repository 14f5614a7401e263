"""MPI worker for tests/core/test_lifecycle.py: what a Horovod user's script meets at init() and at exit.
Every check is a named case; each rank prints ``rank R: case NAME ok`` (os.write, so that the lines keep
their order with those printed at exit) and any failure aborts the whole job.

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


def say(rank: int, text: str) -> None:
    os.write(1, f"rank {rank}: {text}\n".encode())


def case(rank: int, name: str, check) -> None:
    try:
        check()
    except BaseException as exc:  # noqa: BLE001 - any failure takes the job down, naming the case
        say(rank, f"case {name} FAILED: {exc!r}")
        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.COMM_WORLD.Abort(1)
        os._exit(1)
    say(rank, f"case {name} ok")


def mpi_not_initialized() -> None:
    assert not MPI.Is_initialized(), "the script's mpi4py.rc.initialize = False did not hold"
    cl.init()
    rank, size = cl.rank(), cl.size()
    case(rank, "initialized_with_thread_multiple", lambda: (
        assert_equal(MPI.Query_thread(), MPI.THREAD_MULTIPLE), assert_equal(cl.mpi_threads_supported(), True)))

    def collectives():
        x = np.full(4, rank + 1, np.float32)
        assert np.array_equal(cl.allreduce(x, op=cl.Sum, name="a", priority=2), np.full(4, size * (size + 1) / 2))
        y = x.copy()
        cl.allreduce_(y, op=cl.Sum, name="b", priority=1)
        assert np.array_equal(y, np.full(4, size * (size + 1) / 2))
        both = cl.synchronize(cl.grouped_allreduce_async([x, x * 2], op=cl.Sum, name="c", priority=3))
        assert np.array_equal(both[1], 2 * both[0])

    case(rank, "collectives_with_priority", collectives)

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


def duplicate_sets() -> None:
    world = MPI.COMM_WORLD
    rank = world.Get_rank()

    def refused(sets, what):
        try:
            cl.init(process_sets=sets)
        except ValueError as exc:
            assert "duplicate" in str(exc).lower(), exc
        else:
            raise AssertionError(f"init() accepted {what}")
        assert not cl.is_initialized(), "commlib stayed initialized after the refused init()"
        assert all(s.process_set_id is None for s in sets), [s.process_set_id for s in sets]

    first, again = cl.ProcessSet([0]), cl.ProcessSet([0])
    case(rank, "same_ranks_twice", lambda: refused([first, again], "the same ranks twice"))
    sub = world.Split(0 if rank == 0 else MPI.UNDEFINED, rank)
    clone = sub.Dup() if sub != MPI.COMM_NULL else MPI.COMM_NULL
    case(rank, "communicator_and_its_clone", lambda: refused([cl.ProcessSet(sub), cl.ProcessSet(clone)],
                                                             "a communicator and its clone"))
    evens = cl.ProcessSet(range(0, world.Get_size(), 2))

    def corrected():
        cl.init(process_sets=[first, evens] if world.Get_size() > 2 else [first])
        assert cl.is_initialized() and first.process_set_id == 1, first
        if first.included():
            total = cl.allreduce(np.ones(3, np.float32), op=cl.Sum, name="x", process_set=first)
            assert np.array_equal(total, np.ones(3)), total
        assert np.array_equal(cl.allreduce(np.ones(2), op=cl.Sum, name="w"), np.full(2, world.Get_size()))
        cl.shutdown()

    case(rank, "corrected_init_works", corrected)


def elastic_settings() -> None:
    from commlib import lifecycle
    from commlib.elastic import control, recover

    directory = sys.argv[2]
    rank = MPI.COMM_WORLD.Get_rank()
    case(rank, "environment_before_init", lambda: (assert_equal(control.directory(), None),
                                                   assert_equal(recover.enabled(), False)))
    cl.init(elastic_dir=directory, elastic_in_process=True)
    case(rank, "init_settings", lambda: (assert_equal(control.directory(), directory),
                                         assert_equal(recover.enabled(), True)))
    lifecycle.abandon([])  # as recovery does, then over the survivors (every rank: none was lost)
    case(rank, "between_loss_and_rebuild", lambda: (assert_equal(cl.is_initialized(), False),
                                                    assert_equal(control.directory(), directory)))
    lifecycle.rebuild(MPI.COMM_WORLD.Dup())

    def rebuilt():
        assert cl.is_initialized() and cl.size() == MPI.COMM_WORLD.Get_size()
        assert_equal(control.directory(), directory)
        assert_equal(recover.enabled(), True)
        assert np.array_equal(cl.allreduce(np.ones(2), op=cl.Sum, name="after"), np.full(2, cl.size()))

    case(rank, "rebuilt_runtime_keeps_init_settings", rebuilt)
    cl.shutdown()


{"mpi_not_initialized": mpi_not_initialized, "duplicate_sets": duplicate_sets,
 "elastic_settings": elastic_settings}[MODE]()
