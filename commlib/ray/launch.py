"""The driver's side of starting a commlib job inside Ray actors: the ranks' order, hydra's command line, and
the launch server that hydra reaches through ``commlib.ray.shim`` where it would use ssh.

Given the actors (their nodes, from :meth:`commlib.ray.member.Member.info`), :class:`Plan` numbers the
ranks node by node (hydra fills each host's slots in order), names each node for hydra (``rayhost0``,
``rayhost1``, ...: names that resolve nowhere, so hydra never starts a proxy itself) and builds

    mpiexec -launcher ssh -launcher-exec <shim> -localhost <driver's address> -pmi-port
            -hosts rayhost0:2,rayhost1:2 [-genv NAME VALUE ...] -n 4 python -m commlib.ray.standin TOKEN...

:class:`LaunchServer` answers the shim: for ``rayhostN`` it asks that node's first actor to start hydra's
proxy, and reports the proxy's exit status when it ends (255 when the actor is gone, as ssh does). The
actors are reached through a ``call(index, function, *args)`` callable (``function(member, *args)`` runs in
the actor), so RayExecutor's own actors and Ray Train's workers use the same plan and server.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shlex
import socket
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Sequence

from .member import receive, send

#: how often the launch server asks an actor whether its proxy still runs
POLL_S = 0.5


# functions run in an actor with its Member (commlib.ray.member) -----------------------------------------
def start_proxy(member, command: str) -> int:
    return member.start_proxy(command)


def proxy_status(member) -> int | None:
    return member.proxy_status()


@dataclasses.dataclass
class Plan:
    """The ranks of a job over actors: ``order[r]`` is the actor (its index in the list given) of rank
    ``r``; ``hosts`` hydra's host names and slots; ``proxies[name]`` the actor that starts that host's
    proxy (its first)."""

    order: list[int]
    hosts: list[tuple[str, int]]
    proxies: dict[str, int]
    tokens: list[str]

    @classmethod
    def of(cls, infos: Sequence[dict]) -> "Plan":
        nodes: dict[str, list[int]] = {}
        for i, info in enumerate(infos):
            nodes.setdefault(info["node_id"], []).append(i)
        order = [i for members in nodes.values() for i in members]
        hosts = [(f"rayhost{n}", len(members)) for n, members in enumerate(nodes.values())]
        proxies = {f"rayhost{n}": members[0] for n, members in enumerate(nodes.values())}
        return cls(order=order, hosts=hosts, proxies=proxies, tokens=[infos[i]["token"] for i in order])

    def visible_gpus(self, infos: Sequence[dict]) -> dict[int, str]:
        """Actor index -> CUDA_VISIBLE_DEVICES: every GPU of the actors on its node, in local-rank order
        (as Horovod on Ray does), so that ``torch.cuda.set_device(hvd.local_rank())`` picks the actor's
        own GPU. Empty without GPUs."""
        visible: dict[int, str] = {}
        start = 0
        for _, slots in self.hosts:
            members = self.order[start:start + slots]
            start += slots
            gpus = [g for i in members for g in infos[i]["gpu_ids"]]
            if gpus:
                for i in members:
                    visible[i] = ",".join(gpus)
        return visible

    def argv(self, mpiexec: str, shim: str, driver_address: str, settings: dict[str, str],
             nic: str | None = None) -> list[str]:
        argv = [mpiexec, "-launcher", "ssh", "-launcher-exec", shim, "-localhost", driver_address, "-pmi-port",
                "-hosts", ",".join(f"{name}:{slots}" for name, slots in self.hosts)]
        if nic:
            argv += ["-iface", nic]
        for name, value in sorted(settings.items()):
            argv += ["-genv", name, str(value)]
        return argv + ["-n", str(len(self.order)), sys.executable, "-m", "commlib.ray.standin", *self.tokens]


def shim_script(directory: str, server: str, relay: bool) -> str:
    """The executable hydra runs as ssh: ``commlib.ray.shim`` for ``server``; with ``relay`` (elastic jobs)
    under ``commlib.run.relay`` and holding on when its actor is lost: a lost node's proxy goes silent,
    its connection to mpiexec stays open, and the survivors go on."""
    python = shlex.quote(sys.executable)
    prefix, hold = (f"{python} -m commlib.run.relay ", "--hold ") if relay else ("", "")
    path = os.path.join(directory, "ssh")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexec {prefix}{python} -m commlib.ray.shim {hold}{shlex.quote(server)} \"$@\"\n")
    os.chmod(path, 0o755)
    return path


class LaunchServer:
    """Starts hydra's proxies in actors for the shim, on an abstract Unix socket of this node."""

    def __init__(self, proxies: dict[str, int], call: Callable[..., Any]):
        import ray

        self._ray = ray
        self.proxies = dict(proxies)
        self.call = call
        self.name = f"commlib-ray-launch-{secrets.token_hex(8)}"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind("\0" + self.name)
        self.listener.listen(64)
        self.listener.settimeout(0.5)
        self.closed = threading.Event()
        self.started: set[str] = set()  # the hosts whose proxy runs
        self.started_changed = threading.Condition()
        self.directory = tempfile.mkdtemp(prefix="commlib-ray-")
        self.thread = threading.Thread(target=self._serve, name="commlib-ray-launch", daemon=True)
        self.thread.start()

    def wait_started(self, timeout: float) -> bool:
        """Whether every host's proxy was started within ``timeout`` seconds."""
        with self.started_changed:
            return self.started_changed.wait_for(lambda: len(self.started) == len(self.proxies), timeout)

    def shim(self, relay: bool = False) -> str:
        return shim_script(self.directory, self.name, relay)

    def close(self) -> None:
        self.closed.set()
        self.listener.close()
        self.thread.join(timeout=5)
        for name in os.listdir(self.directory):
            os.remove(os.path.join(self.directory, name))
        os.rmdir(self.directory)

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except (socket.timeout, OSError):
                continue
            threading.Thread(target=self._launch, args=(conn,), daemon=True, name="commlib-ray-proxy").start()

    def _launch(self, conn: socket.socket) -> None:
        with conn:
            request = receive(conn, bytearray())
            if request is None:
                return
            index = self.proxies.get(request["host"])
            if index is None:
                send(conn, {"code": 255, "error": f"unknown host {request['host']!r} (hosts: "
                                                  f"{', '.join(self.proxies)})"})
                return
            try:
                self._ray.get(self.call(index, start_proxy, request["command"]))
                with self.started_changed:
                    self.started.add(request["host"])
                    self.started_changed.notify_all()
                while not self.closed.is_set():
                    status = self._ray.get(self.call(index, proxy_status))
                    if status is not None:
                        send(conn, {"code": status})
                        return
                    time.sleep(POLL_S)
            except Exception as exc:  # noqa: BLE001 - the actor or its node is gone: as ssh, 255
                try:
                    send(conn, {"code": 255, "lost": True, "error": f"the actor of {request['host']} is gone: "
                                                                    f"{str(exc).splitlines()[0][:300]}"})
                except OSError:
                    pass
