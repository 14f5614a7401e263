"""Process sets (commlib.process_sets) on 1-4 real MPI ranks: collectives inside sets against numpy,
sets beside the world, each set's own node layout, and the errors."""

import pytest

from mpirun import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_process_sets(nprocs):
    run_mpi(nprocs, "process_sets.py", timeout=180)


@pytest.mark.parametrize("env", [{"COMMLIB_LOCAL_SIZE": "2"}, {"COMMLIB_DIRECT_MAX_RANKS": "0"}],
                         ids=["two_nodes", "relay"])
def test_process_sets_on_four_ranks(env):
    run_mpi(4, "process_sets.py", env=env, timeout=240)


def test_half_type_mpi_ops_are_shared_between_sets_and_lanes():
    run_mpi(4, "process_sets_ops.py", timeout=240)
