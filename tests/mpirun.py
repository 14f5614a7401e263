"""Launch a Python script on N real MPI processes under a timeout; kill the whole job if it hangs.

Tests call :func:`run_mpi`; the script they launch asserts on every rank and exits non-zero on failure,
which makes ``mpiexec`` fail the job.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"


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
    """The MPI job exited non-zero or timed out; the message carries its output."""


def _mpich_shm_files() -> set[Path]:
    return set(Path("/dev/shm").glob("mpich_shm_*"))


def _remove_new_mpich_shm(before: set[Path]) -> None:
    """A job that aborted or was killed leaves MPICH's shared-memory segments behind (a few MB each); the
    tests run one job at a time, so what appeared while it ran is its own."""
    for leftover in _mpich_shm_files() - before:
        try:
            leftover.unlink()
        except OSError:
            pass


def worker_path(script: str | Path) -> Path:
    """``script`` as given when it exists, else the file of that name under ``tests/workers/``."""
    path = Path(script)
    return path if path.is_absolute() or path.exists() else WORKERS / path


def job_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a test job: this one without any COMMLIB_* setting, the repository on the
    import path, unbuffered output, CMA_EXPECTED, COMMLIB_AUTO_CACHE=none (a job neither starts from nor
    keeps what auto settled: otherwise it would depend on the tests before it), then ``env``."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full_env.get("PYTHONPATH", "")]))
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    full_env["CMA_EXPECTED"] = "1" if cross_memory_attach_permitted() else "0"
    for key in [k for k in full_env if k.startswith("COMMLIB_")]:
        del full_env[key]
    full_env["COMMLIB_AUTO_CACHE"] = "none"
    full_env.update(env or {})
    return full_env


def run_mpi(nprocs: int, script: str | Path, *args: str, timeout: float = 120.0,
            env: dict[str, str] | None = None, expect_fail: bool = False, extra: list[str] = ()) -> str:
    """Run ``python script args`` on ``nprocs`` ranks; return combined stdout+stderr.

    ``script`` is a path, or a file name under ``tests/workers/``. On timeout the whole process group is
    killed and :class:`MPIJobFailed` is raised, so no test can hang CI. With ``expect_fail`` the job must
    exit non-zero (within the timeout) instead.
    """
    path = worker_path(script)
    full_env = job_env(env)
    cmd = [mpiexec(), "-n", str(nprocs), sys.executable, str(path), *map(str, args), *extra]
    shm_before = _mpich_shm_files()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env,
                            start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        _remove_new_mpich_shm(shm_before)
        raise MPIJobFailed(f"timed out after {timeout}s: {' '.join(cmd)}\n{out[-6000:]}") from None
    if proc.returncode != 0:
        _remove_new_mpich_shm(shm_before)
    if expect_fail:
        if proc.returncode == 0:
            raise MPIJobFailed(f"expected failure but job succeeded: {' '.join(cmd)}\n{out[-6000:]}")
    elif proc.returncode != 0:
        raise MPIJobFailed(f"exit code {proc.returncode}: {' '.join(cmd)}\n{out[-6000:]}")
    return out


def run_mpmd(workers: int, servers: int, script: str | Path, *args: str, timeout: float = 120.0,
             env: dict[str, str] | None = None, expect_fail: bool = False) -> str:
    """:func:`run_mpi` for an MPMD job: ``python script args`` on ``workers`` ranks, then ``servers``
    summation servers (``python -m commlib.server``) as further ranks of the same job."""
    return run_mpi(workers, script, *args, timeout=timeout, env=env, expect_fail=expect_fail,
                   extra=[":", "-n", str(servers), sys.executable, "-m", "commlib.server"])


def run_on_cluster(cluster, script: str | Path, *args: str, timeout: float = 120.0,
                   env: dict[str, str] | None = None) -> str:
    """Run ``python script args`` on every rank of an emulated cluster (commlib.testing.cluster) under
    ``timeout``, through ``workers/on_cluster.py``, which first checks that commlib sees the cluster's
    node layout from MPI; return combined stdout+stderr, raise :class:`MPIJobFailed` on failure."""
    from commlib.testing.cluster import JobFailed

    layout = ",".join(map(str, cluster.ranks_per_host))
    command = [sys.executable, str(WORKERS / "on_cluster.py"), layout, str(worker_path(script)), *map(str, args)]
    shm_before = _mpich_shm_files()
    try:
        return cluster.mpiexec(command, timeout=timeout, env=job_env(env)).stdout
    except JobFailed as exc:
        _remove_new_mpich_shm(shm_before)
        raise MPIJobFailed(str(exc)) from None
