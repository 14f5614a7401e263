"""Several buffers reduced in one ring pass without copying them, on 1-4 real MPI ranks."""

import pytest

from mpirun import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_allreduce_many_matches_numpy(nprocs):
    run_mpi(nprocs, "ring_many_check.py", timeout=180)
