"""commlib.tensorflow and commlib.keras on real MPI jobs.

Each test launches one job running many checks (tests/tensorflow/workers/tf_collectives.py, keras_fit.py); the worker
aborts the whole job on the first failure, and run_mpi kills it on timeout. TensorFlow's import costs
seconds per rank, so the checks are batched into few jobs.
"""

import pytest

pytest.importorskip("tensorflow")

from mpirun import REPO, run_mpi  # noqa: E402

ENV = {"PYTHONWARNINGS": "ignore::DeprecationWarning",
       "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, pytest.param(2, marks=pytest.mark.full),
                                    pytest.param(3, marks=pytest.mark.slow)])
def test_ops_eager_and_tf_function_gradients_tape_and_mismatches(nprocs):
    # mismatches_fail_on_every_rank: on more than one rank the same name with different shapes fails on every
    # rank, eagerly and in tf.function, with FailedPreconditionError naming the tensor
    run_mpi(nprocs, "tf_collectives.py", timeout=400, env=ENV, cases=["mismatches_fail_on_every_rank"])


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_keras_fit_matches_one_process_on_the_combined_batch(backend):
    if backend == "torch":
        pytest.importorskip("torch")
    pytest.importorskip("keras")
    run_mpi(2, "keras_fit.py", timeout=400, env={**ENV, "KERAS_BACKEND": backend},
            cases=["runs_on_the_backend_asked_for"])


@pytest.mark.mpi
@pytest.mark.parametrize("keras_flavour", [pytest.param("tf-keras", marks=pytest.mark.slow), "keras3"])
def test_keras_gradient_accumulation_local_variables_and_saving(keras_flavour):
    """backward_passes_per_step in fit against one process, the passes counter, local variables,
    PartialDistributedOptimizer, and a trained model saved and loaded (tests/tensorflow/workers/tf_keras_optimizer.py)."""
    if keras_flavour == "tf-keras":
        pytest.importorskip("tf_keras")
    env = {**ENV, "TF_USE_LEGACY_KERAS": "1" if keras_flavour == "tf-keras" else "0"}
    legacy = ["fit_accumulation_optimizer_v2", "counter_and_local_vars", "partial"]  # tf-keras's own cases
    run_mpi(2, "tf_keras_optimizer.py", timeout=400, env=env,
            cases=legacy if keras_flavour == "tf-keras" else ["partial_refused_on_keras3"])


def test_import_without_tensorflow_says_what_to_install(tmp_path):
    """``import commlib.tensorflow`` where TensorFlow cannot be imported names the extra to install."""
    import subprocess
    import sys

    (tmp_path / "tensorflow.py").write_text("raise ImportError('no tensorflow here')\n")
    probe = ("import commlib\n"
             "try:\n    import commlib.tensorflow\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": f"{tmp_path}:{REPO}"}).stdout
    assert "pip install 'commlib[tensorflow]'" in out, out


def test_import_commlib_imports_no_framework_and_the_plugins_start_nothing():
    import subprocess
    import sys

    probe = ("import sys, commlib\n"
             "assert not {'tensorflow', 'keras', 'torch', 'jax'} & set(sys.modules), sorted(sys.modules)\n"
             "import commlib.tensorflow, commlib.tensorflow.keras\n"
             "assert 'mpi4py.MPI' not in sys.modules, 'importing commlib.tensorflow initialized MPI'\n"
             "print('import OK')\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert "import OK" in out.stdout, out.stdout + out.stderr[-3000:]
