"""scripts/bench_ddp.py's job loop: a job that printed its steps and then exited non-zero keeps them, with a
note; one that printed nothing fails the run (no fake result); with ``--layout-cache new,seen`` each commlib
variant runs once per kind, each new job with an empty cache directory of its own and the seen jobs with
one an untimed job filled first."""

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
        self.caches: list = []  # (backend, COMMLIB_AUTO_CACHE) of each job, in order

    def run(self, python, mpiexec, args, env, timeout, script=None) -> str:
        self.jobs += 1
        self.caches.append((args[1], env.get("COMMLIB_AUTO_CACHE")))
        output = "warming up\n" + (json.dumps({"step_s": STEPS}) + "\n")
        if self.jobs in self.failing:
            done = subprocess.CompletedProcess(["job"], 255, output if self.printed else "warming up\n", None)
            raise JobFailed("exit code 255", done)
        return output


def test_a_job_that_exits_badly_after_its_steps_keeps_them_with_a_note():
    notes: list[str] = []
    args = types.SimpleNamespace(jobs=2, steps=12, timeout=10, layout_cache="")
    runs = bench_ddp.run_row(Launcher({2}, printed=True), ["gloo", "commlib"], args, {}, notes)
    assert runs == {"gloo": [STEPS, STEPS], "commlib": [STEPS, STEPS]}
    assert len(notes) == 1 and "commlib, job 1, exited 255 after printing its steps" in notes[0]


def test_a_job_that_fails_before_its_steps_fails_the_run():
    args = types.SimpleNamespace(jobs=1, steps=12, timeout=10, layout_cache="")
    with pytest.raises(JobFailed):
        bench_ddp.run_row(Launcher({1}, printed=False), ["gloo"], args, {}, [])


def test_new_and_seen_layouts_run_each_commlib_variant_with_its_own_cache():
    launcher = Launcher(set(), printed=True)
    args = types.SimpleNamespace(jobs=2, steps=12, timeout=10, layout_cache="new,seen")
    runs = bench_ddp.run_row(launcher, ["gloo", "commlib"], args, {"COMMLIB_AUTO_CACHE": "/user"}, [])
    assert list(runs) == ["gloo", "commlib (new layout)", "commlib (seen layout)"]
    assert all(len(jobs) == 2 for jobs in runs.values())
    (backend, seen), *timed = launcher.caches  # the untimed earlier job of the seen layout first
    assert backend == "commlib" and seen.endswith("seen") and len(timed) == 6
    assert [cache for backend, cache in timed if backend == "gloo"] == ["/user", "/user"]  # gloo: untouched
    commlib = [cache for backend, cache in timed if backend == "commlib"]
    new = [cache for cache in commlib if cache != seen]
    assert len(new) == 2 and len(set(new)) == 2 and commlib.count(seen) == 2
