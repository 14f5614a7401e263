"""PyTorch's own DistributedTest on the ``commlib`` backend: the representative subset
(``scripts/torch_distributed_test.py --subset ci``: collectives and their async forms, subgroups, point to
point, object collectives, DDP), 2 ranks. Every test of it must pass or be skipped by the suite itself (for
want of a GPU or of more ranks); the whole suite and gloo's counts are the script's report
(docs/results/torch_distributed_test.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("expecttest")  # the suite imports it (the test extra installs it)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "torch_distributed_test.py"


@pytest.mark.mpi
@pytest.mark.slow
def test_distributed_test_subset_passes_on_commlib(tmp_path):
    out = tmp_path / "outcomes.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--backends", "commlib", "--subset", "ci", "--timeout", "120",
                           "--json", str(out), "--logs", str(tmp_path)], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    outcomes = json.loads(out.read_text())["commlib"]
    assert len(outcomes) == 22, sorted(outcomes)  # every name of the subset is one of the suite's tests
    failed = {name: o["detail"][-600:] for name, o in outcomes.items() if o["status"] == "failed"}
    assert not failed, "\n\n".join(f"{name}:\n{detail}" for name, detail in sorted(failed.items()))
    # the suite skips some on 2 ranks without a GPU or for backends other than its own; most run
    assert sum(o["status"] == "passed" for o in outcomes.values()) >= 12, outcomes
