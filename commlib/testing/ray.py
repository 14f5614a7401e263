"""A real Ray cluster on emulated hosts, for tests: ``ray start --head`` on host 0, ``ray start --address`` on
the others, each node at its host's address and under its host's name.

Each node is started with ``--block`` as a child of this process (:mod:`.daemons`), its temporary files
under the cluster's state folder (``--temp-dir``), so that several clusters live side by side and tearing
down the cluster (which kills every process in its namespaces) removes all of it; ``ray stop`` is never
used (it stops every Ray process on the machine, other people's included). Drivers run on host 0
(:meth:`RayCluster.driver`) with ``RAY_ADDRESS`` set, so ``ray.init(address="auto")`` finds the cluster.

    with RayCluster(nodes=2, cpus=1) as cluster:
        done = cluster.driver([sys.executable, "train.py"])
        cluster.kill_node(1)                 # a node lost: its raylet and every process on it killed

Nodes may declare GPUs they do not have (``gpus``): Ray then hands out GPU ids and sets
``CUDA_VISIBLE_DEVICES``, which is what passing GPU resources through can be tested with on a CPU machine.
Hosts beyond ``nodes`` (``spare``) stay without Ray until :meth:`start_node` (a node the autoscaler adds).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

from . import daemons, netns
from .cluster import MPI_ENV, Cluster, ClusterUnavailable

#: what a job on the emulated nodes needs beyond Ray: MPI over each host's eth0 (docs/cluster.md)
JOB_ENV = dict(MPI_ENV)
PORT = 6379
_STARTED = "This command will now block forever"


def ray_command() -> str | None:
    """The ``ray`` command beside this Python, else on PATH."""
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.exists() else shutil.which("ray")


def missing_prerequisites() -> list[str]:
    missing = netns.missing_prerequisites(shaped=False)
    try:
        import ray  # noqa: F401 - only whether it imports
    except ImportError:
        missing.append("Ray (pip install 'commlib[ray]')")
    if ray_command() is None:
        missing.append("the `ray` command (pip install 'commlib[ray]')")
    return missing


class RayCluster(daemons.DaemonCluster):
    """``nodes`` Ray nodes of ``cpus`` CPUs (and ``gpus`` declared GPUs) each on emulated hosts, plus
    ``spare`` hosts where :meth:`start_node` can add nodes later."""

    folder = "ray"

    def __init__(self, nodes: int = 2, cpus: int = 1, gpus: int = 0, spare: int = 0, rate: str | None = None,
                 object_store_mb: int = 80):
        if nodes < 1 or cpus < 1:
            raise ValueError(f"need at least one node of one CPU, got nodes={nodes} cpus={cpus}")
        super().__init__(Cluster([cpus] * (nodes + spare), rate=rate))
        self.nodes = nodes
        self.cpus = cpus
        self.gpus = gpus
        self.object_store_mb = object_store_mb

    @property
    def address(self) -> str:
        return f"{self.hosts.host_address(0)}:{PORT}"

    def node_address(self, index: int) -> str:
        return self.hosts.host_address(index)

    @property
    def env(self) -> dict[str, str]:
        """What a driver needs: the cluster's address and :data:`JOB_ENV`."""
        return dict(JOB_ENV, RAY_ADDRESS=self.address)

    # -- life cycle -------------------------------------------------------------------------------------
    def up(self) -> "RayCluster":
        missing = missing_prerequisites()
        if missing:
            raise ClusterUnavailable("cannot run Ray on emulated hosts here; missing: " + "; ".join(missing))
        self.up_hosts()
        try:
            self.dir.mkdir()
            self.start_node(0)
            for index in range(1, self.nodes):
                self.start_node(index)
        except BaseException:
            self.down()
            raise
        return self

    def start_node(self, index: int, timeout: float = 180.0) -> None:
        """Start Ray on host ``index`` (the head for 0) and wait until it runs."""
        if index in self.daemons and self.daemons[index].poll() is None:
            raise RuntimeError(f"host {index} already runs a Ray node")
        common = ["--node-ip-address", self.node_address(index), "--num-cpus", str(self.cpus),
                  "--num-gpus", str(self.gpus), "--object-store-memory", str(self.object_store_mb << 20),
                  "--disable-usage-stats", "--temp-dir", str(self.dir / f"h{index}"), "--block"]
        role = (["--head", "--port", str(PORT), "--include-dashboard", "false"] if index == 0
                else ["--address", self.address])
        log = self.dir / f"node{index}.log"
        self.daemons[index] = daemons.start(self.hosts.hosts[index], [ray_command(), "start", *role, *common], log,
                                            env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0", **JOB_ENV))
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.daemons[index].poll() is not None:
                raise ClusterUnavailable(f"ray start on host {index} ended ({self.daemons[index].returncode}): "
                                         f"{log.read_text(errors='replace')[-2000:]}")
            if _STARTED in log.read_text(errors="replace"):
                return
            time.sleep(0.2)
        raise ClusterUnavailable(f"Ray on host {index} did not start within {timeout:g} s: "
                                 f"{log.read_text(errors='replace')[-2000:]}")

    # -- using it ---------------------------------------------------------------------------------------
    def driver(self, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 600.0,
               cwd: str | Path | None = None) -> subprocess.CompletedProcess:
        """Run a driver program on host 0 (stdout and stderr merged); on timeout it is killed and
        TimeoutError raised with its output."""
        process = subprocess.Popen(["ip", "netns", "exec", self.hosts.hosts[0], *daemons.with_env(self.env), *argv],
                                   env=env, cwd=cwd,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        try:
            out, _ = process.communicate(timeout=timeout)
        except BaseException:
            os.killpg(process.pid, 9)
            out, _ = process.communicate()
            raise TimeoutError(f"driver {' '.join(argv)} ran past {timeout:g} s:\n{out[-6000:]}")
        return subprocess.CompletedProcess(argv, process.returncode, out, None)

    def kill_node(self, index: int) -> None:
        """The node is lost: its raylet and every process on it (actors included) killed at once."""
        if index == 0:
            raise ValueError("host 0 is the head node; lose another")
        netns.kill_processes(self.hosts.hosts[index])
