"""What every worker shares: run its checks so that any failure takes the whole MPI job down."""

from __future__ import annotations

import sys
import traceback


def run(main) -> None:
    """Run ``main()``; on any exception print it with the rank and abort every rank (exit non-zero)."""
    from mpi4py import MPI

    try:
        main()
    except BaseException:  # noqa: BLE001 - any failure must take the whole job down, not hang it
        sys.stdout.flush()
        print(f"[rank {MPI.COMM_WORLD.Get_rank()}] FAILED:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        MPI.COMM_WORLD.Abort(1)
