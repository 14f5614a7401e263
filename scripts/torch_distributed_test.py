"""Run PyTorch's own DistributedTest (``torch.testing._internal.distributed.distributed_test``, shipped in the
torch wheel) on the ``commlib`` backend and on gloo, and compare.

    python scripts/torch_distributed_test.py [--backends commlib,gloo] [--world-size 2] [-k SUBSTRING ...]
        [--subset ci] [--tests-from FILE] [--timeout 180] [--output docs/results/torch_distributed_test.md] [--json FILE] [--logs DIR]

PyTorch's own driver (test/distributed/test_distributed_spawn.py in pytorch/pytorch, not in the wheel)
makes a test class from ``TestDistBackend`` and ``DistributedTest._DistTestBase`` whose ``setUp`` spawns
WORLD_SIZE processes, and accepts only gloo, nccl and ucc as BACKEND. This script does the same for any
backend: one child process per backend imports the suite with ``BACKEND`` set, declares what commlib
implements (``DistTestCases.backend_feature``: ddp, subgroup, plugin; no GPU), runs the chosen tests with
unittest (each test spawns its ranks, which run ``init_process_group(BACKEND)``; a test's ranks are killed
after ``--timeout`` seconds) and writes every test's outcome as JSON. The parent prints both backends'
pass/fail/skip counts and every test that passes on gloo and does not pass on commlib, with its first
error line, and writes the report (``--output``) with the command, commit and date.

Many tests are gated by the backend's name (``require_backend_is_available({"gloo"})``, "GLOO Batch Send
Recv CPU", ...): they skip on any backend but the named ones whatever it implements. ``--gates-as gloo``
imports the suite as for gloo, so that its decorators let those tests through, then runs them on the
backend asked for: the tests' bodies and checks are the suite's own; only the gating differs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: What the commlib backend implements, in DistTestCases' terms (the sets the suite's decorators read).
COMMLIB_FEATURES = ("ddp", "subgroup", "plugin")

#: A representative subset (CI), run with ``--gates-as gloo``: all_reduce async, coalesced and on a subgroup,
#: sparse all_reduce, broadcast, scatter, objects, a group's timeout, point to point, DDP. None skips on 2 ranks
#: without a GPU. Each test spawns its ranks (about 5 s here), so CI takes ten; every c10d call is compared with
#: gloo's by tests/torch/test_torch_backend.py, and the whole suite is this script's run.
CI_SUBSET = (
    "test_all_reduce_sum_async", "test_all_reduce_coalesced_sum", "test_all_reduce_full_group_sum",
    "test_sparse_all_reduce_sum", "test_broadcast", "test_scatter", "test_all_gather_object_default_pg",
    "test_barrier_timeout_full_group", "test_batch_isend_irecv_gloo", "test_DistributedDataParallelCPU",
)


# ---- the child: one backend's run ---------------------------------------------------------------------------

def _test_class():
    """The suite's test class for BACKEND (from the environment), as PyTorch's spawn driver makes it."""
    import torch  # noqa: F401 - the backend entry points run here (commlib registers itself)
    from torch.testing._internal.common_distributed import DistTestCases

    backend = os.environ["BACKEND"]
    if backend == "commlib":
        import commlib.torch  # noqa: F401 - in case torch's entry points are off
        for feature in COMMLIB_FEATURES:
            DistTestCases.backend_feature[feature].add(backend)
    gates = os.environ.get("DISTRIBUTED_TEST_GATES")
    if gates:  # the decorators read BACKEND when the suite is imported: they gate as for ``gates``
        os.environ["BACKEND"] = gates
    from torch.testing._internal.distributed import distributed_test
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

    if gates:  # the tests themselves (init_process_group, their checks) run on ``backend``
        os.environ["BACKEND"] = distributed_test.BACKEND = backend

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()

    # the spawned ranks find the class by its name in this module (pickled by reference)
    TestDistBackendWithSpawn.__name__ = TestDistBackendWithSpawn.__qualname__ = "SpawnedTests"
    return TestDistBackendWithSpawn


if os.environ.get("BACKEND") and os.environ.get("DISTRIBUTED_TEST_CHILD"):
    # the spawned ranks import this module (as __mp_main__): the class must exist at import
    SpawnedTests = _test_class()


class _Recorder(unittest.TextTestResult):
    """Keeps every test's outcome and first error line."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes: dict[str, dict] = {}
        self._started = 0.0

    def startTest(self, test):  # noqa: N802 - unittest's name
        self._started = time.monotonic()
        super().startTest(test)

    def _note(self, test, status: str, detail: str = "") -> None:
        name = test.id().rsplit(".", 1)[-1]
        self.outcomes[name] = {"status": status, "detail": detail[:2000],
                               "seconds": round(time.monotonic() - self._started, 1)}

    def addSuccess(self, test):  # noqa: N802
        super().addSuccess(test)
        self._note(test, "passed")

    def addFailure(self, test, err):  # noqa: N802
        super().addFailure(test, err)
        self._note(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):  # noqa: N802
        super().addError(test, err)
        self._note(test, "failed", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):  # noqa: N802
        super().addSkip(test, reason)
        self._note(test, "skipped", str(reason))

    def addExpectedFailure(self, test, err):  # noqa: N802
        super().addExpectedFailure(test, err)
        self._note(test, "passed", "expected failure")

    def addUnexpectedSuccess(self, test):  # noqa: N802
        super().addUnexpectedSuccess(test)
        self._note(test, "failed", "unexpected success")


def run_child(names: list[str], out: str) -> None:
    cls = SpawnedTests
    loader = unittest.TestLoader()
    suite = unittest.TestSuite(loader.loadTestsFromName(name, cls) for name in names)
    stream = open(os.devnull, "w") if False else sys.stderr
    runner = unittest.TextTestRunner(stream=stream, verbosity=2, resultclass=_Recorder)
    result = runner.run(suite)
    Path(out).write_text(json.dumps(result.outcomes, indent=1))


def all_test_names() -> list[str]:
    """Every test of the suite (importing it needs a BACKEND; the names do not depend on it)."""
    env = dict(os.environ, BACKEND="gloo", WORLD_SIZE="2", DISTRIBUTED_TEST_CHILD="1")
    code = ("import sys; sys.path.insert(0, %r); import torch_distributed_test as t; "
            "print('\\n'.join(n for n in dir(t.SpawnedTests) if n.startswith('test_')))") % str(Path(__file__).parent)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    if done.returncode:
        raise SystemExit(f"could not list the suite's tests:\n{done.stderr[-3000:]}")
    return done.stdout.split()


def run_backend(backend: str, names: list[str], world_size: int, timeout: int, log: Path,
                gates: str | None = None) -> dict:
    """Run ``names`` on ``backend`` in a child process; returns {test: outcome}. ``gates``: the suite's
    skip decorators gate as for that backend (``--gates-as``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "outcomes.json")
        listing = os.path.join(tmp, "names.txt")
        Path(listing).write_text("\n".join(names))
        env = dict(os.environ, BACKEND=backend, WORLD_SIZE=str(world_size), DISTRIBUTED_TEST_CHILD="1",
                   DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(timeout), PYTHONPATH=str(REPO))
        env.pop("DISTRIBUTED_TEST_GATES", None)
        if gates:
            env["DISTRIBUTED_TEST_GATES"] = gates
        for name in [k for k in env if k.startswith(("PMI_", "PMIX_", "OMPI_"))]:
            del env[name]  # the spawned ranks are not an MPI job: the commlib backend builds its world itself
        with open(log, "w") as stream:
            subprocess.run([sys.executable, __file__, "--child", out, "--names", listing], env=env, stdout=stream,
                           stderr=subprocess.STDOUT, cwd=tmp, check=False)
        if not os.path.exists(out):
            raise SystemExit(f"the {backend} run wrote no results; see {log}")
        return json.loads(Path(out).read_text())


def counts(outcomes: dict) -> dict:
    tally = {"passed": 0, "failed": 0, "skipped": 0}
    for outcome in outcomes.values():
        tally[outcome["status"]] += 1
    return tally


def first_line(detail: str) -> str:
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "Exception" in line or "FAIL" in line]
    return (errors[-1] if errors else (lines[-1] if lines else ""))[:300]


def report(results: dict, args, names: list[str], started: str) -> str:
    commit = args.commit or subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True).stdout.strip()
    import torch

    lines = [f"# PyTorch's DistributedTest on commlib and gloo", "",
             f"Command: `python scripts/torch_distributed_test.py {' '.join(sys.argv[1:])}`  ",
             f"Commit {commit}, started {started}, torch {torch.__version__}, WORLD_SIZE={args.world_size}, "
             f"{len(names)} tests, per-test timeout {args.timeout} s, this machine (2 cores, no GPU)"
             + (f"; the suite's skip decorators gate as for {args.gates_as} (`--gates-as`)." if args.gates_as
                else "."), "",
             "| backend | passed | failed | skipped |", "|---|---:|---:|---:|"]
    for backend, outcomes in results.items():
        c = counts(outcomes)
        lines.append(f"| {backend} | {c['passed']} | {c['failed']} | {c['skipped']} |")
    if "commlib" in results and "gloo" in results:
        ours, theirs = results["commlib"], results["gloo"]
        lost = sorted(n for n in names if theirs.get(n, {}).get("status") == "passed"
                      and ours.get(n, {}).get("status") == "failed")
        skipped = sorted(n for n in names if theirs.get(n, {}).get("status") == "passed"
                         and ours.get(n, {}).get("status") == "skipped")
        gained = sorted(n for n in names if ours.get(n, {}).get("status") == "passed"
                        and theirs.get(n, {}).get("status") != "passed")
        lines += ["", f"## Passed on gloo, failed on commlib ({len(lost)})", ""]
        lines += [f"- `{n}`: {first_line(ours[n]['detail'])}" for n in lost] or ["(none)"]
        lines += ["", f"## Passed on gloo, skipped on commlib ({len(skipped)})", ""]
        lines += [f"- `{n}`: {ours[n]['detail'][:200]}" for n in skipped] or ["(none)"]
        lines += ["", f"## Passed on commlib, not on gloo ({len(gained)})", ""]
        lines += [f"- `{n}` (gloo: {theirs.get(n, {}).get('status', 'not run')})" for n in gained] or ["(none)"]
    for backend, outcomes in results.items():
        failed = sorted(n for n, o in outcomes.items() if o["status"] == "failed")
        lines += ["", f"## Every failure on {backend} ({len(failed)})", ""]
        lines += [f"- `{n}`: {first_line(outcomes[n]['detail'])}" for n in failed] or ["(none)"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="commlib,gloo")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("-k", action="append", default=[], help="run the tests whose name contains this")
    parser.add_argument("--tests-from", help="run the tests named in this file (one a line), e.g. those that "
                                             "did not skip in an earlier run")
    parser.add_argument("--subset", choices=["ci"], help="the representative subset CI runs")
    parser.add_argument("--timeout", type=int, default=180, help="seconds before a test's ranks are killed")
    parser.add_argument("--output", help="write the report (markdown) here")
    parser.add_argument("--json", help="write every outcome here")
    parser.add_argument("--logs", help="write each backend's log in this folder (default: a new folder in /tmp)")
    parser.add_argument("--commit", help="the commit the code is a copy of (run from a copy, the tree may "
                                         "change meanwhile: the spawned ranks import it afresh per test)")
    parser.add_argument("--gates-as", help="gate the tests as for this backend (e.g. gloo): the suite's skip "
                                           "decorators read the backend's name, so tests it allows gloo alone "
                                           "then run on commlib too, their bodies unchanged")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--names", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_child(Path(args.names).read_text().split(), args.child)
        return 0
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    names = all_test_names()
    if args.subset == "ci":
        names = [n for n in names if n in CI_SUBSET]
    if args.k:
        names = [n for n in names if any(k in n for k in args.k)]
    if args.tests_from:
        wanted = set(Path(args.tests_from).read_text().split())
        names = [n for n in names if n in wanted]
    results = {}
    logs = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="torch_distributed_test_"))
    logs.mkdir(parents=True, exist_ok=True)
    for backend in args.backends.split(","):
        begin = time.monotonic()
        results[backend] = run_backend(backend, names, args.world_size, args.timeout, logs / f"{backend}.log",
                                       args.gates_as)
        c = counts(results[backend])
        print(f"{backend}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped of {len(names)} "
              f"({time.monotonic() - begin:.0f} s; log {logs / (backend + '.log')})", flush=True)
    text = report(results, args, names, started)
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
