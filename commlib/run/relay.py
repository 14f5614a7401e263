"""Keep a lost node's connection to mpiexec open, so that hydra lets the survivors go on.

hydra's proxies (one per host, each the parent of its host's ranks) each hold a TCP connection to mpiexec's
control port. When a host's processes die with the host still up (its node lost to Slurm, its Ray actors
killed), the kernel closes that connection and hydra's mpiexec stops the whole job (``control_cb: assert
(!closed) failed``), survivors included; a host whose link is cut merely goes silent, which in-process
recovery handles (docs/elastic.md). This relay turns the first case into the second: run as hydra's
launcher (``-launcher-exec``), it rewrites the proxies' ``--control-port HOST:PORT`` to a port of its own
and copies each proxy's connection to mpiexec both ways; when a proxy's side closes, mpiexec's side stays
open and silent until mpiexec closes it. With ``--closed-dir DIR`` it also marks each proxy whose side
closed first in ``DIR`` by the address it connected from (:func:`commlib.run.survivors.mark_proxy_closed`):
its host's ranks have ended, which the elastic driver need not wait to hear from a silence.

    python -m commlib.run.relay [--closed-dir DIR] LAUNCHER [ARGS...]   # e.g. srun --nodelist ... hydra_pmi_proxy

It runs ``LAUNCHER ARGS`` (the real srun or ssh) with the rewritten address and ends when that command has
ended and mpiexec has closed every connection, with the command's exit status; SIGTERM and SIGINT go on
to the command.
"""

from __future__ import annotations

import re
import selectors
import signal
import socket
import subprocess
import sys
from typing import Sequence

from . import survivors

_CONTROL = re.compile(r"--control-port[ =]([^\s:]+):(\d+)")


def control_port(argv: Sequence[str]) -> tuple[str, int] | None:
    """mpiexec's control address in a proxy command line (one argument or a shell string)."""
    for i, arg in enumerate(argv):
        if arg == "--control-port" and i + 1 < len(argv) and ":" in argv[i + 1]:
            host, port = argv[i + 1].rsplit(":", 1)
            return host, int(port)
        match = _CONTROL.search(arg)
        if match:
            return match.group(1), int(match.group(2))
    return None


def rewrite(argv: Sequence[str], old: tuple[str, int], port: int) -> list[str]:
    """``argv`` with every ``HOST:OLDPORT`` of the control address pointing at ``HOST:port``."""
    before, after = f"{old[0]}:{old[1]}", f"{old[0]}:{port}"
    return [arg.replace(before, after) for arg in argv]


class _Pair:
    """One proxy's connection (``down``) and its copy to mpiexec (``up``)."""

    def __init__(self, down: socket.socket, up: socket.socket, address: str):
        self.down: socket.socket | None = down
        self.up = up
        self.address = address  # where the proxy connected from: its host


class Relay:
    """Copies connections accepted on ``listener`` to ``target``; a closed proxy side leaves mpiexec's
    side open."""

    def __init__(self, target: tuple[str, int], closed_dir: str | None = None):
        self.target = target
        self.closed_dir = closed_dir
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("0.0.0.0", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.pairs: list[_Pair] = []

    def open_upstreams(self) -> int:
        return sum(1 for p in self.pairs if p.up is not None)

    def step(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            if key.data is None:
                self._accept()
            else:
                pair, side = key.data
                self._pump(pair, side)

    def _accept(self) -> None:
        down, address = self.listener.accept()
        up = socket.create_connection(self.target)
        pair = _Pair(down, up, address[0])
        self.pairs.append(pair)
        self.selector.register(down, selectors.EVENT_READ, (pair, "down"))
        self.selector.register(up, selectors.EVENT_READ, (pair, "up"))

    def _pump(self, pair: _Pair, side: str) -> None:
        source = pair.down if side == "down" else pair.up
        try:
            data = source.recv(1 << 16)
        except OSError:
            data = b""
        if side == "down":
            if not data:  # the proxy is gone: mpiexec's side stays open and silent
                self._close_down(pair)
                if self.closed_dir is not None:
                    survivors.mark_proxy_closed(self.closed_dir, pair.address)
                return
            pair.up.sendall(data)
            return
        if not data:  # mpiexec closed it: done with this proxy
            self._close_down(pair)
            self.selector.unregister(pair.up)
            pair.up.close()
            pair.up = None
            return
        if pair.down is not None:
            try:
                pair.down.sendall(data)
            except OSError:
                self._close_down(pair)

    def _close_down(self, pair: _Pair) -> None:
        if pair.down is not None:
            self.selector.unregister(pair.down)
            pair.down.close()
            pair.down = None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    closed_dir = None
    if argv[:1] == ["--closed-dir"] and len(argv) > 1:
        closed_dir, argv = argv[1], argv[2:]
    if not argv:
        print("usage: python -m commlib.run.relay [--closed-dir DIR] LAUNCHER [ARGS...]", file=sys.stderr)
        return 2
    target = control_port(argv)
    if target is None:  # not a proxy launch: nothing to hold
        return subprocess.call(argv)
    relay = Relay(target, closed_dir)
    child = subprocess.Popen(rewrite(argv, target, relay.port))

    def forward(signum, frame):
        child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    while child.poll() is None or relay.open_upstreams() or not relay.pairs:
        if child.poll() is not None and not relay.pairs:
            break  # the launcher ended before any proxy connected
        relay.step(0.2)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
