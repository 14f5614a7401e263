"""What the workers share: run the checks so that any failure takes the whole MPI job down, and expect
an error."""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path


def run(main) -> None:
    """Run ``main()``; on any exception print it with the rank and abort every rank (exit non-zero)."""
    from mpi4py import MPI

    try:
        main()
    except BaseException:  # noqa: BLE001 - any failure must take the whole job down, not hang it
        sys.stdout.flush()
        print(f"[rank {MPI.COMM_WORLD.Get_rank()}] FAILED:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        MPI.COMM_WORLD.Abort(1)


def expect_error(kind, fragment, func, what):
    """Call ``func``; it must raise ``kind`` with ``fragment`` in its message (``what`` names the case)."""
    try:
        func()
    except kind as exc:
        if fragment not in str(exc):
            raise AssertionError(f"{what}: error {exc!r} does not mention {fragment!r}") from None
        return
    raise AssertionError(f"{what}: expected {kind.__name__}, nothing was raised")


def import_worker(name: str):
    """Another worker script as a module (worker names are unique in tests/<area>/workers/), for a worker
    that reuses another's checks or model."""
    if name not in sys.modules:
        (path,) = Path(__file__).resolve().parent.glob(f"*/workers/{name}.py")
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]
