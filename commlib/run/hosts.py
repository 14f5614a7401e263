"""Which hosts a job runs on (``-H``, ``--hostfile``), and the check that each one is reachable first.

A host is reachable when ``ssh`` to it runs a command without asking anything (BatchMode): that is what
the MPI launcher will do next, and a host that fails here would otherwise make mpiexec hang or fail with a
message about proxies. With ``--network-interface`` the same ssh call checks that the interface exists
there. The hosts are checked in parallel, each within ``--start-timeout`` seconds.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from .options import UsageError


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    slots: int


def parse_hosts(text: str) -> list[Host]:
    """``a:2,b:2`` (a host without ``:slots`` has 1 slot)."""
    hosts = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = re.fullmatch(r"([^:\s]+)(?::(\d+))?", item)
        if not match or (match.group(2) is not None and int(match.group(2)) < 1):
            raise UsageError(f"-H: {item!r} is not host or host:slots (slots >= 1), e.g. -H a:2,b:2")
        hosts.append(Host(match.group(1), int(match.group(2) or 1)))
    if not hosts:
        raise UsageError("-H names no host; write it as host:slots,... e.g. -H a:2,b:2")
    return _merge(hosts)


def parse_hostfile(path: str) -> list[Host]:
    """One host per line: ``host slots=N`` (horovodrun's and Open MPI's form), ``host:N`` (hydra's) or
    ``host``; ``#`` starts a comment."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise UsageError(f"--hostfile {path}: {exc.strerror}") from None
    hosts = []
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = (re.fullmatch(r"(\S+)\s+slots\s*=\s*(\d+)", line) or re.fullmatch(r"([^:\s]+):(\d+)", line)
                 or re.fullmatch(r"(\S+)()", line))
        if not match or (match.group(2) and int(match.group(2)) < 1):
            raise UsageError(f"--hostfile {path}, line {number}: {line!r} is not 'host slots=N', 'host:N' or 'host'")
        hosts.append(Host(match.group(1), int(match.group(2) or 1)))
    if not hosts:
        raise UsageError(f"--hostfile {path} names no host")
    return _merge(hosts)


def _merge(hosts: list[Host]) -> list[Host]:
    """A host named twice gets the sum of its slots, at its first place."""
    slots: dict[str, int] = {}
    for host in hosts:
        slots[host.name] = slots.get(host.name, 0) + host.slots
    return [Host(name, k) for name, k in slots.items()]


def is_local(name: str) -> bool:
    """This machine: localhost, a loopback address, or this host's own name."""
    if name in ("localhost", "127.0.0.1", "::1") or name.startswith("127."):
        return True
    own = {socket.gethostname(), socket.getfqdn()}
    return name in own or name.split(".")[0] == socket.gethostname().split(".")[0]


def ssh_command(host: str, port: int | None, identity: str | None, timeout: float) -> list[str]:
    command = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
               "-o", f"ConnectTimeout={max(1, int(timeout))}"]
    if port:
        command += ["-p", str(port)]
    if identity:
        command += ["-i", identity]
    return command + [host]


def check(hosts: Sequence[Host], port: int | None = None, identity: str | None = None,
          nics: Sequence[str] = (), timeout: float = 30.0, verbose: bool = False) -> None:
    """Raise :class:`UsageError` naming every host that cannot be reached by ssh, or lacks one of ``nics``.
    This machine is checked for ``nics`` directly (it needs no ssh)."""
    probe = " && ".join(f"test -d /sys/class/net/{shlex.quote(nic)}" for nic in nics) or "true"

    def one(host: Host) -> str | None:
        if is_local(host.name):
            missing = [nic for nic in nics if not os.path.isdir(f"/sys/class/net/{nic}")]
            return f"{host.name}: no network interface {', '.join(missing)} here" if missing else None
        command = ssh_command(host.name, port, identity, timeout) + [probe]
        if verbose:
            print(f"commlib-run: checking {host.name}: {shlex.join(command)}", flush=True)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 5,
                                  stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            return f"{host.name}: no ssh client on this machine (install openssh-client)"
        except subprocess.TimeoutExpired:
            return f"{host.name}: ssh did not answer within {timeout:g} s"
        if done.returncode == 0:
            return None
        if done.returncode == 1 and nics:
            return f"{host.name}: reachable, but lacks network interface(s) {', '.join(nics)}"
        reason = (done.stderr.strip().splitlines() or [f"ssh exit code {done.returncode}"])[-1]
        return f"{host.name}: ssh failed: {reason}"

    with ThreadPoolExecutor(max_workers=min(32, max(1, len(hosts)))) as pool:
        problems = [p for p in pool.map(one, hosts) if p]
    if problems:
        raise UsageError("host check failed (the MPI launcher reaches the hosts by ssh without a password; "
                         "fix these or leave the hosts out):\n  " + "\n  ".join(problems))
