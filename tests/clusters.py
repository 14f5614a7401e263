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


def _factory(kind):
    """Yields ``make(**kwargs)`` -> an up cluster of ``kind`` ("slurm" or "ray"); at the end tears every one
    down and asserts that nothing of it is left. Skips where the daemons cannot run here."""
    if kind == "slurm":
        from commlib.testing import slurm as module

        make_cluster = module.SlurmCluster
    else:
        from commlib.testing import ray as module

        make_cluster = module.RayCluster
    missing = module.missing_prerequisites()
    if missing:
        pytest.skip(f"{kind.capitalize()} on emulated hosts impossible here: missing " + "; ".join(missing))
    made = []

    def make(**kwargs):
        cluster = make_cluster(**kwargs)
        made.append(cluster)
        return cluster.up()

    yield make
    for cluster in made:
        cluster.down()
        assert not cluster.leftovers(), cluster.leftovers()


@pytest.fixture
def slurm():
    """Factory ``slurm(nodes, cpus=1)`` -> an up SlurmCluster, torn down after the test."""
    for make in _factory("slurm"):
        yield lambda nodes, cpus=1: make(nodes=nodes, cpus=cpus)


@pytest.fixture
def ray_cluster_factory():
    """Factory ``ray_cluster_factory(nodes, cpus=2, gpus=1, spare=0)`` -> an up RayCluster, torn down after
    the test (``spare`` hosts without Ray, for :meth:`RayCluster.start_node`)."""
    for make in _factory("ray"):
        yield lambda nodes, cpus=2, gpus=1, spare=0: make(nodes=nodes, cpus=cpus, gpus=gpus, spare=spare)


@pytest.fixture(scope="module")
def ray_module_cluster_factory():
    """The same, its clusters torn down after the module (several tests on one cluster)."""
    for make in _factory("ray"):
        yield lambda nodes, cpus=2, gpus=1, spare=0: make(nodes=nodes, cpus=cpus, gpus=gpus, spare=spare)


def job_environment() -> dict:
    """A job's environment: this one without COMMLIB_* settings, the repository on the import path."""
    return job_env({"PYTHONPATH": str(REPO), "RAY_DEDUP_LOGS": "0"})


def story(out: str) -> str:
    """A job's output without per-step progress lines and Ray's notes on killed workers (what to show when a
    check fails)."""
    return "\n".join(line for line in out.splitlines()
                     if not re.search(r"step \d+ ranks \d+ time|A worker died or was killed", line))[-6000:]


def went_on(out: str, lost_rank: int) -> list[int]:
    """The world ranks that went on in process after ``lost_rank`` was lost (asserting that they did, once).
    Which survivors go on is the driver's verdict from their reports: a survivor waiting in MPI's own
    allreduce suspects every other rank, and of two survivors that suspect each other one is left out
    (docs/elastic.md): two or one go on, each time at least one and never the lost rank."""
    decisions = re.findall(r"(\d+) rank\(s\) go on in process \(world ranks \[([\d, ]*)\]; lost \[([\d, ]*)\]\)", out)
    assert len(decisions) == 1, story(out)
    survivors = [int(r) for r in decisions[0][1].split(",") if r.strip()]
    lost = [int(r) for r in decisions[0][2].split(",") if r.strip()]
    assert survivors and lost_rank in lost and lost_rank not in survivors, story(out)
    return survivors
