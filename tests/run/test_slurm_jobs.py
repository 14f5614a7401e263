"""commlib-run on a real Slurm cluster of emulated hosts (commlib.testing.slurm: slurmctld, a slurmd per
host, munge): the hostlist parser against `scontrol show hostnames`, -np beyond the allocation, and an
`sbatch -N 2` job training the digits example through `commlib-run` with no host list. Elastic jobs under
Slurm: tests/elastic/test_slurm_elastic.py."""

import re
import sys

import pytest

from clusters import job_environment, slurm, story  # noqa: F401 - slurm is a fixture
from mpirun import REPO

pytestmark = pytest.mark.cluster

PY = sys.executable


def test_hostlist_parser_agrees_with_scontrol(slurm):
    from commlib.run.slurm import parse_hostlist

    cluster = slurm(1)
    for text in ("a[8-10]", "a[08-10]", "r[1-2]n[1-2]", "a[009-011],b", "a[1,03-04]", cluster.nodes[0]):
        shown = cluster.client(["scontrol", "show", "hostnames", text]).stdout.split()
        assert parse_hostlist(text) == shown, text


def test_more_ranks_than_the_allocation_is_an_error(slurm):
    cluster = slurm(2)
    done = cluster.client(["salloc", "-N", "2", PY, "-m", "commlib.run", "-np", "3", "true"],
                          env=job_environment(), check=False, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert re.search(r"-np 3 is more than the 2 task\(s\) of Slurm job \d+ \(", done.stderr), done.stderr


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
""", env=job_environment())
    state = cluster.wait(job, timeout=900)
    out = cluster.output(job)
    assert (state.state, state.exit_code) == ("COMPLETED", "0:0"), story(out)
    command = next(line for line in out.splitlines() if line.startswith("commlib-run: "))
    assert " -launcher slurm " in command and f"-hosts {cluster.nodes[0]}:1,{cluster.nodes[1]}:1 " in command
    assert "training on 2 rank(s)" in out and "reached target accuracy 0.85" in out, story(out)
