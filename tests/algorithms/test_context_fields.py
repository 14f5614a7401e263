"""What the algorithms remember across calls: typed fields of the AlgorithmContext, made by their owners,
dropped with the cost model they came from and by close() (workers/context_fields.py, a real job)."""

from pathlib import Path

import pytest

from mpirun import run_mpi

WORKER = Path(__file__).resolve().parent / "workers" / "context_fields.py"


@pytest.mark.mpi
def test_context_fields_on_a_real_job():
    run_mpi(2, WORKER, timeout=120)  # every case passed on every rank (cma's where the kernel allows it)
