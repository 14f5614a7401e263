"""commlib.ray on a real Ray cluster of emulated hosts (commlib.testing.ray: a head and a worker node started
with `ray start`, each under its host's name and address): RayExecutor's API (run, run_remote, execute,
execute_single, executables, environment, GPUs passed through, ray_logger callbacks, placement errors) and
the digits example trained on 2 hosts x 1 worker. Elastic jobs on Ray: tests/elastic/test_ray_elastic.py."""

import sys

import pytest

from clusters import job_environment, ray_module_cluster_factory, story  # noqa: F401 - a fixture
from mpirun import REPO

pytestmark = pytest.mark.cluster

PY = sys.executable
WORKERS = REPO / "tests" / "ray" / "workers"


@pytest.fixture(scope="module")
def ray_cluster(ray_module_cluster_factory):
    """2 Ray nodes of 2 CPUs and 1 (declared) GPU each, for the module."""
    return ray_module_cluster_factory(2)


@pytest.mark.slow
def test_executor_api(ray_cluster):
    done = ray_cluster.driver([PY, str(WORKERS / "ray_api.py")], env=job_environment(), timeout=600)
    assert done.returncode == 0 and "ALL OK" in done.stdout, story(done.stdout)


@pytest.mark.slow
def test_executor_trains_the_example_on_two_hosts(ray_cluster):
    """RayExecutor(num_hosts=2, num_workers_per_host=1) runs examples/ray_digits.py's training (5 epochs:
    0.95 here, well past the 0.85 asked) and returns each worker's accuracy."""
    done = ray_cluster.driver([PY, "examples/ray_digits.py", "--num-hosts", "2", "--workers-per-host", "1",
                               "--cpus-per-worker", "2", "--target", "0.85", "--", "--epochs", "5"],
                              env=job_environment(), cwd=REPO, timeout=900)
    assert done.returncode == 0, story(done.stdout)
    assert "-hosts rayhost0:1,rayhost1:1 " in done.stdout and "training on 2 rank(s)" in done.stdout
    assert "reached target accuracy 0.85 on 2 worker(s)" in done.stdout, story(done.stdout)


@pytest.mark.slow
def test_ray_train_runs_a_commlib_job(ray_cluster, tmp_path):
    """DataParallelTrainer with CommlibConfig: the training function's commlib ranks are Ray Train's, an
    allreduce and a few DistributedOptimizer steps agree on both workers, ray.train.report works."""
    done = ray_cluster.driver([PY, str(WORKERS / "ray_train.py"), str(tmp_path)], env=job_environment(), timeout=600)
    assert done.returncode == 0 and "ALL OK" in done.stdout, story(done.stdout)
