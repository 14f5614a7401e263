"""commlib.lifecycle on real MPI ranks (tests/core/workers/lifecycle_check.py): what a Horovod user's
script meets at init() and at exit (MPI left uninitialized by the script, duplicate process sets), and the
elastic loop's settings taken from the runtime."""

from __future__ import annotations

import pytest

from mpirun import run_mpi

WORKER = "lifecycle_check.py"


def lines_of(out: str, rank: int) -> list[str]:
    return [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith(f"rank {rank}: ")]


@pytest.mark.mpi
def test_init_initializes_mpi_the_script_left_alone_and_finalizes_it_at_exit():
    """mpi4py.rc.initialize = False before init(): commlib initializes MPI (MPI_THREAD_MULTIPLE) instead of
    MPICH aborting, and finalizes it at exit after commlib's exit hook and the script's own exit work."""
    out = run_mpi(2, WORKER, "mpi_not_initialized", timeout=120,
                  cases=["initialized_with_thread_multiple", "collectives_with_priority"])
    assert "before initializing" not in out, out
    for rank in range(2):  # after the cases, in this order
        assert lines_of(out, rank) == ["script's exit handler; MPI finalized then: False",
                                       "MPI finalized; commlib initialized then: False"], out


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_duplicate_process_sets_at_init_are_refused_on_every_rank(nprocs):
    """The same set twice (the same ranks, or a communicator and its clone) is a ValueError on every rank;
    commlib stays uninitialized and a corrected init() works (as Horovod)."""
    run_mpi(nprocs, WORKER, "duplicate_sets", timeout=120,
            cases=["same_ranks_twice", "communicator_and_its_clone", "corrected_init_works"])


@pytest.mark.mpi
def test_elastic_takes_the_settings_of_init_also_after_a_rebuild(tmp_path):
    """elastic.control and elastic.recover read the runtime's settings (init(**settings)), not the
    environment afresh; a runtime rebuilt over the survivors keeps them."""
    run_mpi(2, WORKER, "elastic_settings", str(tmp_path), timeout=120,
            cases=["environment_before_init", "init_settings", "between_loss_and_rebuild",
                   "rebuilt_runtime_keeps_init_settings"])
