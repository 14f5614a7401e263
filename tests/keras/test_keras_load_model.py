"""``load_model`` through commlib.keras and commlib.tensorflow.keras restores what the model was compiled
with: the optimizer (its state kept, its gradients still reduced over the ranks), the loss and the metrics;
on Keras 3's TensorFlow, PyTorch and JAX backends and on tf-keras (tests/keras/workers/keras_load_model.py)."""

from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from mpirun import run_mpi  # noqa: E402

WORKER = Path(__file__).resolve().parent / "workers" / "keras_load_model.py"
ENV = {"PYTHONWARNINGS": "ignore::DeprecationWarning",
       "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}
CASES = ("loss_and_metrics", "optimizer_state", "optimizer_distributed")
NPROCS = 2


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("flavour, env, entries", [
    ("tensorflow", {"KERAS_BACKEND": "tensorflow"}, ["commlib.keras", "commlib.tensorflow.keras"]),
    ("torch", {"KERAS_BACKEND": "torch"}, ["commlib.keras"]),
    ("jax", {"KERAS_BACKEND": "jax"}, ["commlib.keras"]),
    ("tf-keras", {"TF_USE_LEGACY_KERAS": "1"}, ["commlib.tensorflow.keras"]),
], ids=["keras3-tensorflow", "keras3-torch", "keras3-jax", "tf-keras"])
def test_load_model_keeps_optimizer_state_loss_and_metrics(flavour, env, entries):
    if flavour in ("torch", "jax"):
        pytest.importorskip(flavour)
    run_mpi(NPROCS, WORKER, *entries, timeout=400, env={**ENV, **env},
            cases=[f"{entry}.{case}" for entry in entries for case in CASES])
