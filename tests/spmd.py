"""Named cases on every rank of an MPI job, as mpi4py's own tests run under mpiexec.

A worker script registers its checks with :func:`case` and ends with :func:`main`::

    @spmd.case
    def allreduce_sum():
        assert (cl.allreduce(np.ones(3), op=cl.Sum) == cl.size()).all()

    if __name__ == "__main__":
        spmd.main()

Every rank runs the cases in the order they were defined and prints one line per case, ``@spmd {json}``:
first the plan (``{"rank": 0, "size": 2, "plan": [...]}``), then each case's result (``"ok"``, ``"skipped"``
or ``"failed"`` with the error), then ``{"done": n}``. ``tests/mpirun.py`` reads these lines: a test fails
naming the case and the rank, and a rank that stopped early (or a case that never ran) is caught too.
Where the launcher names a directory in ``SPMD_REPORTS``, each rank also appends its lines to a file there.
The first failing case prints its traceback and aborts the whole job, so no rank waits for one that
failed.

The rank comes from the launcher's environment (hydra's ``PMI_RANK``, Open MPI's ``OMPI_COMM_WORLD_RANK``,
torchrun's ``RANK``), so a worker may import mpi4py and initialise MPI when and how its cases need
(``mpi4py.rc``, ``init()``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Iterable

MARK = "@spmd "
#: A directory (set by tests/mpirun.py) where each rank also appends its lines: a rank that aborts the job
#: may be killed before the launcher forwards its output, and its failure must still be read.
REPORTS = "SPMD_REPORTS"
REPORT_FILE = "rank-{rank}.spmd"  # a rank's file there
_CASES: dict[str, Callable[[], None]] = {}
_FIRST: list[str] = []  # cases every plan begins with, whatever is selected


def case(func: Callable[[], None]) -> Callable[[], None]:
    """Register ``func`` as a case named after it; cases run in the order they are defined."""
    if func.__name__ in _CASES:
        raise ValueError(f"two cases named {func.__name__!r}")
    _CASES[func.__name__] = func
    return func


def first_case(func: Callable[[], None]) -> Callable[[], None]:
    """Register ``func`` as a case that every plan of this process begins with (tests/testing/workers/
    on_cluster.py's check of the node layout, before the worker it runs)."""
    case(func)
    _FIRST.append(func.__name__)
    return func


def rank_cases(rank_and_size: Callable[[], tuple[int, int]], *checks: Callable[[int, int], None]) -> None:
    """Register each ``check(rank, size)`` as a case named after it (less a ``check_`` prefix), called with
    ``rank_and_size()`` when it runs (after the worker's own init case, e.g. ``lambda: (hvd.rank(),
    hvd.size())``)."""
    for check in checks:
        def run_check(check=check):
            check(*rank_and_size())
        run_check.__name__ = check.__name__.removeprefix("check_")
        case(run_check)


class Skip(Exception):
    """Raised by :func:`skip`: the case does not apply to this job (reported, not failed)."""


def skip(reason: str) -> None:
    """End the current case as skipped on this rank (e.g. it needs more ranks than the job has)."""
    raise Skip(reason)


def rank_and_size() -> tuple[int, int]:
    """This process's rank in the job and the job's size, from the launcher (MPI need not be initialised)."""
    for rank, size in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                       ("RANK", "WORLD_SIZE")):  # the last: torchrun's (tests/torch/workers/torch_launch.py)
        if rank in os.environ:
            return int(os.environ[rank]), int(os.environ.get(size, "1"))
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized():
        return mpi.COMM_WORLD.Get_rank(), mpi.COMM_WORLD.Get_size()
    return 0, 1  # run by hand, without a launcher


def report(**fields) -> None:
    """One ``@spmd`` line, written whole (one write of less than PIPE_BUF bytes: never split by another
    rank's output)."""
    rank, size = rank_and_size()
    sys.stdout.flush()
    sys.stderr.flush()
    line = MARK + json.dumps({"rank": rank, "size": size, **fields}) + "\n"
    while len(line) > 4000 and fields.get("error"):  # the whole error is in the traceback above it
        fields["error"] = fields["error"][:len(fields["error"]) // 2] + " ..."
        line = MARK + json.dumps({"rank": rank, "size": size, **fields}) + "\n"
    os.write(1, line.encode())
    if os.environ.get(REPORTS):  # the launcher's copy, which an abort cannot lose in transit
        path = os.path.join(os.environ[REPORTS], REPORT_FILE.format(rank=rank))
        with open(path, "ab", buffering=0) as copy:
            copy.write(line.encode())


def names() -> list[str]:
    """The registered cases' names, in the order they run."""
    return list(_CASES)


def main(select: Iterable[str] | None = None) -> None:
    """Run the registered cases (``select``: these, in this order) on this rank and report each; abort
    the job at the first failure."""
    names = _FIRST + [n for n in (_CASES if select is None else select) if n not in _FIRST]
    unknown = [n for n in names if n not in _CASES]
    if unknown:
        _fail("plan", f"no case named {unknown}; the cases are {list(_CASES)}")
    report(plan=names)
    for name in names:
        start = time.perf_counter()
        try:
            _CASES[name]()
        except Skip as why:
            report(case=name, result="skipped", reason=str(why))
        except BaseException as exc:  # noqa: BLE001 - any failure must take the whole job down, not hang it
            _fail(name, f"{type(exc).__name__}: {exc}", time.perf_counter() - start)
        else:
            report(case=name, result="ok", seconds=round(time.perf_counter() - start, 3))
    report(done=len(names))


def _fail(name: str, error: str, seconds: float = 0.0) -> None:
    rank, _ = rank_and_size()
    print(f"[rank {rank}] case {name!r} FAILED:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
    report(case=name, result="failed", error=error[:2000], seconds=round(seconds, 3))
    abort()


def abort(code: int = 1) -> None:
    """End the whole job now: MPI_Abort where MPI is up, else exit (mpiexec then ends the other ranks)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Abort(code)
    os._exit(code)


def expect_error(kind, fragment, func, what):
    """Call ``func``; it must raise ``kind`` with ``fragment`` in its message (``what`` names the check).
    Returns the exception."""
    try:
        func()
    except kind as exc:
        if fragment not in str(exc):
            raise AssertionError(f"{what}: error {exc!r} does not mention {fragment!r}") from None
        return exc
    raise AssertionError(f"{what}: expected {kind.__name__}, nothing was raised")


def import_worker(name: str):
    """Another worker script as a module (worker names are unique in tests/<area>/workers/), for a worker
    that reuses another's checks or model; its cases are not registered here."""
    if name not in sys.modules:
        (path,) = Path(__file__).resolve().parent.glob(f"*/workers/{name}.py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        registered, first = dict(_CASES), list(_FIRST)
        _CASES.clear()
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        finally:
            _CASES.clear()
            _CASES.update(registered)
            _FIRST[:] = first
    return sys.modules[name]
