"""commlib-run on a real Slurm cluster of emulated hosts (commlib.testing.slurm: slurmctld, a slurmd per
host, munge): the hostlist parser against `scontrol show hostnames`, an `sbatch -N 2` job training the
digits example through `commlib-run` with no host list, -np beyond the allocation, and an elastic job that
loses a node mid-training. Each test makes its own cluster and checks that nothing of it is left."""

import os
import re
import sys
import time

import pytest

from mpirun import REPO, job_env

pytestmark = pytest.mark.cluster

PY = sys.executable


@pytest.fixture
def slurm():
    """Factory ``slurm(nodes, cpus=1)`` -> an up SlurmCluster; torn down after the test, which then
    asserts that nothing of it is left (processes, namespaces, links, folders)."""
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


def _env():
    return job_env({"PYTHONPATH": str(REPO)})


def _story(out: str) -> str:
    """The job's output without the per-step progress lines (what to show when a check fails)."""
    return "\n".join(line for line in out.splitlines() if not re.search(r"step \d+ ranks \d+ time", line))[-6000:]


def test_hostlist_parser_agrees_with_scontrol(slurm):
    from commlib.run.slurm import parse_hostlist

    cluster = slurm(1)
    for text in ("a[8-10]", "a[08-10]", "r[1-2]n[1-2]", "a[009-011],b", "a[1,03-04]", cluster.nodes[0]):
        shown = cluster.client(["scontrol", "show", "hostnames", text]).stdout.split()
        assert parse_hostlist(text) == shown, text


@pytest.mark.slow
def test_sbatch_trains_the_example_on_two_nodes(slurm):
    """`sbatch -N 2` with `commlib-run python examples/train_digits.py`: no host list, no -np; the ranks
    start through srun on both nodes and the example reaches its accuracy."""
    cluster = slurm(2)
    job = cluster.sbatch(f"""#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node=1
cd {REPO}
{PY} -m commlib.run {PY} examples/train_digits.py --target 0.85
""", env=_env())
    state = cluster.wait(job, timeout=900)
    out = cluster.output(job)
    assert (state.state, state.exit_code) == ("COMPLETED", "0:0"), out[-4000:]
    command = next(line for line in out.splitlines() if line.startswith("commlib-run: "))
    assert " -launcher slurm " in command and f"-hosts {cluster.nodes[0]}:1,{cluster.nodes[1]}:1 " in command
    assert "training on 2 rank(s)" in out and "reached target accuracy 0.85" in out, out[-4000:]


def test_more_ranks_than_the_allocation_is_an_error(slurm):
    cluster = slurm(2)
    done = cluster.client(["salloc", "-N", "2", PY, "-m", "commlib.run", "-np", "3", "true"], env=_env(),
                          check=False, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert re.search(r"-np 3 is more than the 2 task\(s\) of Slurm job \d+ \(", done.stderr), done.stderr


@pytest.mark.slow
def test_elastic_job_survives_a_lost_node(slurm):
    """3 nodes under `commlib-run --min-np 1` (sbatch --no-kill): at step 40 the third node's slurmd and
    every process on it are killed; the other two go on in process from the last commit and the example
    reaches its accuracy. Prints how long after the loss the survivors completed their first step."""
    cluster = slurm(3)
    job = cluster.sbatch(f"""#!/bin/bash
#SBATCH -N 3
#SBATCH --no-kill
cd {REPO}
{PY} -m commlib.run --min-np 1 {PY} examples/train_digits_elastic.py --epochs 4 --target 0.85 --progress
""", env=_env())
    deadline = time.monotonic() + 600
    steps = []
    while time.monotonic() < deadline and not (steps and steps[-1] >= 40):
        assert not cluster.job(job).done, cluster.output(job)[-4000:]
        steps = [int(s) for s in re.findall(r"step (\d+) ranks 3 ", cluster.output(job))]
        time.sleep(0.1)
    lost_at = time.time()
    cluster.kill_node(2)
    state = cluster.wait(job, timeout=900)
    out = cluster.output(job)
    story = _story(out)
    assert (state.state, state.exit_code) == ("COMPLETED", "0:0"), story
    assert "2 rank(s) go on in process (world ranks [0, 1]; lost [2])" in out, story
    assert "reached target accuracy 0.85" in out and "on 2 rank(s)" in out, story
    assert out.count("starting 3 rank(s)") == 1, story  # started once: the survivors went on in process
    resumed = [float(t) for t in re.findall(r"step \d+ ranks 2 time ([\d.]+)", out)]
    print(f"survivors' first step {resumed[0] - lost_at:.1f} s after the node was lost "
          f"(COMMLIB_TIMEOUT {os.environ.get('COMMLIB_TIMEOUT', '10 (the driver default)')})")
    assert resumed and resumed[0] > lost_at
    assert cluster.node_states()[cluster.nodes[2]].startswith("down")
