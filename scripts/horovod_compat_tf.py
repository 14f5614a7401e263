#!/usr/bin/env python
"""Run Horovod's own TensorFlow and Keras tests against commlib.tensorflow, unchanged, on 2 ranks.

The TensorFlow counterpart of ``scripts/horovod_compat.py`` (whose shim package, test helpers and MPI
launch it shares). Horovod's code is not part of commlib: get a copy yourself, e.g.

    git clone --depth 1 https://github.com/horovod/horovod /tmp/horovod
    .venv/bin/python scripts/horovod_compat_tf.py /tmp/horovod --batch 10 --jobs 2

It runs ``test/parallel/test_tensorflow.py`` and ``test_tensorflow_process_sets.py`` (with their
``base_test_tensorflow.py``) against commlib.tensorflow with Keras 3, and ``test_tensorflow2_keras.py`` and
``test_tensorflow2_keras_process_sets.py`` against commlib.tensorflow.keras on tf-keras
(``TF_USE_LEGACY_KERAS=1``, as those files use Keras 2's API;
it also needs ``parameterized``, which the ``test`` extra installs; the script checks for it first). The shim package adds ``horovod.tensorflow`` (+ ``util``,
``keras``), ``horovod.keras`` and ``horovod.runner.common.util.env`` to horovod_compat.py's
(whose ``horovod.common.util`` serves the version check the Keras test imports).

Each test runs in its own job, ``mpiexec -n 2 python -m pytest FILE::Class::test_x``, under a timeout,
``--jobs`` at a time; ``--batch N`` runs N tests of a file per job instead (TensorFlow's import costs
seconds per rank and job), and a batch that does not finish is rerun one test per job. TensorFlow runs
each test twice, in graph and in eager mode, as subtests: a test passes when no half failed and one ran.
The tally goes to ``docs/results/horovod_test_tensorflow.md``: counts, and every failing or skipped test
with the first error line. ``-k SUBSTRING`` (repeatable) runs a subset; ``--output -`` prints the table.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from horovod_compat import COMMON, REPO, SHIMS, _reexport, mpiexec  # noqa: E402

_TF = (_reexport("commlib.tensorflow") +
       "from commlib.tensorflow import (_allreduce, _executing_eagerly, _grouped_allreduce,  # noqa: F401\n"
       "                                _grouped_reducescatter, _reducescatter, elastic, util)\n")
_TF_UTIL = _reexport("commlib.tensorflow.util") + "from commlib.tensorflow.util import _executing_eagerly  # noqa: F401\n"
_TF_KERAS = (_reexport("commlib.tensorflow.keras") +
             "from commlib.tensorflow.keras import callbacks, elastic  # noqa: F401\n")
_RUNNER_ENV = ('"""The launcher helper test_tensorflow_process_sets.py imports (written by scripts/horovod_compat_tf.py)."""\n'
               "import os\n\n\n"
               "def get_env_rank_and_size():\n"
               "    for r, s in (('PMI_RANK', 'PMI_SIZE'), ('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE')):\n"
               "        if os.environ.get(r) is not None and os.environ.get(s) is not None:\n"
               "            return int(os.environ[r]), int(os.environ[s])\n"
               "    return None\n")


class Suite:
    """Horovod's test files, the helper files beside them, the shim modules, each file's environment."""

    def __init__(self, files, helpers, shims, env=None):
        self.files, self.helpers, self.shims, self.env = files, helpers, shims, env or {}


SUITE = Suite(
    ["test_tensorflow.py", "test_tensorflow_process_sets.py", "test_tensorflow2_keras.py",
     "test_tensorflow2_keras_process_sets.py"],
    ["base_test_tensorflow.py"],
    {**SHIMS, "horovod/tensorflow/__init__.py": _TF, "horovod/tensorflow/util.py": _TF_UTIL,
     "horovod/tensorflow/keras/__init__.py": _TF_KERAS, "horovod/keras/__init__.py": _TF_KERAS,
     "horovod/runner/__init__.py": "",
     "horovod/runner/common/util/env.py": _RUNNER_ENV},
    env={"test_tensorflow2_keras.py": {"TF_USE_LEGACY_KERAS": "1"},
         "test_tensorflow2_keras_process_sets.py": {"TF_USE_LEGACY_KERAS": "1"},
         "*": {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}})


def find_parallel(path: Path, suite: Suite) -> Path:
    """The ``test/parallel`` directory of a Horovod checkout (or the directory of a test file given)."""
    if path.is_file():
        path = path.parent
    if (path / "test" / "parallel").is_dir():
        path = path / "test" / "parallel"
    missing = [f for f in suite.files + suite.helpers if not (path / f).is_file()]
    if missing:
        raise SystemExit(f"{path}: {', '.join(missing)} not found; pass a Horovod checkout "
                         "(git clone --depth 1 https://github.com/horovod/horovod)")
    return path


def list_tests(test_file: Path) -> list[str]:
    """``file::Class::test_name`` for every test method, in file order (read with ast: nothing is
    imported). A method made into several by ``parameterized.expand`` is marked with a trailing ``*``."""
    tree = ast.parse(test_file.read_text())
    out = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                expanded = any("expand" in ast.unparse(d) for d in item.decorator_list)
                out.append(f"{test_file.name}::{node.name}::{item.name}{'*' if expanded else ''}")
                LINES.append((test_file.name, item.lineno, item.end_lineno, f"{test_file.name}::{node.name}::{item.name}"))
    return out


#: (file, first line, last line, test) of every test listed: pytest names a skip by file and line only.
LINES: list[tuple[str, int, int, str]] = []


def test_at(file: str, line: int) -> str | None:
    """The test whose body holds ``file:line``."""
    for name, first, last, test in LINES:
        if name == file and first <= line <= last:
            return test
    return None


def build_tree(parallel: Path, suite: Suite, root: Path) -> Path:
    """Lay out the shim package and the tests; return the directory the jobs run in."""
    for module, text in suite.shims.items():
        target = root / "pkg" / module
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        for parent in target.relative_to(root / "pkg").parents:
            init = root / "pkg" / parent / "__init__.py"
            if parent != Path(".") and not init.exists():
                init.write_text("")
    where = root / "test" / "parallel"
    where.mkdir(parents=True)
    (root / "test" / "utils").mkdir()
    (root / "test" / "utils" / "common.py").write_text(COMMON)
    for name in suite.files + suite.helpers:
        shutil.copy(parallel / name, where / name)
    return where


_SUMMARY = re.compile(r"^(FAILED|ERROR|SKIPPED|XFAIL)\b.*")


def first_error(log: str, test: str | None = None) -> str:
    """The most telling line of a rank's pytest output about ``test`` (or any): its summary line, else
    the first ``E`` line."""
    short = test.split("::")[-1].rstrip("*") if test else ""
    for line in log.splitlines():
        if _SUMMARY.match(line) and short in line:
            line = re.sub(r"^(FAILED|ERROR) \S+ - ", "", line)
            return re.sub(r"^SKIPPED \[\d+\] \S+: ", "", line).strip()
    for line in log.splitlines():
        if line.startswith("E "):
            return line[2:].strip()
    tail = [line for line in log.splitlines() if line.strip()]
    return tail[-1].strip() if tail else "(no output)"


def hung_at(logs, files) -> str:
    """Where a hung test waited, from faulthandler's dump of the thread running the test (the one whose
    stack passes through a test file): its innermost frame, the innermost commlib frame, and the test's
    line."""
    for r, log in enumerate(logs):
        for block in re.split(r"\n(?=(?:Current thread|Thread) 0x)", log):
            frames = [line.strip() for line in block.splitlines() if line.strip().startswith("File ")]
            mine = [f for f in frames if any(name in f for name in files)]
            if mine:
                where = [frames[0]] + [f for f in frames[1:] if "commlib" in f][:1] + mine[:1]
                return f"; rank {r} waiting in " + " <- ".join(dict.fromkeys(where))
    return ""


def per_test(log: str) -> dict[str, str]:
    """``{test: passed/failed/skipped}`` from one rank's ``pytest -rA`` summary lines.

    TensorFlow's ``run_all_in_graph_and_eager_modes`` runs each test as two subtests: a failing subtest
    (``SUBFAILED[graph_mode] node``) fails the test, a skipped one (``SUBSKIPPED[...] [n] file:line``,
    which names a line, not the test, and counts the skips there) skips the test when both halves skipped;
    when one half skipped, the other half decides."""
    seen, skipped, subskipped = {}, set(), set()
    for line in log.splitlines():
        m = re.match(r"^(PASSED|FAILED|ERROR|SUBFAILED\[\w+\]) (\S+?::\S+?)(?: - .*)?$", line)
        if m:
            kind = "passed" if m.group(1) == "PASSED" else "failed"
            if seen.get(m.group(2)) != "failed":
                seen[m.group(2)] = kind
            continue
        m = re.match(r"^(SKIPPED|SUBSKIPPED\[\w+\]) \[(\d+)\] ([^:]+):(\d+)", line)
        if m:
            test = test_at(Path(m.group(3)).name, int(m.group(4)))
            if test is not None:  # (pytest counts the skips at one line: 2 subtests are both halves)
                both = m.group(1) == "SKIPPED" or int(m.group(2)) >= 2
                (skipped if both else subskipped).add(test)
    for test in skipped | subskipped:
        # skipped as a whole (eager mode, or no subtests); only a graph-mode half skipped: what the other
        # half did (passed or failed), else skipped
        if seen.get(test) != "failed" and (test in skipped or test not in seen):
            seen[test] = "skipped"
    return seen


def skip_reason(log: str, test: str) -> str | None:
    """Why ``test`` was skipped, from the ``SKIPPED``/``SUBSKIPPED`` line at a line of its body."""
    for line in log.splitlines():
        m = re.match(r"^(?:SKIPPED|SUBSKIPPED\[\w+\]) \[\d+\] ([^:]+):(\d+): (.*)$", line)
        if m and test_at(Path(m.group(1)).name, int(m.group(2))) == test.rstrip("*"):
            return m.group(3).strip()
    return None


def _node_ids(test: str) -> list[str]:
    """pytest arguments selecting ``test`` (a parameterized one through -k)."""
    if test.endswith("*"):
        file, cls, name = test.rstrip("*").split("::")
        return [f"{file}::{cls}", "-k", name]
    return [test]


def run_job(tests: list[str], where: Path, args, suite: Suite, tag: str) -> list[tuple[str, str, str, float]]:
    """Run ``tests`` (of one file) in one job on ``args.np`` ranks; (test, outcome, reason, seconds) each."""
    logs = where / "logs" / tag
    logs.mkdir(parents=True, exist_ok=True)
    selection = []
    if len(tests) == 1:
        selection = _node_ids(tests[0])
    else:
        file = tests[0].split("::")[0]
        names = " or ".join(t.split("::")[-1].rstrip("*") for t in tests)
        selection = [file, "-k", names]
    quoted = " ".join(f"'{a}'" for a in selection)
    # faulthandler_timeout: a test that hangs dumps every thread's stack into its rank log before the kill
    timeout = args.timeout * len(tests) if len(tests) > 1 else args.timeout
    inner = (f"exec {args.python} -m pytest -q -rA -p no:cacheprovider -W ignore::DeprecationWarning "
             f"-o faulthandler_timeout={max(args.timeout - 15, 5)} {quoted} > {logs}/rank$PMI_RANK.log 2>&1")
    command = [mpiexec(args.python), "-n", str(args.np), "sh", "-c", inner]
    file = tests[0].split("::")[0]
    env = dict(os.environ, COLUMNS="1000", **suite.env.get("*", {}), **suite.env.get(file, {}))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(where.parent.parent / "pkg"), os.environ.get("PYTHONPATH")]))
    start = time.monotonic()
    job = subprocess.Popen(command, cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           start_new_session=True, text=True)
    try:
        launcher, _ = job.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        launcher, _ = job.communicate()
        timed_out = True
    seconds = (time.monotonic() - start) / len(tests)
    ranks = [(logs / f"rank{r}.log").read_text(errors="replace") if (logs / f"rank{r}.log").exists() else ""
             for r in range(args.np)]
    if timed_out:
        if len(tests) > 1:
            return None
        return [(tests[0], "failed", f"timeout after {timeout} s (killed){hung_at(ranks, suite.files)}", seconds)]
    outcomes = [per_test(log) for log in ranks]
    results = []
    for test in tests:
        base = test.rstrip("*")
        file, cls, name = base.split("::")
        per_rank = []
        for seen in outcomes:
            kinds = [k for node, k in seen.items()
                     if node.startswith(f"{file}::{cls}::{name}") and
                     (node == f"{file}::{cls}::{name}" or test.endswith("*"))]
            per_rank.append("failed" if "failed" in kinds else "passed" if "passed" in kinds
                            else "skipped" if kinds else "missing")
        if all(r == "passed" for r in per_rank):
            results.append((test, "passed", "", seconds))
        elif all(r == "skipped" for r in per_rank):
            results.append((test, "skipped", skip_reason(ranks[0], test) or first_error(ranks[0], test), seconds))
        else:
            bad = [r for r, res in enumerate(per_rank) if res != "passed"]
            r = bad[0] if bad else 0
            reason = (f"rank {r}: {first_error(ranks[r], test)}" if per_rank[r] != "missing"
                      else f"rank {r}: no result (exit code {job.returncode}): {first_error(ranks[r] or launcher or '')}")
            results.append((test, "failed", reason, seconds))
    return results


def run_tests(tests, where, args, suite):
    """Each file's tests in batches of ``args.batch`` (a batch that timed out again one by one)."""
    jobs = []
    for file in dict.fromkeys(t.split("::")[0] for t in tests):
        mine = [t for t in tests if t.startswith(file + "::")]
        jobs += [mine[i:i + args.batch] for i in range(0, len(mine), args.batch)]

    def run(batch):
        tag = batch[0].replace("::", ".").rstrip("*") + (f"+{len(batch) - 1}" if len(batch) > 1 else "")
        out = run_job(batch, where, args, suite, tag)
        if out is None:
            out = [r for t in batch for r in run_job([t], where, args, suite, t.replace("::", ".").rstrip("*"))]
        return out

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for batch_results in pool.map(run, jobs):
            for result in batch_results:
                test, kind, reason, seconds = result
                print(f"{kind:8s} {seconds:5.1f}s {test.split('::')[-1]}  {reason}"[:240], flush=True)
                yield result


def render(results, args, suite_name, parallel: Path, files, command: str, elapsed: float, commit: str) -> str:
    counts = {k: sum(1 for r in results if r[1] == k) for k in ("passed", "failed", "skipped")}
    digests = ", ".join(f"{f} sha256 {hashlib.sha256((parallel / f).read_bytes()).hexdigest()[:12]}..."
                        for f in files)
    per_job = (f"each test in its own `mpiexec -n {args.np}` job" if args.batch == 1 else
               f"up to {args.batch} tests of a file per `mpiexec -n {args.np}` job (a batch that timed out "
               "rerun one test per job)")
    lines = [
        f"# Horovod's {suite_name} tests against commlib",
        "",
        f"- Command: `{command}`",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; commlib commit {commit}; "
        f"{digests} ({len(results)} tests)",
        f"- {per_job[0].upper() + per_job[1:]}, timeout {args.timeout} s per test, {args.jobs} job(s) at a "
        f"time on this machine; {elapsed:.0f} s in all.",
        "",
        f"**{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped** "
        f"(of {len(results)})",
        "",
    ]
    for file in files:
        mine = [r for r in results if r[0].startswith(file + "::")]
        if not mine:
            continue
        c = {k: sum(1 for r in mine if r[1] == k) for k in ("passed", "failed", "skipped")}
        lines.append(f"- `{file}`: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped")
    lines.append("")
    for kind in ("failed", "skipped"):
        rows = [r for r in results if r[1] == kind]
        if rows:
            lines += [f"## {kind.capitalize()} ({len(rows)})", "", "| test | first error line |", "|---|---|"]
            lines += [f"| {t.split('::')[0]}::{t.split('::')[-1].rstrip('*')} | {reason.replace('|', '/')[:300]} |"
                      for t, _, reason, _ in rows]
            lines.append("")
    passed = [r[0].split("::")[-1].rstrip("*") for r in results if r[1] == "passed"]
    lines += [f"## Passed ({len(passed)})", "", ", ".join(passed), ""]
    return "\n".join(lines)


def missing_modules(python: str, modules: list[str]) -> list[str]:
    """Those of ``modules`` that ``python`` cannot import."""
    probe = ("import importlib.util, sys\n"
             "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")
    done = subprocess.run([python, "-c", probe, *modules], capture_output=True, text=True, timeout=120)
    return done.stdout.split() if done.returncode == 0 else modules


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("horovod", type=Path, help="a Horovod checkout, or its test/parallel directory")
    parser.add_argument("-k", dest="select", action="append", default=[],
                        help="run only tests whose name contains this (repeatable)")
    parser.add_argument("--np", type=int, default=2, help="ranks per job (default 2)")
    parser.add_argument("--jobs", type=int, default=1, help="jobs at a time (default 1)")
    parser.add_argument("--batch", type=int, default=1, help="tests of a file per job (default 1)")
    parser.add_argument("--timeout", type=int, default=60, help="seconds per test before a job is killed "
                        "(default 60)")
    parser.add_argument("--python", default=sys.executable, help="the Python the ranks run (default: this one)")
    parser.add_argument("--output", default=None,
                        help="where the table goes (default docs/results/horovod_test_tensorflow.md); '-' prints it only")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (rank logs)")
    args = parser.parse_args(argv)

    suite = SUITE
    missing = missing_modules(args.python, ["pytest", "parameterized", "tensorflow", "tf_keras"])
    if missing:
        raise SystemExit(f"{args.python} cannot import {', '.join(missing)}, which Horovod's TensorFlow tests "
                         "need: pip install -e '.[test,tensorflow,keras]' (or bash scripts/venv.sh test)")
    parallel = find_parallel(args.horovod, suite)
    tests = [t for f in suite.files for t in list_tests(parallel / f)]
    if args.select:
        tests = [t for t in tests if any(s in t for s in args.select)]
    root = Path(tempfile.mkdtemp(prefix="horovod_compat_"))
    where = build_tree(parallel, suite, root)
    command = "python scripts/horovod_compat_tf.py " + " ".join(argv if argv is not None else sys.argv[1:])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    start = time.monotonic()
    try:
        results = list(run_tests(tests, where, args, suite))
    finally:
        if args.keep:
            print(f"logs kept in {root}/test/parallel/logs")
        else:
            shutil.rmtree(root, ignore_errors=True)
    table = render(results, args, "TensorFlow", parallel, suite.files, command, time.monotonic() - start, commit)
    output = args.output or str(REPO / "docs" / "results" / "horovod_test_tensorflow.md")
    if output == "-":
        print(table)
    else:
        Path(output).write_text(table)
        print(f"\nwrote {output}")
    counts = {k: sum(1 for r in results if r[1] == k) for k in ("passed", "failed", "skipped")}
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
