"""Daemons on emulated hosts (what :mod:`.slurm` and :mod:`.ray` share): start one in a host's namespace
under the host's name, find what a cluster's daemons left behind.

A daemon runs in the foreground as a child of the process that made the cluster, inside the host's network
namespace and a UTS namespace of its own whose host name is the host's (``gethostname()`` in the daemon and
everything it starts, such as a Slurm job's tasks or a Ray worker, is the emulated host's name). Tearing the
cluster down kills every process in its namespaces, the daemons and what they started included.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Mapping, Sequence

from .cluster import Cluster, leftovers


def start(namespace: str, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """``argv`` in the foreground inside ``namespace``, with the namespace's name as host name; stdout and
    stderr to ``log``."""
    command = f"hostname {shlex.quote(namespace)} && exec {shlex.join(argv)}"
    with open(log, "ab") as out:
        return subprocess.Popen(["ip", "netns", "exec", namespace, "unshare", "--uts", "sh", "-c", command],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=None if env is None else dict(env), start_new_session=True)


def with_env(variables: Mapping[str, str]) -> list[str]:
    """A command prefix (``env NAME=VALUE ...``) that runs a program with ``variables`` over the
    environment it is given: a client command gets the cluster's variables (SLURM_CONF, ...) without this
    module copying the caller's environment."""
    return ["env", *(f"{name}={value}" for name, value in variables.items())] if variables else []


def processes_mentioning(text: str) -> list[str]:
    """``pid command`` of every live process whose command line contains ``text`` (a cluster's folder:
    every daemon of it names its configuration or temporary folder there)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{proc.name} {cmdline[:200]}")
    return found


class DaemonCluster:
    """What a cluster of daemons on emulated hosts (Slurm's, Ray's) shares: its hosts, its daemons (this
    process's children), its folder ``<state folder>/<folder>``, the teardown, and what it left."""

    folder = "daemons"

    def __init__(self, hosts: Cluster):
        self.hosts = hosts
        self.daemons: dict = {}

    @property
    def name(self) -> str | None:
        return self.hosts.name

    @property
    def dir(self) -> Path:
        return self.hosts.state_dir / self.folder

    def up_hosts(self) -> None:
        self.hosts.up()

    def down(self) -> list[str]:
        """Stop every daemon and what it started, remove the hosts and the folder, and the shared memory
        killed jobs left; return what someone still holds under /dev/shm (not ours: every process of the
        cluster is gone)."""
        for process in self.daemons.values():
            if process.poll() is None:
                process.kill()
        self.hosts.down()  # kills what still runs in the namespaces, removes them and the state folder
        for process in self.daemons.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.daemons.clear()
        return self.hosts.clean_shared_memory()  # again: the killed daemons have been waited for now

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def leftovers(self) -> list[str]:
        """What of this cluster is still on the machine: processes, namespaces, interfaces, folders."""
        if self.name is None:
            return []
        found = leftovers([self.name]) + processes_mentioning(str(self.hosts.state_dir))
        if self.dir.exists():
            found.append(f"folder {self.dir}")
        return found
