"""DistributedOptimizer(process_set=...) on 3 ranks, through both Keras entry points, on Keras 3 and
tf-keras: the set's ranks apply its mean gradient, the rank outside it its own
(tests/keras/workers/keras_process_sets.py)."""

from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from mpirun import run_mpi  # noqa: E402

WORKER = Path(__file__).resolve().parent / "workers" / "keras_process_sets.py"
ENV = {"PYTHONWARNINGS": "ignore::DeprecationWarning",
       "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "KERAS_BACKEND": "tensorflow"}
NPROCS = 3


@pytest.mark.mpi
@pytest.mark.parametrize("flavour, env, entries", [
    ("keras3", {}, ["commlib.keras", "commlib.tensorflow.keras"]),
    ("tf-keras", {"TF_USE_LEGACY_KERAS": "1"}, ["commlib.tensorflow.keras"]),
], ids=["keras3", "tf-keras"])
def test_optimizer_reduces_over_its_process_set_only(flavour, env, entries):
    run_mpi(NPROCS, WORKER, *entries, timeout=300, env={**ENV, **env},
            cases=[f"{entry}.passes{p}" for entry in entries for p in (1, 2)])
