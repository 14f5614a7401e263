"""Launch a Python script on N real MPI processes under a timeout; kill the whole job if it hangs.

Tests call :func:`run_mpi` (or :func:`run_mpmd`, :func:`run_on_cluster`). A worker written with
``tests/spmd.py`` reports each named case per rank; these functions read that report and fail naming the
case and the rank that failed, the cases a rank never finished, or where each rank was when the job timed
out (after every thread's Python stack on every rank: :func:`_dump_stacks`). A test that launches a job
must carry the marker of its kind (``mpi``; ``cluster`` on emulated hosts): :func:`require_marker` fails
it otherwise, so ``pytest -m "not mpi and not cluster"`` stays the in-process tests (docs/testing.md).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from spmd import MARK, REPORT_FILE, REPORTS

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def mpiexec() -> str:
    """The ``mpiexec`` beside this Python (the embedded MPICH wheel's), else the one on PATH."""
    from commlib.testing.cluster import find_mpiexec

    return find_mpiexec()


_TARGET = """
import ctypes, os, sys
buf = ctypes.create_string_buffer(b"commlib-cma-probe", 32)
print(os.getpid(), ctypes.addressof(buf), flush=True)
sys.stdin.read()
"""

_READER = """
import ctypes, sys
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
libc = ctypes.CDLL(None, use_errno=True)
pid, address = int(sys.argv[1]), int(sys.argv[2])
buf = ctypes.create_string_buffer(32)
local, remote = iovec(ctypes.addressof(buf), 17), iovec(address, 17)
got = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
print("ok" if got == 17 and buf.raw[:17] == b"commlib-cma-probe" else f"refused {ctypes.get_errno()}")
"""


@functools.lru_cache(maxsize=None)
def cross_memory_attach_permitted() -> bool:
    """Whether this kernel lets one process read a sibling's memory (``process_vm_readv``), as the
    ranks of an MPI job are siblings. Found out independently of commlib, so that the tests can check
    commlib's own probe against it (set as CMA_EXPECTED=1/0 in every job's environment)."""
    if not sys.platform.startswith("linux"):
        return False
    target = subprocess.Popen([sys.executable, "-c", _TARGET], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        pid, address = target.stdout.readline().split()
        reader = subprocess.run([sys.executable, "-c", _READER, pid, address], capture_output=True, text=True,
                                timeout=30)
        return reader.stdout.strip() == "ok"
    finally:
        target.communicate(input="", timeout=30)


class MPIJobFailed(AssertionError):
    """The MPI job exited non-zero or timed out, or a rank did not pass its cases; the message says which
    case on which rank, and carries the job's output."""


class UnmarkedTest(AssertionError):
    """A test launched a kind of job its markers do not declare."""


#: (node id, marker names) of the test pytest is running, set by tests/conftest.py; None outside pytest
current_test: tuple[str, frozenset[str]] | None = None


def require_marker(*kinds: str) -> None:
    """Fail the running test unless it carries one of ``kinds`` (``mpi``, ``cluster``): a test that starts
    MPI jobs or emulated hosts must say so, or ``-m "not mpi and not cluster"`` would run it."""
    if current_test is None:
        return
    nodeid, markers = current_test
    if not markers & set(kinds):
        raise UnmarkedTest(f"{nodeid} launches {' or '.join(kinds)} work but is not marked: add "
                           f"@pytest.mark.{kinds[0]} (or pytestmark = pytest.mark.{kinds[0]} for the module); "
                           "see docs/testing.md")


# -- the report of the workers' named cases (tests/spmd.py) ---------------------------------------------

@dataclasses.dataclass
class Report:
    """What the ranks of a job reported: per rank its planned cases, each case's result line, and whether
    it reached the end of its plan."""

    plans: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    results: dict[int, dict[str, dict]] = dataclasses.field(default_factory=dict)
    done: set[int] = dataclasses.field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.plans or self.results)

    def passed(self, case: str) -> set[int]:
        """The ranks on which ``case`` passed."""
        return {rank for rank, cases in self.results.items() if cases.get(case, {}).get("result") == "ok"}

    def failures(self) -> list[str]:
        return [f"case {name!r} failed on rank {rank}: {line.get('error', '')}"
                for rank, cases in sorted(self.results.items()) for name, line in cases.items()
                if line.get("result") == "failed"]

    def unfinished(self, rank: int) -> str:
        """Where ``rank`` stopped: 'in case X' (the first planned case it did not report), or why not."""
        if rank not in self.plans:
            return "reported no plan (it failed or was killed before its first case)"
        results = self.results.get(rank, {})
        left = [c for c in self.plans[rank] if results.get(c, {}).get("result") not in ("ok", "skipped")]
        return f"in case {left[0]!r}" if left else "after its last case"

    def problems(self, ranks, cases=(), size: int | None = None) -> list[str]:
        """Why the job does not pass: a failed case, a rank of ``ranks`` without a plan or that stopped
        early, a case of ``cases`` that did not pass on one of them, a report from a rank beyond ``size``."""
        found = self.failures()
        for rank in ranks:
            if rank not in self.done:
                found.append(f"rank {rank} did not finish its cases: {self.unfinished(rank)}")
            for name in cases:
                if rank in self.plans and self.results.get(rank, {}).get(name, {}).get("result") != "ok":
                    state = self.results.get(rank, {}).get(name, {}).get("result", "not run")
                    found.append(f"case {name!r} did not pass on rank {rank} ({state})")
        extra = sorted(r for r in self.plans if size is not None and not 0 <= r < size)
        if extra:
            found.append(f"ranks {extra} reported cases but the job's script runs on ranks 0-{size - 1} only")
        return found


_LINE = re.compile(re.escape(MARK) + r"(\{.*)")


def read_report(out: str, reports: str | Path | None = None) -> Report:
    """The ``@spmd`` lines in a job's output (another rank's text may share a line: each is decoded where
    it starts), then those the ranks appended to files in ``reports`` (``SPMD_REPORTS``: a rank that aborts
    the job may be killed before the launcher forwards its output)."""
    report, decoder = Report(), json.JSONDecoder()
    texts = [out]
    if reports:
        files = sorted(Path(reports).glob(REPORT_FILE.format(rank="*")))
        texts += [f.read_text(errors="replace") for f in files]
    for match in (m for text in texts for m in _LINE.finditer(text)):
        try:
            line = decoder.raw_decode(match.group(1))[0]
        except ValueError:
            continue
        rank = line["rank"]
        if "plan" in line:
            report.plans[rank] = line["plan"]
        elif "case" in line:
            report.results.setdefault(rank, {})[line["case"]] = line
        elif "done" in line:
            report.done.add(rank)
    return report


def check_report(out: str, ranks, cases=(), what: str = "the job") -> None:
    """Raise MPIJobFailed unless every rank of ``ranks`` ran its whole plan (``cases`` passed among it),
    for a job a test launched itself (an MPMD job on an emulated cluster)."""
    _checked(out, what, None, None, ranks, cases, True)


def uses_spmd(script: str | Path) -> bool:
    """Whether a worker reports named cases (it imports tests/spmd.py)."""
    try:
        text = Path(script).read_text(errors="replace")
    except OSError:
        return False
    return re.search(r"^\s*(import spmd|from spmd import)", text, re.M) is not None


def _checked(out: str, command: str, failed: str | None, size: int | None, ranks, cases, report: bool,
             tail: int = 6000, reports: str | None = None) -> None:
    """Raise MPIJobFailed when the job failed (``failed``: how) or, with ``report``, when its ranks did not
    all pass their cases (read from the output and ``reports``); the message leads with the failing case and
    rank, and ends with the last ``tail`` characters of the job's output."""
    got = read_report(out, reports)
    problems = got.problems(ranks, cases, size) if report else got.failures()
    if failed is None and not problems:
        return
    if failed and failed.startswith("timed out") and report:
        failed += "; " + ", ".join(f"rank {r} {got.unfinished(r)}" for r in ranks)
    lines = problems[:8] + ([failed] if failed else [])
    raise MPIJobFailed("\n".join(lines) + f"\n{command}\n{out[-tail:]}")


#: How much of a timed-out job's output its error keeps: every rank's stacks (:func:`_dump_stacks`).
STACKS_TAIL = 40000
#: How long a timed-out job's ranks get to print their stacks before the job is killed.
STACKS_GRACE_S = 15.0


def _dump_stacks(proc: subprocess.Popen) -> str:
    """End a job that ran out of time, first making every Python process under its launcher print each
    thread's stack (SIGABRT; ``PYTHONFAULTHANDLER=1`` from :func:`job_env` makes Python print them on that
    signal, then the process dies), so that a hang shows where every rank waited. Returns the job's whole
    output; whatever is left of the job after ``STACKS_GRACE_S`` is killed."""
    for pid in _descendants(proc.pid):  # (hydra's proxies call setsid: found by parent)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                program = os.path.basename(f.read().split(b"\0")[0].decode(errors="replace"))
            if program.startswith("python"):  # the ranks, not the launcher's proxies
                os.kill(pid, signal.SIGABRT)
        except OSError:  # gone meanwhile
            pass
    try:
        out, _ = proc.communicate(timeout=STACKS_GRACE_S)  # (a retried communicate loses no output)
    except subprocess.TimeoutExpired:
        out = None
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # what is left: the launcher
    except ProcessLookupError:
        pass
    return out if out is not None else proc.communicate()[0]


def _descendants(root: int) -> list[int]:
    """The processes below ``root`` (Linux /proc; none elsewhere)."""
    parent_of = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent_of[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])  # after the name: state, ppid
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = [], {root}
    while frontier:
        frontier = {pid for pid, parent in parent_of.items() if parent in frontier}
        found.extend(frontier)
    return found


def mpich_leftovers() -> set[Path]:
    """What an MPICH job that aborts or is killed leaves behind: its shared-memory segments (a few MB each)
    and hydra's topology file (written to /tmp whatever TMPDIR says, removed only when mpiexec ends well)."""
    return set(Path("/dev/shm").glob("mpich_shm_*")) | set(Path("/tmp").glob("hydra_hwloc_xmlfile_*"))


def remove_new_leftovers(before: set[Path]) -> None:
    """Remove what a job that failed left behind (:func:`mpich_leftovers`); the tests run one job at a
    time, so what appeared while it ran is its own."""
    for leftover in mpich_leftovers() - before:
        try:
            leftover.unlink()
        except OSError:
            pass


def worker_path(script: str | Path) -> Path:
    """``script`` as given when it exists, else the worker of that name in ``tests/<area>/workers/``
    (worker names are unique in the tree)."""
    path = Path(script)
    if path.is_absolute() or path.exists():
        return path
    found = sorted(TESTS.glob(f"*/workers/{path}"))
    if len(found) != 1:
        raise FileNotFoundError(f"{script}: {'no' if not found else 'more than one'} worker of that name in "
                                f"tests/<area>/workers/ {[str(f.relative_to(REPO)) for f in found]}")
    return found[0]


def job_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a test job: this one without any COMMLIB_* setting, unbuffered output,
    CMA_EXPECTED, COMMLIB_AUTO_CACHE=none (a job neither starts from nor keeps what auto settled: otherwise
    it would depend on the tests before it), then ``env``; the repository and tests/ (the workers' helpers:
    spmd.py, torch_common.py) come first on the import path, before any PYTHONPATH ``env`` gives."""
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    full_env.setdefault("PYTHONFAULTHANDLER", "1")  # a rank's fatal signal prints its threads' stacks
    full_env["CMA_EXPECTED"] = "1" if cross_memory_attach_permitted() else "0"
    for key in [k for k in full_env if k.startswith("COMMLIB_")]:
        del full_env[key]
    full_env["COMMLIB_AUTO_CACHE"] = "none"
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(filter(None, [
        str(REPO), str(TESTS), *full_env.get("PYTHONPATH", "").split(os.pathsep)])))
    return full_env


def run_mpi(nprocs: int, script: str | Path, *args: str, timeout: float = 120.0,
            env: dict[str, str] | None = None, expect_fail: bool = False, extra: list[str] = (),
            ranks=None, cases=(), report: bool | None = None) -> str:
    """Run ``python script args`` on ``nprocs`` ranks; return combined stdout+stderr.

    ``script`` is a path, or the name of a worker in ``tests/<area>/workers/``. On timeout the whole
    process group is killed and :class:`MPIJobFailed` is raised, so no test can hang CI. With
    ``expect_fail`` the job must exit non-zero (within the timeout) instead.

    A worker that reports named cases (tests/spmd.py; ``report``: whether to require it, by default when
    the script imports spmd) must have run its whole plan on every rank of ``ranks`` (default: all
    ``nprocs``; a job that ends on purpose ends after them), and each of ``cases`` must have passed there.
    """
    require_marker("mpi", "cluster")
    path = worker_path(script)
    with tempfile.TemporaryDirectory(prefix="spmd-") as reports:
        full_env = job_env({REPORTS: reports, **(env or {})})
        cmd = [mpiexec(), "-n", str(nprocs), sys.executable, str(path), *map(str, args), *extra]
        left_before = mpich_leftovers()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env,
                                start_new_session=True, text=True)
        command = " ".join(cmd)
        ranks = list(range(nprocs)) if ranks is None else list(ranks)
        report = uses_spmd(path) if report is None else report
        checked = functools.partial(_checked, command=command, size=nprocs, ranks=ranks, cases=cases,
                                    report=report, reports=reports)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out = _dump_stacks(proc)
            remove_new_leftovers(left_before)
            checked(out, failed=f"timed out after {timeout}s", tail=STACKS_TAIL)
        if proc.returncode != 0:
            remove_new_leftovers(left_before)
        if expect_fail and proc.returncode == 0:
            checked(out, failed="expected the job to fail, but it succeeded")
        checked(out, failed=None if expect_fail or proc.returncode == 0 else f"exit code {proc.returncode}")
    return out


def run_mpmd(workers: int, servers: int, script: str | Path, *args: str, timeout: float = 120.0,
             env: dict[str, str] | None = None, expect_fail: bool = False, **report) -> str:
    """:func:`run_mpi` for an MPMD job: ``python script args`` on ``workers`` ranks, then ``servers``
    summation servers (``python -m commlib.server``) as further ranks of the same job; the workers report
    (``report``: run_mpi's ``ranks``, ``cases``, ``report``)."""
    return run_mpi(workers, script, *args, timeout=timeout, env=env, expect_fail=expect_fail,
                   extra=[":", "-n", str(servers), sys.executable, "-m", "commlib.server"], **report)


def run_on_cluster(cluster, script: str | Path, *args: str, timeout: float = 120.0,
                   env: dict[str, str] | None = None, cases=(), report: bool | None = None) -> str:
    """Run ``python script args`` on every rank of an emulated cluster (commlib.testing.cluster) under
    ``timeout``, through ``tests/testing/workers/on_cluster.py``, which first checks (its case
    ``node_layout``) that commlib sees the cluster's node layout from MPI; return combined stdout+stderr,
    raise :class:`MPIJobFailed` on failure, and read the report as :func:`run_mpi` does, on every rank."""
    from commlib.testing.cluster import JobFailed

    require_marker("cluster")
    path = worker_path(script)
    layout = ",".join(map(str, cluster.ranks_per_host))
    command = [sys.executable, str(worker_path("on_cluster.py")), layout, str(path), *map(str, args)]
    report = uses_spmd(path) if report is None else report
    left_before = mpich_leftovers()
    with tempfile.TemporaryDirectory(prefix="spmd-") as reports:
        try:
            job = job_env({REPORTS: reports, **(env or {})})
            out = cluster.mpiexec(command, timeout=timeout, env=job).stdout
        except JobFailed as exc:
            remove_new_leftovers(left_before)
            failed = str(exc).split(":", 1)[0] + f" on cluster {cluster.name}"  # "timed out after 300s", "exit code 1"
            _checked(exc.completed.stdout or "", " ".join(command), failed, cluster.size, range(cluster.size),
                     cases, report, reports=reports)
        _checked(out, " ".join(command), None, cluster.size, range(cluster.size),
                 ("node_layout", *cases) if report else cases, report, reports=reports)
    return out
