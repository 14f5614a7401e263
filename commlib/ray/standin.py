"""The program hydra starts for each rank of a job on Ray: it hands its rank's PMI address and the job's
settings to that rank's actor, which becomes the MPI process (commlib.ray.member), and ends when the actor
says so, with the status the actor gives (1 when the actor is gone).

    python -m commlib.ray.standin TOKEN0 TOKEN1 ...      # one token per rank, in rank order
"""

from __future__ import annotations

import os
import socket
import sys
import time

from .member import HANDED, endpoint_name, receive, send

#: how long a stand-in tries to reach its actor (the actor listens before mpiexec starts)
CONNECT_S = 30.0


def main(argv: list[str] | None = None) -> int:
    tokens = list(sys.argv[1:] if argv is None else argv)
    rank = int(os.environ.get("PMI_ID", os.environ.get("PMI_RANK", "-1")))
    if not 0 <= rank < len(tokens):
        print(f"commlib.ray.standin: rank {rank} has no actor among {len(tokens)}: not started by a "
              "RayExecutor's mpiexec (-pmi-port)?", file=sys.stderr)
        return 2
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    end = time.monotonic() + CONNECT_S
    while True:
        try:
            conn.connect(endpoint_name(tokens[rank]))
            break
        except OSError as exc:
            if time.monotonic() > end:
                print(f"commlib.ray.standin: rank {rank} cannot reach its actor on {socket.gethostname()}: {exc}",
                      file=sys.stderr)
                return 2
            time.sleep(0.05)
    send(conn, {"token": tokens[rank], "env": {k: v for k, v in os.environ.items() if k.startswith(HANDED)}})
    message = receive(conn, bytearray())
    return 1 if message is None else int(message.get("exit", 1))


if __name__ == "__main__":
    sys.exit(main())
