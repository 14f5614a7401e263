"""Fixtures for tests on real Slurm and Ray daemons on emulated hosts (commlib.testing.slurm, .ray), and the
mark for the longer scenarios that CI leaves to scripts/cluster_jobs.sh.

A test module imports what it uses: ``from clusters import slurm, ray_cluster, full_only``. Each fixture
skips, naming what is missing, where the daemons cannot run, and asserts after teardown that nothing of
its clusters is left (processes, namespaces, links, folders).
"""

import os
import re

import pytest

from mpirun import REPO, job_env

#: the scenarios beyond CI's representative jobs (a lost node, a killed actor, growth, ...) run when
#: scripts/cluster_jobs.sh sets CLUSTER_JOBS=all
full_only = pytest.mark.skipif(os.environ.get("CLUSTER_JOBS") != "all",
                               reason="a longer cluster scenario: bash scripts/cluster_jobs.sh runs it")


@pytest.fixture
def slurm():
    """Factory ``slurm(nodes, cpus=1)`` -> an up SlurmCluster, torn down after the test."""
    from commlib.testing import slurm as testing_slurm

    missing = testing_slurm.missing_prerequisites()
    if missing:
        pytest.skip("Slurm on emulated hosts impossible here: missing " + "; ".join(missing))
    made = []

    def make(nodes, cpus=1):
        cluster = testing_slurm.SlurmCluster(nodes=nodes, cpus=cpus)
        made.append(cluster)
        return cluster.up()

    yield make
    for cluster in made:
        cluster.down()
        assert not cluster.leftovers(), cluster.leftovers()


def _ray_factory():
    from commlib.testing import ray as testing_ray

    missing = testing_ray.missing_prerequisites()
    if missing:
        pytest.skip("Ray on emulated hosts impossible here: missing " + "; ".join(missing))
    made = []

    def make(nodes, cpus=2, gpus=1, spare=0):
        cluster = testing_ray.RayCluster(nodes=nodes, cpus=cpus, gpus=gpus, spare=spare)
        made.append(cluster)
        return cluster.up()

    yield make
    for cluster in made:
        cluster.down()
        assert not cluster.leftovers(), cluster.leftovers()


@pytest.fixture
def ray_cluster_factory():
    """Factory ``ray_cluster_factory(nodes, cpus=2, gpus=1, spare=0)`` -> an up RayCluster, torn down after
    the test (``spare`` hosts without Ray, for :meth:`RayCluster.start_node`)."""
    yield from _ray_factory()


@pytest.fixture(scope="module")
def ray_module_cluster_factory():
    """The same, its clusters torn down after the module (several tests on one cluster)."""
    yield from _ray_factory()


def job_environment() -> dict:
    """A job's environment: this one without COMMLIB_* settings, the repository on the import path."""
    return job_env({"PYTHONPATH": str(REPO), "RAY_DEDUP_LOGS": "0"})


def story(out: str) -> str:
    """A job's output without per-step progress lines and Ray's notes on killed workers (what to show when a
    check fails)."""
    return "\n".join(line for line in out.splitlines()
                     if not re.search(r"step \d+ ranks \d+ time|A worker died or was killed", line))[-6000:]
