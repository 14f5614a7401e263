"""commlib.lifecycle on real MPI ranks (tests/core/workers/lifecycle_check.py): the elastic loop's settings
taken from the runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpirun import run_mpi

WORKER = Path(__file__).resolve().parent / "workers" / "lifecycle_check.py"


def lines_of(out: str, rank: int) -> list[str]:
    return [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith(f"rank {rank}: ")]


@pytest.mark.mpi
def test_elastic_takes_the_settings_of_init_also_after_a_rebuild(tmp_path):
    """elastic.control and elastic.recover read the runtime's settings (init(**settings)), not the
    environment afresh; a runtime rebuilt over the survivors keeps them."""
    out = run_mpi(2, WORKER, "elastic_settings", str(tmp_path), timeout=120)
    for rank in range(2):
        assert lines_of(out, rank) == ["case environment_before_init ok", "case init_settings ok",
                                       "case between_loss_and_rebuild ok",
                                       "case rebuilt_runtime_keeps_init_settings ok"], out
