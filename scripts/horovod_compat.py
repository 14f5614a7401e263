#!/usr/bin/env python
"""Run Horovod's own torch test files against commlib.torch, unchanged, one MPI job per test.

Horovod's test suite is the yardstick for ``import commlib.torch as hvd`` being a drop-in. Its code is not
part of commlib: get a copy yourself, e.g.

    git clone --depth 1 https://github.com/horovod/horovod /tmp/horovod
    .venv/bin/python scripts/horovod_compat.py /tmp/horovod              # test/parallel/test_torch.py
    .venv/bin/python scripts/horovod_compat.py /tmp/horovod --test test/parallel/test_timeline.py
    .venv/bin/python scripts/horovod_compat.py /tmp/horovod/test/parallel/test_torch.py

What it builds in a temporary directory:
- a ``horovod`` package whose modules re-export commlib's: ``horovod.torch`` (commlib.torch),
  ``horovod.torch.mpi_ops`` (commlib.torch.mpi_ops), ``horovod.torch.elastic`` (commlib.torch.elastic),
  ``horovod.common.util`` (commlib.torch.util: ``env``, the build queries, the small list helpers);
  nothing of Horovod's own code;
- the test file, at the same place under ``test/`` as in Horovod's tree (its imports of ``../utils`` work),
  and ``test/utils/common.py``: Horovod's test files import three helpers from it
  (``mpi_env_rank_and_size``, ``skip_or_fail_gpu_test``, ``temppath``). Horovod's module also imports
  ``cloudpickle``, ``mock`` and ``horovod.runner``, so the harness writes its own short versions of those
  three helpers instead (same behaviour).

Then each test runs in its own job, ``mpiexec -n 2 python -m pytest test_x.py::Class::test_y``, under a
timeout (60 s), ``--jobs`` at a time, and the tally goes to ``docs/results/horovod_<test file>.md``:
counts, and every failing or skipped test with the first error line (pytest's summary line).
``-k SUBSTRING`` (repeatable) runs a subset while developing; ``--output -`` prints the table only.
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

REPO = Path(__file__).resolve().parent.parent

def _reexport(module: str) -> str:
    return (f"# Horovod's module, served by {module} (written by commlib's scripts/horovod_compat.py).\n"
            f"from {module} import *  # noqa: F401,F403\n")


#: The shim package: module path under pkg/ -> its text.
SHIMS = {
    "horovod/__init__.py": "",
    "horovod/torch/__init__.py": _reexport("commlib.torch"),
    "horovod/torch/mpi_ops.py": _reexport("commlib.torch.mpi_ops"),
    "horovod/common/__init__.py": "",
    "horovod/common/util.py": _reexport("commlib.torch.util"),
    "horovod/torch/elastic/__init__.py": _reexport("commlib.torch.elastic"),
    "horovod/torch/elastic/sampler.py": _reexport("commlib.torch.elastic.sampler"),
    "horovod/torch/elastic/state.py": _reexport("commlib.torch.elastic.state"),
}
DEFAULT_TEST = Path("test") / "parallel" / "test_torch.py"

COMMON = '''"""The three helpers Horovod's test_torch.py imports from test/utils/common.py (written by commlib's
scripts/horovod_compat.py; Horovod's own module needs cloudpickle, mock and horovod.runner)."""
import contextlib
import os
import tempfile


def mpi_env_rank_and_size():
    """Rank and size as the MPI launcher exported them; (0, 1) outside MPI."""
    for rank_var, size_var in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if os.environ.get(rank_var) is not None and os.environ.get(size_var) is not None:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


def skip_or_fail_gpu_test(test, message):
    """Fail when HOROVOD_TEST_GPU=1 says GPUs are required, else skip."""
    if int(os.environ.get("HOROVOD_TEST_GPU", 0)):
        test.fail(message)
    else:
        test.skipTest(message)


@contextlib.contextmanager
def temppath():
    """A path inside a fresh temporary directory, removed afterwards."""
    directory = tempfile.TemporaryDirectory()
    try:
        yield os.path.join(directory.name, "temp_test_file")
    finally:
        directory.cleanup()
'''


def find_test_file(path: Path, test: Path | None = None) -> tuple[Path, Path]:
    """(the test file, its place under Horovod's tree): ``test`` (default test/parallel/test_torch.py) inside
    the checkout ``path``, or ``path`` itself when it is a file (placed by its last two path parts)."""
    if path.is_dir():
        place = test or DEFAULT_TEST
        path = path / place
    else:
        place = Path("test") / path.parent.name / path.name
    if not path.is_file():
        raise SystemExit(f"{path}: not found; pass a Horovod checkout (and --test test/parallel/test_x.py) or a "
                         "test file (git clone --depth 1 https://github.com/horovod/horovod)")
    return path, place


def list_tests(test_file: Path) -> list[str]:
    """``Class::test_name`` for every test method, in file order (read with ast: nothing is imported)."""
    tree = ast.parse(test_file.read_text())
    return [f"{node.name}::{item.name}" for node in tree.body if isinstance(node, ast.ClassDef)
            for item in node.body if isinstance(item, ast.FunctionDef) and item.name.startswith("test")]


def build_tree(test_file: Path, place: Path, root: Path) -> Path:
    """Lay out the shim package and the test; return the directory the jobs run in."""
    for module, text in SHIMS.items():
        (root / "pkg" / module).parent.mkdir(parents=True, exist_ok=True)
        (root / "pkg" / module).write_text(text)
    where = root / place.parent
    where.mkdir(parents=True, exist_ok=True)
    (root / "test" / "utils").mkdir(parents=True, exist_ok=True)
    (root / "test" / "utils" / "common.py").write_text(COMMON)
    shutil.copy(test_file, where / place.name)
    return where


def mpiexec(python: str) -> str:
    beside = Path(python).parent / "mpiexec"
    return str(beside) if beside.exists() else (shutil.which("mpiexec") or "mpiexec")


_SUMMARY = re.compile(r"^(FAILED|ERROR|SKIPPED|XFAIL)\b.*")


def first_error(log: str) -> str:
    """The most telling line of a rank's pytest output: its summary line, else the first ``E`` line."""
    for line in log.splitlines():
        if _SUMMARY.match(line):
            line = re.sub(r"^(FAILED|ERROR) \S+ - ", "", line)
            return re.sub(r"^SKIPPED \[\d+\] \S+: ", "", line).strip()
    for line in log.splitlines():
        if line.startswith("E "):
            return line[2:].strip()
    tail = [line for line in log.splitlines() if line.strip()]
    return tail[-1].strip() if tail else "(no output)"


def hung_at(logs, test_name: str) -> str:
    """Where a hung test waited, from faulthandler's dump of the thread running the test (the one whose
    stack passes through the test file): its innermost frame, the innermost commlib frame, and the test's
    line (an innermost frame inside importlib alone cannot tell which import, or whose C code, blocked)."""
    for r, log in enumerate(logs):
        for block in re.split(r"\n(?=(?:Current thread|Thread) 0x)", log):
            frames = [line.strip() for line in block.splitlines() if line.strip().startswith("File ")]
            if frames and any(test_name in f for f in frames):
                where = [frames[0]]
                where += [f for f in frames[1:] if "commlib" in f][:1]
                where += [f for f in frames if test_name in f][:1]
                return f"; rank {r} waiting in " + " <- ".join(dict.fromkeys(where))
    return ""


def outcome(log: str) -> str:
    """passed / failed / skipped as one rank's pytest summary says."""
    last = [line for line in log.splitlines() if re.search(r"\b(passed|failed|skipped|error)\b", line)]
    final = last[-1] if last else ""
    if re.search(r"\b(failed|error)\b", final):
        return "failed"
    if "passed" in final:
        return "passed"
    if "skipped" in final:
        return "skipped"
    return "failed"


def run_one(test: str, where: Path, args) -> tuple[str, str, str, float]:
    """Run one test on ``args.np`` ranks; return (test, outcome, reason, seconds)."""
    logs = where / "logs" / test.replace("::", ".")
    logs.mkdir(parents=True, exist_ok=True)
    # faulthandler_timeout: a test that hangs dumps every thread's stack into its rank log before the kill;
    # the rank from MPICH's PMI_RANK or Open MPI's OMPI_COMM_WORLD_RANK
    inner = (f"exec {args.python} -m pytest -q -rfEs -p no:cacheprovider -W ignore::DeprecationWarning "
             f"-o faulthandler_timeout={max(args.timeout - 15, 5)} "
             f"{args.test_name}::{test} > {logs}/rank${{PMI_RANK:-${{OMPI_COMM_WORLD_RANK:-0}}}}.log 2>&1")
    command = [mpiexec(args.python), "-n", str(args.np), "sh", "-c", inner]
    env = dict(os.environ, COLUMNS="1000", PYTHONPATH=os.pathsep.join(filter(None, [str(args.root / "pkg"),
                                                                    os.environ.get("PYTHONPATH")])))
    start = time.monotonic()
    job = subprocess.Popen(command, cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           start_new_session=True, text=True)
    try:
        launcher, _ = job.communicate(timeout=args.timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        launcher, _ = job.communicate()
        timed_out = True
    seconds = time.monotonic() - start
    ranks = [(logs / f"rank{r}.log").read_text(errors="replace") if (logs / f"rank{r}.log").exists() else ""
             for r in range(args.np)]
    if timed_out:
        return test, "failed", f"timeout after {args.timeout} s (killed){hung_at(ranks, args.test_name)}", seconds
    results = [outcome(log) for log in ranks]
    if all(r == "passed" for r in results) and job.returncode == 0:
        return test, "passed", "", seconds
    if all(r == "skipped" for r in results) and job.returncode == 0:
        return test, "skipped", first_error(ranks[0]), seconds
    bad = [r for r, res in enumerate(results) if res == "failed"]
    if bad:
        return test, "failed", f"rank {bad[0]}: {first_error(ranks[bad[0]])}", seconds
    return test, "failed", f"exit code {job.returncode}: {first_error(launcher or '')}", seconds


def render(results, args, test_file: Path, command: str, elapsed: float, commit: str) -> str:
    counts = {k: sum(1 for r in results if r[1] == k) for k in ("passed", "failed", "skipped")}
    digest = hashlib.sha256(test_file.read_bytes()).hexdigest()[:12]
    lines = [
        f"# Horovod's {args.test_name} against commlib.torch",
        "",
        f"- Command: `{command}`",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; commlib commit {commit}; "
        f"test file sha256 {digest}... ({len(results)} tests)",
        f"- Each test in its own `mpiexec -n {args.np}` job, timeout {args.timeout} s, {args.jobs} job(s) at a "
        f"time on this machine; {elapsed:.0f} s in all.",
        "",
        f"**{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped** "
        f"(of {len(results)})",
        "",
    ]
    for kind in ("failed", "skipped"):
        rows = [r for r in results if r[1] == kind]
        if rows:
            lines += [f"## {kind.capitalize()} ({len(rows)})", "", "| test | first error line |", "|---|---|"]
            lines += [f"| {t.split('::')[-1]} | {reason.replace('|', '/')[:300]} |" for t, _, reason, _ in rows]
            lines.append("")
    passed = [r[0].split("::")[-1] for r in results if r[1] == "passed"]
    lines += [f"## Passed ({len(passed)})", "", ", ".join(passed), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("horovod", type=Path, help="a Horovod checkout, or one of its test files")
    parser.add_argument("--test", type=Path, default=None,
                        help="the test file inside the checkout (default test/parallel/test_torch.py)")
    parser.add_argument("-k", dest="select", action="append", default=[],
                        help="run only tests whose name contains this (repeatable)")
    parser.add_argument("--np", type=int, default=2, help="ranks per job (default 2)")
    parser.add_argument("--jobs", type=int, default=1, help="jobs at a time (default 1)")
    parser.add_argument("--timeout", type=int, default=60, help="seconds before a job is killed (default 60)")
    parser.add_argument("--python", default=sys.executable, help="the Python the ranks run (default: this one)")
    parser.add_argument("--output", default=None,
                        help="where the table goes (default docs/results/horovod_<test file>.md); '-' prints it only")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (rank logs)")
    args = parser.parse_args(argv)

    test_file, place = find_test_file(args.horovod, args.test)
    args.test_name = place.name
    if args.output is None:
        args.output = str(REPO / "docs" / "results" / f"horovod_{place.stem}.md")
    tests = list_tests(test_file)
    if args.select:
        tests = [t for t in tests if any(s in t for s in args.select)]
    root = Path(tempfile.mkdtemp(prefix="horovod_compat_"))
    args.root = root
    where = build_tree(test_file, place, root)
    command = "python scripts/horovod_compat.py " + " ".join(argv if argv is not None else sys.argv[1:])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    start = time.monotonic()
    results = []
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for result in pool.map(lambda t: run_one(t, where, args), tests):
                results.append(result)
                test, kind, reason, seconds = result
                print(f"{kind:8s} {seconds:5.1f}s {test.split('::')[-1]}  {reason}"[:240], flush=True)
    finally:
        if args.keep:
            print(f"logs kept in {root}/test/parallel/logs")
        else:
            shutil.rmtree(root, ignore_errors=True)
    table = render(results, args, test_file, command, time.monotonic() - start, commit)
    if args.output == "-":
        print(table)
    else:
        Path(args.output).write_text(table)
        print(f"\nwrote {args.output}")
    counts = {k: sum(1 for r in results if r[1] == k) for k in ("passed", "failed", "skipped")}
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
