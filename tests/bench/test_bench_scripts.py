"""scripts/bench_ddp.py's job loop: a job that printed its steps and then exited non-zero keeps them, with a
note; one that printed nothing fails the run (no fake result)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
bench_ddp = pytest.importorskip("bench_ddp")
from commlib.testing.cluster import JobFailed  # noqa: E402

STEPS = [0.5] * 12


class Launcher:
    """Fails the jobs whose number is in ``failing`` (1-based), with or without their result line."""

    def __init__(self, failing: set, printed: bool):
        self.failing, self.printed, self.jobs = failing, printed, 0

    def run(self, python, mpiexec, args, env, timeout, script=None) -> str:
        self.jobs += 1
        output = "warming up\n" + (json.dumps({"step_s": STEPS}) + "\n")
        if self.jobs in self.failing:
            done = subprocess.CompletedProcess(["job"], 255, output if self.printed else "warming up\n", None)
            raise JobFailed("exit code 255", done)
        return output


def test_a_job_that_exits_badly_after_its_steps_keeps_them_with_a_note():
    notes: list[str] = []
    args = types.SimpleNamespace(jobs=2, steps=12, timeout=10)
    runs = bench_ddp.run_row(Launcher({2}, printed=True), ["gloo", "commlib"], args, {}, notes)
    assert runs == {"gloo": [STEPS, STEPS], "commlib": [STEPS, STEPS]}
    assert len(notes) == 1 and "commlib, job 1, exited 255 after printing its steps" in notes[0]


def test_a_job_that_fails_before_its_steps_fails_the_run():
    args = types.SimpleNamespace(jobs=1, steps=12, timeout=10)
    with pytest.raises(JobFailed):
        bench_ddp.run_row(Launcher({1}, printed=False), ["gloo"], args, {}, [])
