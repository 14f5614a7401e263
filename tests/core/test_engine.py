"""The Engine on real MPI jobs: allreduce_ (every dtype and op, Average, pre/postscale, codecs and the
fp16 overflow rule), allgather, broadcast_, reducescatter, alltoall, barrier and error cases, for sizes 0
and 1 and multi-dimensional arrays. One launch per rank count / node shape (see workers/engine_check.py)."""

import pytest

from mpirun import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nprocs, local_size", [
    pytest.param(1, None, id="1rank"),
    pytest.param(2, None, id="2ranks"),
    pytest.param(3, None, id="3ranks"),
    pytest.param(4, 2, id="2x2nodes"),
    pytest.param(3, 2, id="uneven-2+1"),
])
def test_engine_collectives(nprocs, local_size):
    args = [] if local_size is None else ["--local-size", str(local_size)]
    run_mpi(nprocs, "engine_check.py", *args, timeout=300)
