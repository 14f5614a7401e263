"""commlib.torch on real MPI jobs: collectives, autograd, broadcast helpers, DistributedOptimizer, misuse.

Each test launches one job that runs many checks (see tests/workers/torch_*.py); the worker aborts the
whole job on the first failure, and run_mpi kills it on timeout so nothing can hang the suite.
"""

import pytest

pytest.importorskip("torch")

from mpirun import REPO, run_mpi  # noqa: E402

WORKER_PATH = {"PYTHONPATH": f"{REPO}:{REPO / 'tests' / 'workers'}", "PYTHONWARNINGS": "ignore::DeprecationWarning"}


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_collectives_autograd_and_broadcast_helpers(nprocs):
    out = run_mpi(nprocs, "torch_collectives.py", timeout=180, env=WORKER_PATH)
    assert out.count("torch_collectives OK") == nprocs, out


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_distributed_optimizer_matches_single_process_training(nprocs):
    out = run_mpi(nprocs, "torch_optimizer.py", timeout=180, env=WORKER_PATH)
    assert out.count("torch_optimizer OK") == nprocs, out


def test_mismatched_shapes_fail_every_rank_with_a_named_error():
    out = run_mpi(2, "torch_collectives.py", timeout=180, env=WORKER_PATH)
    for rank in (0, 1):
        assert f"[rank {rank}] mismatched shapes -> CollectiveError: tensor 'mismatched.shape'" in out, out


def test_example_trains_to_its_target_accuracy():
    out = run_mpi(2, REPO / "examples" / "train_digits.py", "--epochs", "12", timeout=240,
                  env={"PYTHONPATH": str(REPO)})
    assert "reached target accuracy" in out, out
