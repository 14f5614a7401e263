"""commlib-run inside a Slurm allocation: the nodes, tasks and CPUs Slurm gave the job, and a launch through
Slurm (``srun``) instead of ssh.

Inside ``salloc`` or an ``sbatch`` script Slurm describes the allocation in the environment, and
``commlib-run python train.py`` needs nothing more:

- ``SLURM_JOB_NODELIST``: the nodes, in Slurm's hostlist syntax (``node[1-3,5],gpu[01-02]``);
- ``SLURM_TASKS_PER_NODE``: tasks per node in node order (``2(x3),1``): the ranks each node runs;
- ``SLURM_JOB_CPUS_PER_NODE`` (same syntax) and ``SLURM_CPUS_PER_TASK``: the CPUs.

The job starts through Slurm: MPICH's hydra with ``-launcher slurm`` (one ``srun`` starts hydra's proxy
on every node, each proxy starts its node's ranks), Open MPI's ``mpirun`` with its Slurm launcher
(``-mca plm slurm``). The proxy's step gets every CPU the job has on the node (``--cpus-per-task``),
where Slurm would otherwise confine all of a node's ranks to one CPU of the step. Elastic jobs add
``--no-kill --kill-on-bad-exit=0``: a lost node or rank does not end the step for the survivors (the
allocation itself must be made with ``--no-kill``, docs/launcher.md).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from typing import Mapping, Sequence

from .hosts import Host
from .options import UsageError


# -- Slurm's notations -----------------------------------------------------------------------------------
def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"hostlist {text!r}: ']' without '['")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise ValueError(f"hostlist {text!r}: '[' without ']'")
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _expand_range(spec: str, text: str) -> list[str]:
    """``01-03,7`` -> ['01', '02', '03', '7']: the width of a range's lower bound is kept (zero padding)."""
    values = []
    for item in spec.split(","):
        item = item.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not match:
            raise ValueError(f"hostlist {text!r}: {item!r} in [{spec}] is not a number or a range lo-hi")
        low, high = match.group(1), match.group(2)
        if high is None:
            values.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"hostlist {text!r}: range {item} runs backwards")
        width = len(low) if low.startswith("0") else 1
        values += [str(v).zfill(width) for v in range(int(low), int(high) + 1)]
    return values


def parse_hostlist(text: str) -> list[str]:
    """Slurm's hostlist syntax expanded, in order: ``node[1-3,5]`` -> node1 node2 node3 node5;
    ``gpu[01-02]`` -> gpu01 gpu02 (padding kept); several bracket groups in one name are a product
    (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2); top-level commas separate names. Raises ValueError."""
    hosts: list[str] = []
    for name in _split_top(text):
        expanded = [""]
        for piece in re.split(r"(\[[^\]]*\])", name):
            if piece.startswith("["):
                choices = _expand_range(piece[1:-1], text)
            elif "[" in piece or "]" in piece:
                raise ValueError(f"hostlist {text!r}: unbalanced brackets in {name!r}")
            else:
                choices = [piece]
            expanded = [head + tail for head in expanded for tail in choices]
        hosts += expanded
    return hosts


def parse_counts(text: str) -> list[int]:
    """Slurm's per-node counts (``SLURM_TASKS_PER_NODE``, ``SLURM_JOB_CPUS_PER_NODE``): ``2(x3),1`` ->
    [2, 2, 2, 1]. Raises ValueError."""
    counts: list[int] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item)
        if not match:
            raise ValueError(f"{text!r}: {item!r} is not N or N(xK)")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


# -- the allocation --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Allocation:
    """What Slurm gave the job this process runs in."""

    job_id: str
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    cpus_per_node: tuple[int, ...]
    cpus_per_task: int | None = None

    @property
    def hosts(self) -> list[Host]:
        """One host per node with its tasks as slots (nodes without a task left out)."""
        return [Host(name, k) for name, k in zip(self.nodes, self.tasks_per_node) if k > 0]

    @property
    def tasks(self) -> int:
        return sum(self.tasks_per_node)

    def describe(self) -> str:
        return f"Slurm job {self.job_id} ({', '.join(f'{h.name}:{h.slots}' for h in self.hosts)})"


#: the variables Slurm describes the allocation with: the only ones this module reads, by name
SLURM_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_STEP_ID",
                   "SLURM_STEP_NUM_TASKS", "SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE",
                   "SLURM_CPUS_PER_TASK")


def variables() -> dict[str, str]:
    """Slurm's variables (:data:`SLURM_VARIABLES`) in this process's environment."""
    return {name: os.environ[name] for name in SLURM_VARIABLES if name in os.environ}


def allocation(environ: Mapping[str, str]) -> Allocation | None:
    """The allocation described by ``environ`` (Slurm's variables, :func:`variables`), or None outside
    Slurm. A malformed description is a UsageError naming the variable."""
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not job or not nodelist:
        return None
    if environ.get("SLURM_STEP_ID") is not None and int(environ.get("SLURM_STEP_NUM_TASKS", "1") or 1) > 1:
        raise UsageError(f"commlib-run runs under srun here (step {environ['SLURM_STEP_ID']} of job {job}, "
                         f"{environ['SLURM_STEP_NUM_TASKS']} tasks): it would start one job per task. Call "
                         "commlib-run once, in the sbatch script or the salloc shell; it starts the ranks "
                         "through srun itself")

    def counts(name: str, default: int) -> list[int]:
        text = environ.get(name)
        if not text:
            return [default] * len(nodes)
        try:
            values = parse_counts(text)
        except ValueError as exc:
            raise UsageError(f"{name}={text}: {exc}") from None
        if len(values) != len(nodes):
            raise UsageError(f"{name}={text} gives {len(values)} node(s), SLURM_JOB_NODELIST={nodelist} "
                             f"{len(nodes)}")
        return values

    try:
        nodes = parse_hostlist(nodelist)
    except ValueError as exc:
        raise UsageError(f"SLURM_JOB_NODELIST: {exc}") from None
    per_task = environ.get("SLURM_CPUS_PER_TASK")
    try:
        cpus_per_task = int(per_task) if per_task else None
    except ValueError:
        raise UsageError(f"SLURM_CPUS_PER_TASK={per_task} is not a number") from None
    return Allocation(job_id=job, nodes=tuple(nodes), tasks_per_node=tuple(counts("SLURM_TASKS_PER_NODE", 1)),
                      cpus_per_node=tuple(counts("SLURM_JOB_CPUS_PER_NODE", 1)), cpus_per_task=cpus_per_task)


def placement(alloc: Allocation, np: int | None) -> tuple[list[Host], int]:
    """The hosts a job of ``np`` ranks (default: every task) takes, filled node by node as hydra fills
    them, and the number of ranks; more ranks than tasks is an error saying how to ask for more."""
    hosts = alloc.hosts
    if np is None:
        return hosts, alloc.tasks
    if np > alloc.tasks:
        raise UsageError(f"-np {np} is more than the {alloc.tasks} task(s) of {alloc.describe()}: ask Slurm for "
                         "more (sbatch/salloc -N NODES --ntasks-per-node=RANKS) or give -np "
                         f"{alloc.tasks} or less")
    used, left = [], np
    for host in hosts:
        if left <= 0:
            break
        used.append(Host(host.name, min(host.slots, left)))
        left -= host.slots
    return used, np


def check_flags(args) -> None:
    """Flags that mean ssh have no meaning when Slurm starts the ranks."""
    for flag, value in (("--ssh-port", args.ssh_port), ("--ssh-identity-file", args.ssh_identity_file)):
        if value:
            raise UsageError(f"{flag} does not apply inside a Slurm allocation: commlib-run starts the ranks "
                             "through srun, not ssh (give -H/--hostfile to use ssh instead)")


# -- the command line ------------------------------------------------------------------------------------
#: srun flags of an elastic job: a lost node or a rank that fails does not end the step for the others
ELASTIC_SRUN_ARGS = ("--no-kill", "--kill-on-bad-exit=0")


def srun_args(alloc: Allocation, hosts: Sequence[Host], elastic: bool) -> list[str]:
    """What the launcher's srun needs beyond its defaults: every CPU the job has on each used node for
    the proxy's step (the least of those nodes), and with ``elastic`` a step that outlives a lost node."""
    by_node = dict(zip(alloc.nodes, alloc.cpus_per_node))
    cpus = min((by_node.get(h.name, 1) for h in hosts), default=1)
    args = [f"--cpus-per-task={max(1, cpus)}"]
    if elastic:
        args += ELASTIC_SRUN_ARGS
    return args


def relay_launcher(directory: str) -> str:
    """An executable in ``directory`` that hydra runs as its srun (``-launcher-exec``): srun under
    :mod:`commlib.run.relay`, which keeps a lost node's connection to mpiexec open so that the survivors
    go on (an elastic job), and marks in ``directory`` each node whose proxy ended."""
    import shutil
    import sys

    srun = shutil.which("srun") or "srun"
    path = os.path.join(directory, "srun-relay")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m commlib.run.relay --closed-dir "
                f"{shlex.quote(directory)} {shlex.quote(srun)} \"$@\"\n")
    os.chmod(path, 0o755)
    return path


def node_addresses(nodes: Sequence[str]) -> dict[str, str]:
    """Node name -> its address (``NodeAddr``; the name where Slurm has none), as ``scontrol`` tells: where
    a node's processes connect from, which the elastic driver matches with the relay's marks. Empty when
    scontrol cannot tell (the driver then waits for a silent node's ranks as for a cut link)."""
    import subprocess

    from ..server.tcp import resolve

    try:
        done = subprocess.run(["scontrol", "-o", "show", "node", ",".join(nodes)], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if done.returncode != 0:
        return {}
    # the relay sees IP addresses: a NodeAddr that is a name counts as the address it resolves to
    return {name: resolve(address) or address for name, address in parse_node_addresses(done.stdout).items()}


def parse_node_addresses(text: str) -> dict[str, str]:
    """``scontrol -o show node``'s lines (``NodeName=a ... NodeAddr=10.0.0.1 ...``) as name -> address."""
    found = {}
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("NodeName"):
            found[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return found


def through_slurm(flavor: str, env: dict[str, str], argv: list[str], alloc: Allocation, hosts: Sequence[Host],
                  elastic: bool = False, relay_dir: str | None = None) -> tuple[dict[str, str], list[str]]:
    """The command line of :func:`commlib.run.mpi.command_line` made to start its processes through
    Slurm: hydra's ``-launcher slurm`` (its srun flags in ``HYDRA_LAUNCHER_EXTRA_ARGS``; with
    ``relay_dir``, srun under the relay of :func:`relay_launcher`), Open MPI's ``-mca plm slurm`` (its
    srun flags in ``plm_slurm_args``). ``OMP_NUM_THREADS`` becomes ``SLURM_CPUS_PER_TASK`` for every rank
    unless the command line already sets it."""
    from .mpi import MPICH, OPEN_MPI

    env, argv = dict(env), list(argv)
    extra = shlex.join(srun_args(alloc, hosts, elastic))
    threads = []
    if alloc.cpus_per_task and not any("OMP_NUM_THREADS" in a for a in argv):
        threads = [str(alloc.cpus_per_task)]
    if flavor == MPICH:
        argv[1:1] = ["-launcher", "slurm"] + (["-launcher-exec", relay_launcher(relay_dir)] if relay_dir else [])
        env["HYDRA_LAUNCHER_EXTRA_ARGS"] = " ".join(filter(None, [env.get("HYDRA_LAUNCHER_EXTRA_ARGS"), extra]))
        if threads:
            at = argv.index("-n")
            argv[at:at] = ["-genv", "OMP_NUM_THREADS", threads[0]]
    elif flavor == OPEN_MPI:
        at = argv.index("-np") + 2
        argv[at:at] = ["-mca", "plm", "slurm", "-mca", "plm_slurm_args", extra]
        if threads:
            argv[at:at] = ["-x", f"OMP_NUM_THREADS={threads[0]}"]
    else:
        raise UsageError(f"unknown MPI flavour {flavor!r}")
    return env, argv
