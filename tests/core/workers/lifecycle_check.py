"""MPI worker for tests/core/test_lifecycle.py. Every check is a named case; each rank prints
``rank R: case NAME ok`` (os.write, so that the lines keep their order with those printed at exit) and any
failure aborts the whole job.

- ``elastic_settings DIR``: the elastic loop's settings come from the runtime (init(elastic_dir=...,
  elastic_in_process=True) with no COMMLIB_* variable set), also after the runtime is rebuilt over the
  survivors (here: all the ranks).
"""

import os
import sys

import numpy as np

MODE = sys.argv[1]

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


def assert_equal(got, expected):
    assert got == expected, f"{got!r} != {expected!r}"


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


{"elastic_settings": elastic_settings}[MODE]()
