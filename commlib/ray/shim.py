"""What hydra runs in place of ssh for a job on Ray (``-launcher ssh -launcher-exec``): it asks the driver's
launch server (commlib.ray.launch) to have the actor of a host start hydra's proxy there, and lives as
long as that proxy, ending with its status (255, as ssh, when the actor is lost).

    python -m commlib.ray.shim [--hold] SERVER [ssh options] HOST COMMAND...

With ``--hold`` (elastic jobs) a lost actor leaves the shim waiting, silent, until mpiexec's end kills it:
hydra stops every rank when a launcher ends badly, and the survivors are to go on (their proxies still
answer; the lost host's connection is held by commlib.run.relay).
"""

from __future__ import annotations

import signal
import socket
import sys

from .member import receive, send

#: ssh options that take a value (hydra may pass some, e.g. -x takes none)
_WITH_VALUE = set("BbcDEeFIiJLlmOopQRSWw")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3:
        print("usage: python -m commlib.ray.shim SERVER [ssh options] HOST COMMAND...", file=sys.stderr)
        return 255
    hold = args[0] == "--hold"
    args = args[1:] if hold else args
    server, args = args[0], args[1:]
    while args and args[0].startswith("-"):
        option = args.pop(0)
        if len(option) == 2 and option[1] in _WITH_VALUE and args:
            args.pop(0)
    host, command = args[0], args[1:]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect("\0" + server)
        send(conn, {"host": host, "command": " ".join(command)})
        answer = receive(conn, bytearray())
    except OSError as exc:
        print(f"commlib.ray.shim: the launch server {server} is gone: {exc}", file=sys.stderr)
        return 255
    if answer is not None and answer.get("error"):
        print(f"commlib.ray.shim: {answer['error']}", file=sys.stderr, flush=True)
    if answer is None or answer.get("lost"):
        if hold:
            while True:
                signal.pause()
        return 255
    return int(answer.get("code", 255))


if __name__ == "__main__":
    sys.exit(main())
