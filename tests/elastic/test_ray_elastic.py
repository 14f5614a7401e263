"""Elastic commlib jobs on a real Ray cluster of emulated hosts (RayExecutor with min_workers, Horovod's
ElasticRayExecutor API): a killed worker actor or a lost node leaves the survivors training in process; a
node Ray adds joins at the next commit. Run by scripts/cluster_jobs.sh (CLUSTER_JOBS=all); CI runs the
representative jobs only (tests/ray/test_ray_executor.py)."""

import os
import re
import subprocess
import sys
import time

import pytest

from clusters import full_only, job_environment, ray_cluster_factory, story, went_on  # noqa: F401 - a fixture
from mpirun import REPO

pytestmark = [pytest.mark.cluster, pytest.mark.slow, full_only]

PY = sys.executable


def _start(cluster, log, *args):
    out = open(log, "w")
    return subprocess.Popen(["ip", "netns", "exec", cluster.hosts.hosts[0], PY, "examples/ray_digits.py", *args],
                            env=dict(job_environment(), **cluster.env), cwd=REPO, stdout=out,
                            stderr=subprocess.STDOUT)


def _wait_for_step(driver, log, ranks, step, timeout=600):
    deadline = time.monotonic() + timeout
    while True:
        assert driver.poll() is None and time.monotonic() < deadline, story(log.read_text())
        steps = [int(s) for s in re.findall(rf"step (\d+) ranks {ranks}\b", log.read_text())]
        if steps and steps[-1] >= step:
            return
        time.sleep(0.1)


@pytest.mark.parametrize("what", ["actor", "node"])
def test_elastic_job_survives_a_lost_worker(ray_cluster_factory, tmp_path, what):
    """An elastic RayExecutor (min_workers=1) on 3 nodes; at step 40 the third node's worker actor is killed
    (SIGKILL), or the whole node (its raylet and every process); the others (both, or one: clusters.went_on)
    go on in process and reach the accuracy. Prints how long after the loss the survivors completed their first step."""
    cluster = ray_cluster_factory(3)
    log = tmp_path / "driver.log"
    driver = _start(cluster, log, "--min-workers", "1", "--cpus-per-worker", "2", "--target", "0.85", "--",
                    "--epochs", "4", "--progress")
    try:
        _wait_for_step(driver, log, 3, 40)
        lost_at = time.time()
        if what == "actor":
            node = cluster.hosts.hosts[2]
            pids = subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True).stdout.split()
            actors = [int(p) for p in pids if b"ray::Worker" in open(f"/proc/{p}/cmdline", "rb").read()]
            assert len(actors) == 1, actors
            os.kill(actors[0], 9)
        else:
            cluster.kill_node(2)
        assert driver.wait(timeout=600) == 0, story(log.read_text())
    finally:
        if driver.poll() is None:
            driver.kill()
    out = log.read_text()
    survivors = went_on(out, 2)
    assert out.count("starting 3 rank(s)") == 1, story(out)
    assert f"reached target accuracy 0.85 on {len(survivors)} worker(s)" in out, story(out)
    resumed = [float(t) for t in re.findall(rf"step \d+ ranks {len(survivors)} time ([\d.]+)", out)]
    assert resumed and resumed[0] > lost_at
    print(f"RESUME ray {what} lost: {len(survivors)} survivor(s)' first step {resumed[0] - lost_at:.1f} s after the "
          "loss (COMMLIB_TIMEOUT 10, the driver's default)")


def test_a_node_ray_adds_joins_at_the_next_commit(ray_cluster_factory, tmp_path):
    """2 nodes and a spare host; while the workers wait at step 20, Ray is started on the spare (what the
    autoscaler does); once the driver has seen the node, the workers go on, stop at their next commit, and
    the job goes on from that commit with 3 workers (tests/elastic/workers/ray_grow.py checks the sums)."""
    cluster = ray_cluster_factory(2, spare=1)
    log, go = tmp_path / "driver.log", tmp_path / "go"
    out = open(log, "w")
    driver = subprocess.Popen(["ip", "netns", "exec", cluster.hosts.hosts[0], PY,
                               str(REPO / "tests" / "elastic" / "workers" / "ray_grow.py"), str(go)],
                              env=dict(job_environment(), **cluster.env), cwd=REPO, stdout=out,
                              stderr=subprocess.STDOUT)
    try:
        _wait_for_step(driver, log, 2, 20)
        cluster.start_node(2)
        deadline = time.monotonic() + 120
        while "hosts changed" not in log.read_text():
            assert driver.poll() is None and time.monotonic() < deadline, story(log.read_text())
            time.sleep(0.2)
        go.touch()
        assert driver.wait(timeout=600) == 0, story(log.read_text())
    finally:
        if driver.poll() is None:
            driver.kill()
    text = log.read_text()
    assert text.count("starting 2 rank(s)") == 1 and text.count("starting 3 rank(s)") == 1, story(text)
    assert "ALL OK" in text, story(text)
