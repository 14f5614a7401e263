"""``python -m commlib.server`` (or ``commlib-server``): one summation server of an MPMD job.

    mpiexec -n 4 python train.py : -n 2 python -m commlib.server

Serves until every worker's process has exited; see docs/servers.md.
"""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="commlib-server",
        description="A commlib summation server: start it as extra ranks of the workers' MPI job, e.g. "
                    "mpiexec -n 4 python train.py : -n 2 python -m commlib.server")
    parser.add_argument("--verbose", action="store_true", help="log each server's start and end")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(name)s: %(message)s")
    from mpi4py import MPI

    from ..config import Config
    from .discovery import StartError
    from .loop import open_server

    config = Config.load()
    try:
        server = open_server(MPI.COMM_WORLD, config.server_transport, config.start_timeout_s,
                             config.server_tcp_congestion, config.network_interface or "")
    except StartError as exc:
        print(f"commlib-server: {exc}", file=sys.stderr, flush=True)
        return 1
    layout = server.job
    if not layout.workers:
        print("commlib-server: this MPI job has no workers (no process called commlib.init()); launch the "
              "servers beside the training script: mpiexec -n W python train.py : -n S python -m "
              "commlib.server", file=sys.stderr)
        return 2
    logging.getLogger("commlib.server").info("%s serving %d workers", layout.describe_server(server.index),
                                             len(layout.workers))
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
