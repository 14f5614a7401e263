"""PyTorch's own DistributedTest on the ``commlib`` backend: the representative subset
(``scripts/torch_distributed_test.py --subset ci``: all_reduce async, coalesced and on a subgroup, sparse
all_reduce, broadcast, scatter, objects, a group's timeout, point to point, DDP), 2 ranks, with the suite's
gating by backend name lifted (``--gates-as gloo``: tests it allows gloo alone run too). Every test of it
must pass; the whole suite and gloo's counts are the script's report (docs/results/torch_distributed_test.md).
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
    done = subprocess.run([sys.executable, str(SCRIPT), "--backends", "commlib", "--subset", "ci", "--gates-as",
                           "gloo", "--timeout", "120", "--json", str(out), "--logs", str(tmp_path)],
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    outcomes = json.loads(out.read_text())["commlib"]
    assert len(outcomes) == 10, sorted(outcomes)  # every name of the subset is one of the suite's tests
    not_passed = {name: o["detail"][-600:] for name, o in outcomes.items() if o["status"] != "passed"}
    assert not not_passed, "\n\n".join(f"{name}:\n{detail}" for name, detail in sorted(not_passed.items()))
