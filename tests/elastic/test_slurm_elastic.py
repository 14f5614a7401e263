"""Elastic commlib-run under Slurm, on a real Slurm cluster of emulated hosts: a node lost mid-training (its
slurmd and every process on it killed, or its link taken down) leaves the survivors training in process.
Run by scripts/cluster_jobs.sh (CLUSTER_JOBS=all); CI runs the representative jobs only."""

import re
import sys
import time

import pytest

from clusters import full_only, job_environment, slurm, story, went_on  # noqa: F401 - slurm is a fixture
from mpirun import REPO

pytestmark = [pytest.mark.cluster, pytest.mark.slow, full_only]

PY = sys.executable


@pytest.mark.parametrize("how", ["killed", "cut"])
def test_elastic_job_survives_a_lost_node(slurm, how):
    """3 nodes under `commlib-run --min-np 1` (sbatch --no-kill): at step 40 the third node is lost (its
    slurmd and processes killed, or its link down); the others (both, or one: clusters.went_on) go on in
    process from the last commit and the example reaches its accuracy. Prints how long after the loss the survivors completed a step."""
    cluster = slurm(3)
    job = cluster.sbatch(f"""#!/bin/bash
#SBATCH -N 3
#SBATCH --no-kill
cd {REPO}
{PY} -m commlib.run --min-np 1 {PY} examples/train_digits_elastic.py --epochs 4 --target 0.85 --progress
""", env=job_environment())
    deadline = time.monotonic() + 600
    steps = []
    while not (steps and steps[-1] >= 40):
        assert not cluster.job(job).done and time.monotonic() < deadline, story(cluster.output(job))
        steps = [int(s) for s in re.findall(r"step (\d+) ranks 3 ", cluster.output(job))]
        time.sleep(0.1)
    lost_at = time.time()
    if how == "killed":
        cluster.kill_node(2)
    else:
        cluster.hosts.exec_on(2, ["ip", "link", "set", "eth0", "down"], check=True)
    state = cluster.wait(job, timeout=900)
    out = cluster.output(job)
    # COMPLETING: the script ended (its exit code is final) and Slurm still waits for the node whose link
    # is down to confirm the job's end, which it does only once it has declared that node down
    assert state.state in ("COMPLETED", "COMPLETING") and state.exit_code == "0:0", (state, story(out))
    survivors = went_on(out, 2)
    assert "reached target accuracy 0.85: test accuracy" in out and f"on {len(survivors)} rank(s)" in out, story(out)
    assert out.count("starting 3 rank(s)") == 1, story(out)  # started once: the survivors went on in process
    resumed = [float(t) for t in re.findall(rf"step \d+ ranks {len(survivors)} time ([\d.]+)", out)]
    assert resumed and resumed[0] > lost_at
    print(f"RESUME slurm node {how}: {len(survivors)} survivor(s)' first step {resumed[0] - lost_at:.1f} s after the "
          "loss (COMMLIB_TIMEOUT 10, the driver's default)")
