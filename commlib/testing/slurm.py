"""A real Slurm cluster on emulated hosts, for tests: slurmctld, one slurmd per host and munge.

Each host of a :class:`~commlib.testing.cluster.Cluster` is a node: its slurmd runs in the host's network
namespace under the host's name (:mod:`.daemons`), with a spool folder of its own; slurmctld and munged
run on host 0, which is also the "login node" where :meth:`SlurmCluster.client` runs ``sbatch``,
``srun``, ``salloc``, ``scontrol``. Processes are tracked by ``proctrack/linuxproc`` and not bound
(``task/none``), so nothing needs cgroups. Everything lives in the cluster's state folder
(``/run/commlib-cluster/<name>/slurm``: configuration, munge key and socket, spool, state, logs) and goes
with the cluster.

    with SlurmCluster(nodes=2, cpus=2) as slurm:
        job = slurm.sbatch("#!/bin/bash\\n#SBATCH -N 2\\nsrun hostname\\n")
        print(slurm.wait(job).state, slurm.output(job))

Needs root and Debian's ``slurmctld``, ``slurmd`` and ``munge`` packages (``apt-get install slurmctld
slurmd munge``; ``scripts/cluster_deps.sh``); :class:`ClusterUnavailable` says what is missing.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

from . import daemons, netns
from .cluster import MPI_ENV, Cluster, ClusterUnavailable

#: what a job on the emulated nodes needs beyond Slurm: MPI over each host's eth0 (docs/cluster.md) and
#: hydra's control traffic there too (the host names resolve nowhere; eth0's address does)
JOB_ENV = dict(MPI_ENV, HYDRA_IFACE=netns.HOST_IFACE)

_BINARIES = (("slurmctld", "slurmctld"), ("slurmd", "slurmd"), ("munged", "munge"), ("sbatch", "slurm-client"),
             ("srun", "slurm-client"), ("scontrol", "slurm-client"))
_DONE = {"COMPLETING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
         "BOOT_FAIL", "DEADLINE"}

_CONF = """\
# Written by commlib.testing.slurm for an emulated cluster; removed with it.
ClusterName={cluster}
SlurmctldHost={controller}({controller_addr})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmdParameters=config_overrides
MailProg=/bin/true
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/spool/slurmd-%n.pid
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdTimeout={slurmd_timeout}
SlurmctldTimeout=10
InactiveLimit=0
KillWait=2
MessageTimeout=5
MinJobAge=3600
{nodes}
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def missing_prerequisites() -> list[str]:
    """What this machine lacks for a Slurm cluster of emulated hosts (empty when nothing)."""
    missing = netns.missing_prerequisites(shaped=False)
    for binary, package in _BINARIES:
        if shutil.which(binary) is None:
            missing.append(f"`{binary}` (Debian package {package}; scripts/cluster_deps.sh installs it)")
    return missing


@dataclasses.dataclass
class JobState:
    """A job's state as ``scontrol show job`` gives it."""

    job_id: str
    state: str
    exit_code: str
    fields: dict

    @property
    def done(self) -> bool:
        return self.state in _DONE


class SlurmCluster(daemons.DaemonCluster):
    """``nodes`` Slurm nodes of ``cpus`` CPUs each (declared to Slurm: they may exceed the machine's),
    on emulated hosts (links shaped at ``rate`` when given). ``slurmd_timeout``: seconds before
    slurmctld takes a silent node for down."""

    folder = "slurm"

    def __init__(self, nodes: int = 2, cpus: int = 2, rate: str | None = None, slurmd_timeout: int = 10):
        if nodes < 1 or cpus < 1:
            raise ValueError(f"need at least one node of one CPU, got nodes={nodes} cpus={cpus}")
        super().__init__(Cluster([cpus] * nodes, rate=rate))
        self.cpus = cpus
        self.slurmd_timeout = slurmd_timeout

    # -- names and places -------------------------------------------------------------------------------
    @property
    def nodes(self) -> list[str]:
        return self.hosts.hosts

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a client command and a job need: the configuration's path and :data:`JOB_ENV`."""
        return dict(JOB_ENV, SLURM_CONF=str(self.conf))

    # -- life cycle -------------------------------------------------------------------------------------
    def up(self) -> "SlurmCluster":
        missing = missing_prerequisites()
        if missing:
            raise ClusterUnavailable("cannot run Slurm on emulated hosts here; missing: " + "; ".join(missing))
        self.up_hosts()
        try:
            self._configure()
            controller = self.nodes[0]
            self._start("munged", controller, ["munged", "-F", f"--socket={self.dir}/munge/socket",
                                               f"--key-file={self.dir}/munge/munge.key",
                                               f"--log-file={self.dir}/log/munged.log",
                                               f"--pid-file={self.dir}/munge/munged.pid",
                                               f"--seed-file={self.dir}/munge/seed"])
            self._wait_for(lambda: (self.dir / "munge" / "socket").exists(), 10, "munged's socket")
            self._start("slurmctld", controller, ["slurmctld", "-D", "-i", "-f", str(self.conf)])
            for node in self.nodes:
                self._start(f"slurmd {node}", node, ["slurmd", "-D", "-f", str(self.conf)])
            self._wait_for(lambda: set(self.node_states().values()) == {"idle"}, 60, "every node idle")
        except BaseException:
            self.down()
            raise
        return self

    def _configure(self) -> None:
        for sub in ("state", "spool", "log", "munge"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            (self.dir / "spool" / node).mkdir()
        os.chmod(self.dir / "munge", 0o755)  # munged: its socket's folder must be reachable by all
        key = self.dir / "munge" / "munge.key"
        key.touch(mode=0o600)
        key.write_bytes(secrets.token_bytes(128))
        nodes = "\n".join(f"NodeName={node} NodeAddr={self.hosts.host_address(i)} CPUs={self.cpus} State=UNKNOWN"
                          for i, node in enumerate(self.nodes))
        self.conf.write_text(_CONF.format(
            cluster=self.name, controller=self.nodes[0], controller_addr=self.hosts.host_address(0),
            munge_socket=self.dir / "munge" / "socket", dir=self.dir, slurmd_timeout=self.slurmd_timeout,
            nodes=nodes))
        # slurmd loads a cgroup plugin whatever the other plugins; v1 on this machine's hierarchy, unused
        (self.dir / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")

    def _start(self, label: str, host: str, argv: list[str]) -> None:
        self.daemons[label] = daemons.start(host, argv, self.dir / "log" / f"{label.replace(' ', '-')}.out",
                                            env=dict(os.environ, SLURM_CONF=str(self.conf)))

    def _wait_for(self, condition, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            dead = [label for label, p in self.daemons.items() if p.poll() is not None]
            if dead:
                raise ClusterUnavailable(f"{', '.join(dead)} ended while starting: {self._log_tail()}")
            if condition():
                return
            time.sleep(0.2)
        raise ClusterUnavailable(f"Slurm cluster {self.name}: no {what} within {timeout:g} s; {self._log_tail()}")

    def _log_tail(self) -> str:
        tails = []
        for log in sorted((self.dir / "log").glob("*")):
            lines = [line for line in log.read_text(errors="replace").splitlines() if "error" in line.lower()]
            if lines:
                tails.append(f"{log.name}: " + " | ".join(lines[-3:]))
        return "; ".join(tails) or "(no errors logged)"

    # -- using it ---------------------------------------------------------------------------------------
    def client(self, argv: Sequence[str], host: int = 0, env: Mapping[str, str] | None = None,
               timeout: float = 60.0, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        """A Slurm command (``sbatch``, ``srun``, ``salloc``, ``scontrol``, ...) on host ``host`` (the
        login node), with :attr:`env` over ``env`` (default: this process's environment)."""
        done = subprocess.run(["ip", "netns", "exec", self.nodes[host], *daemons.with_env(self.env), *argv],
                              env=env, timeout=timeout,
                              capture_output=True, text=True, **kwargs)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        return done

    def node_states(self) -> dict[str, str]:
        done = self.client(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, timeout=20)
        return dict(line.split()[:2] for line in done.stdout.splitlines() if len(line.split()) >= 2)

    def sbatch(self, script: str, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
               cwd: str | Path | None = None) -> str:
        """Submit ``script`` (its text); return the job id. The job's output goes to :meth:`output_path`."""
        path = self.dir / f"job-{secrets.token_hex(4)}.sh"
        path.write_text(script)
        done = self.client(["sbatch", "--parsable", "-o", str(self.dir / "job-%j.out"), *args, str(path)],
                           env=env, cwd=cwd)
        return done.stdout.strip().split(";")[0]

    def output_path(self, job_id: str) -> Path:
        return self.dir / f"job-{job_id}.out"

    def output(self, job_id: str) -> str:
        try:
            return self.output_path(job_id).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def job(self, job_id: str) -> JobState:
        text = self.client(["scontrol", "show", "job", "-o", job_id], timeout=20).stdout
        fields = dict(re.findall(r"(\w+)=(\S*)", text))
        return JobState(job_id, fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", ""), fields)

    def wait(self, job_id: str, timeout: float = 600.0) -> JobState:
        """The job's final state; past ``timeout`` the job is cancelled and TimeoutError raised with its
        output so far."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            state = self.job(job_id)
            if state.done:
                return state
            time.sleep(0.5)
        self.client(["scancel", job_id], check=False)
        raise TimeoutError(f"Slurm job {job_id} still {self.job(job_id).state} after {timeout:g} s; output:\n"
                           f"{self.output(job_id)[-4000:]}")

    def kill_node(self, index: int) -> None:
        """The node is lost: its slurmd and every process on it killed at once (SIGKILL)."""
        if index == 0:
            raise ValueError("host 0 runs slurmctld and munged; lose another node")
        netns.kill_processes(self.nodes[index])
