"""The MPI that starts the job: which one it is (``mpiexec --version``), and its command line.

MPICH's hydra (and Intel MPI, which is hydra too) and Open MPI spell the same job differently:

| what | hydra | Open MPI |
|---|---|---|
| hosts | ``-hosts a:2,b:2`` | ``-H a:2,b:2`` |
| a setting for every rank | ``-genv NAME VALUE`` | ``-x NAME=VALUE`` |
| the caller's environment | passed whole by default | ``-x NAME`` for each variable to pass |
| ssh port / identity | ``HYDRA_LAUNCHER_EXTRA_ARGS`` in mpiexec's own environment | ``-mca plm_rsh_args "-p P -i F"`` |
| network interface | ``-iface NIC`` (one) | ``-mca btl_tcp_if_include NIC,...`` |
| each rank's output | the program through :mod:`.output` (whole lines, ``[1,RANK]<stdout>:``) | the same (Open MPI reads 4 KiB at once) |
| summation servers (MPMD) | ``-hosts`` lists every rank's host in order; ``... : -n S python -m commlib.server`` | ``... : -np S -H hosts python -m commlib.server`` |

:func:`command_line` builds the command from a :class:`Launch` without running anything, so both forms are
checked by golden tests on a machine that has only one of the two MPIs.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
from typing import Mapping, Sequence

from ..config import FIELDS
from . import output
from .hosts import Host
from .options import UsageError

MPICH = "mpich"
OPEN_MPI = "openmpi"

#: Variables of the caller's environment Open MPI must be told to pass (hydra passes everything): the
#: Python the ranks run, commlib's and Horovod's settings, the transports' settings.
FORWARD_NAMES = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "OMP_NUM_THREADS",
                 "CUDA_VISIBLE_DEVICES", "XDG_CACHE_HOME")
FORWARD_PREFIXES = ("COMMLIB_", "HOROVOD_", "UCX_", "NCCL_", "MPI4PY_", "FI_", "PYTHON")


def classify(version_text: str) -> str:
    """MPICH or OPEN_MPI from what ``mpiexec --version`` printed; UsageError for anything else."""
    if "Open MPI" in version_text or "OpenRTE" in version_text or "Open RTE" in version_text:
        return OPEN_MPI
    if "HYDRA" in version_text or "MPICH" in version_text or "Intel(R) MPI" in version_text:
        return MPICH
    first = (version_text.strip().splitlines() or ["(nothing)"])[0]
    raise UsageError(f"cannot tell which MPI this is from `mpiexec --version` ({first[:100]!r}); commlib-run "
                     "knows MPICH (hydra), Intel MPI and Open MPI: pass one with --mpiexec")


def detect(mpiexec: str) -> str:
    """Run ``mpiexec --version`` and classify it."""
    try:
        done = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"cannot run {mpiexec} --version: {exc}") from None
    return classify(done.stdout + done.stderr)


def forwarded(environ: Mapping[str, str] | None = None) -> list[str]:
    """The names of the variables of ``environ`` (default: this process's environment) that Open MPI is
    asked to pass to the ranks; their values are not read here."""
    environ = os.environ if environ is None else environ
    return sorted(k for k in environ if k in FORWARD_NAMES or k.startswith(FORWARD_PREFIXES))


@dataclasses.dataclass
class Launch:
    """Everything the command line depends on."""

    flavor: str
    mpiexec: str
    np: int
    command: Sequence[str]
    hosts: Sequence[Host] = ()             # empty: this machine
    settings: dict = dataclasses.field(default_factory=dict)  # NAME -> value for every rank
    forward: Sequence[str] = ()            # Open MPI: names of the caller's environment to pass
    nics: Sequence[str] = ()
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    output_filename: str | None = None    # each rank's output also to DIR/rank.N/{stdout,stderr} (output.py)
    tcp: bool = False
    binding_args: str | None = None
    mpi_args: str | None = None
    as_root: bool = False                  # Open MPI refuses root without --allow-run-as-root
    servers: int = 0                       # summation servers, as further ranks of the job (MPMD)
    server_hosts: Sequence[Host] = ()      # their hosts (slots: servers per host); empty: beside the workers
    server_command: Sequence[str] = ("python", "-m", "commlib.server")
    python: str = sys.executable           # runs output.py, the labeller every rank is started through


def placement(launch: Launch) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """``(workers, servers)``: runs of ``(host, ranks)`` in rank order. Workers fill the hosts' slots in
    order; servers fill ``server_hosts``' slots in order, or, without them, go one per worker host in turn
    (beside the workers). Both empty without hosts (this machine)."""
    workers, left = [], launch.np
    for host in launch.hosts:
        if left <= 0:
            break
        workers.append((host.name, min(host.slots, left)))
        left -= host.slots
    servers: list[tuple[str, int]] = []
    if launch.server_hosts:
        left = launch.servers
        for host in launch.server_hosts:
            if left <= 0:
                break
            servers.append((host.name, min(host.slots, left)))
            left -= host.slots
        if left > 0:
            raise UsageError(f"--num-servers {launch.servers} is more than the "
                             f"{sum(h.slots for h in launch.server_hosts)} slots of --server-hosts")
    elif workers:
        names = [name for name, _ in workers]
        for i in range(launch.servers):
            name = names[i % len(names)]
            if servers and servers[-1][0] == name:
                servers[-1] = (name, servers[-1][1] + 1)
            else:
                servers.append((name, 1))
    return workers, servers


def _runs(runs: Sequence[tuple[str, int]]) -> str:
    merged: list[list] = []
    for name, k in runs:
        if merged and merged[-1][0] == name:
            merged[-1][1] += k
        else:
            merged.append([name, k])
    return ",".join(f"{name}:{k}" for name, k in merged)


def command_line(launch: Launch) -> tuple[dict[str, str], list[str]]:
    """(variables for mpiexec's own environment, the argument vector)."""
    if launch.flavor == MPICH:
        return _hydra(launch)
    if launch.flavor == OPEN_MPI:
        return _open_mpi(launch)
    raise UsageError(f"unknown MPI flavour {launch.flavor!r}")


def _settings(launch: Launch) -> dict[str, str]:
    settings = dict(launch.settings)
    if launch.nics:
        settings.setdefault("NCCL_SOCKET_IFNAME", ",".join(launch.nics))
        settings.setdefault(FIELDS["network_interface"].env, ",".join(launch.nics))  # where summation servers listen
    if launch.tcp:
        settings.setdefault("NCCL_IB_DISABLE", "1")
    return settings


def _ssh_args(launch: Launch) -> str:
    args = []
    if launch.ssh_port:
        args += ["-p", str(launch.ssh_port)]
    if launch.ssh_identity_file:
        args += ["-i", launch.ssh_identity_file]
    return shlex.join(args)


def _labelled(launch: Launch, program: Sequence[str], read_size: int) -> list[str]:
    """``program`` started through the labeller (:mod:`.output`), for a launcher reading ``read_size``."""
    return output.command(program, launch.output_filename, read_size, launch.python)


def _hydra(launch: Launch) -> tuple[dict[str, str], list[str]]:
    env = {}
    argv = [launch.mpiexec]
    if launch.servers and (launch.hosts or launch.server_hosts):
        workers, servers = placement(launch)  # one host list for the job: every rank's host, in order
        argv += ["-hosts", _runs(workers + servers)]
    elif launch.hosts:
        argv += ["-hosts", ",".join(f"{h.name}:{h.slots}" for h in launch.hosts)]
    ssh = _ssh_args(launch)
    if ssh:
        env["HYDRA_LAUNCHER_EXTRA_ARGS"] = ssh  # hydra's ssh launcher adds these to every ssh call
    settings = _settings(launch)
    if launch.nics:
        if len(launch.nics) > 1:
            raise UsageError(f"MPICH's hydra takes one network interface, got {', '.join(launch.nics)}")
        argv += ["-iface", launch.nics[0]]
        settings.setdefault("UCX_NET_DEVICES", launch.nics[0])
    if launch.tcp:
        settings.setdefault("UCX_TLS", "tcp,sm,self")
    for name, value in sorted(settings.items()):
        argv += ["-genv", name, str(value)]
    argv += shlex.split(launch.mpi_args or "")
    argv += ["-n", str(launch.np), *_labelled(launch, launch.command, output.HYDRA_READ)]
    if launch.servers:
        argv += [":", "-n", str(launch.servers), *_labelled(launch, launch.server_command, output.HYDRA_READ)]
    return env, argv


def _open_mpi(launch: Launch) -> tuple[dict[str, str], list[str]]:
    argv = [launch.mpiexec]
    if launch.as_root:
        argv.append("--allow-run-as-root")
    argv += ["-np", str(launch.np)]
    workers, servers = placement(launch) if launch.servers else ([], [])
    if launch.servers and launch.hosts:
        argv += ["-H", _runs(workers)]
    elif launch.hosts:
        argv += ["-H", ",".join(f"{h.name}:{h.slots}" for h in launch.hosts)]
    argv += shlex.split(launch.binding_args) if launch.binding_args else ["-bind-to", "none", "-map-by", "slot"]
    argv += ["-mca", "pml", "ob1", "-mca", "btl", "tcp,vader,self" if launch.tcp else "^openib"]
    ssh = _ssh_args(launch)
    if ssh:
        argv += ["-mca", "plm_rsh_args", ssh]
    if launch.nics:
        argv += ["-mca", "btl_tcp_if_include", ",".join(launch.nics)]
    settings = _settings(launch)
    for name, value in sorted(settings.items()):
        argv += ["-x", f"{name}={value}"]
    for name in launch.forward:
        if name not in settings:
            argv += ["-x", name]
    argv += shlex.split(launch.mpi_args or "")
    argv += _labelled(launch, launch.command, output.OPEN_MPI_READ)
    if launch.servers:  # a second app context; the options above are the whole job's
        argv += [":", "-np", str(launch.servers)] + (["-H", _runs(servers)] if servers else [])
        argv += _labelled(launch, launch.server_command, output.OPEN_MPI_READ)
    return {}, argv


#: hydra's report of a process that ended badly (it then stops every other process of the job)
_BAD_TERMINATION = re.compile(r"PID (\d+) RUNNING AT (\S+)\s*\n=\s*EXIT CODE: (\d+)")


def lost_servers(report: str, worker_hosts: Sequence[str], server_hosts: Sequence[str]) -> list[str]:
    """What to tell the user when hydra's output (``report``) reports a process that ended badly on a host that
    runs summation servers and no worker (elsewhere the report cannot say whether a server or a worker
    ended): one line per such report, naming the server(s) there. ``worker_hosts``/``server_hosts``: the
    host of each worker and of each server, in rank order (servers come after the workers)."""
    lines = []
    for pid, host, code in _BAD_TERMINATION.findall(report):
        servers = [f"server {j} (rank {len(worker_hosts) + j} of the job)"
                   for j, h in enumerate(server_hosts) if h == host]
        if not servers or host in worker_hosts:
            continue
        lines.append(f"summation {' or '.join(servers)} on {host} ended (pid {pid}, exit code {code}), and "
                     "mpiexec stopped every other process of the job: a push_pull cannot go on without the "
                     "server that owns its partitions. Its own output, above, may say why; start the job again")
    return lines


def printable(env: dict[str, str], argv: Sequence[str]) -> str:
    """The command as a shell would take it: ``NAME=value mpiexec ...``."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return (prefix + " " if prefix else "") + shlex.join(argv)
