"""commlib-run's main: parse, check the hosts, build the MPI command line, print it and run it."""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
from typing import Sequence

from ..config import FIELDS, for_job, parse_shape
from ..errors import ConfigError
from . import elastic as _elastic
from . import hosts as _hosts
from . import mpi as _mpi
from . import output as _output
from . import slurm as _slurm
from .options import UsageError, parse, settings


def main(argv: Sequence[str] | None = None) -> int:
    """``commlib-run`` (``python -m commlib.run``); returns the job's exit code (2 for a usage error)."""
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
        if args.check_build:
            print(check_build(args.mpiexec))
            return 0
        env, warnings = settings(args)
        for warning in warnings:
            print(f"commlib-run: warning: {warning}", file=sys.stderr, flush=True)
        for_job(env)  # what every rank's init() will load: an invalid value stops the job here, with its error
        opts = _elastic.options(args)
        if opts is not None and args.num_servers:
            raise UsageError("--num-servers does not apply to elastic jobs (the driver restarts workers only)")
        if args.emulate:
            return _run_emulated(args, env, opts)
        if opts is not None:
            return _run_elastic(args, env, opts)
        return _run(args, env)
    except (UsageError, ConfigError) as exc:
        print(f"commlib-run: error: {exc}", file=sys.stderr)
        return 2


def _mpiexec(given: str | None) -> str:
    """``--mpiexec``, else the one beside this Python, else the one on PATH."""
    if given:
        return given
    from ..testing.cluster import find_mpiexec

    try:
        return find_mpiexec()
    except RuntimeError as exc:
        raise UsageError(str(exc)) from None


def _slots(args) -> tuple[list, int]:
    """The hosts (empty: this machine) and the number of ranks."""
    if args.hosts:
        hosts = _hosts.parse_hosts(args.hosts)
    elif args.hostfile:
        hosts = _hosts.parse_hostfile(args.hostfile)
    elif (allocation := _allocation(args)) is not None:
        return _slurm.placement(allocation, args.np)
    else:
        hosts = []
    slots = sum(h.slots for h in hosts)
    if args.np is None:
        if not hosts:
            raise UsageError("give the number of ranks: commlib-run -np N ...")
        return hosts, slots
    if hosts and args.np > slots:
        raise UsageError(f"-np {args.np} is more than the {slots} slots of the hosts "
                         f"({', '.join(f'{h.name}:{h.slots}' for h in hosts)})")
    return hosts, args.np


def _allocation(args) -> _slurm.Allocation | None:
    """The Slurm allocation this runs in (its nodes are the hosts, srun starts the ranks), unless -H or
    --hostfile name the hosts (then ssh, as anywhere else)."""
    if args.hosts or args.hostfile or args.emulate:
        return None
    allocation = _slurm.allocation(_slurm.variables())
    if allocation is not None:
        _slurm.check_flags(args)
    return allocation


def build(args, env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The command line for ``args`` (the MPI is asked what it is; nothing else runs)."""
    hosts, np = _slots(args)
    mpiexec = _mpiexec(args.mpiexec)
    flavor = _mpi.detect(mpiexec)
    launch = _mpi.Launch(
        flavor=flavor, mpiexec=mpiexec, np=np, command=args.command, hosts=hosts, settings=env,
        forward=_mpi.forwarded(), nics=[n for n in (args.nics or "").split(",") if n],
        ssh_port=args.ssh_port, ssh_identity_file=args.ssh_identity_file, output_filename=args.output_filename,
        tcp=args.tcp, binding_args=args.binding_args, mpi_args=args.mpi_args, as_root=os.geteuid() == 0,
        **_servers(args))
    allocation = _allocation(args)
    if allocation is not None:
        return _slurm.through_slurm(flavor, *_mpi.command_line(launch), allocation, hosts)
    return _mpi.command_line(launch)


def _servers(args) -> dict:
    """The Launch fields for ``--num-servers`` / ``--server-hosts``."""
    if args.num_servers < 0:
        raise UsageError(f"--num-servers {args.num_servers}: give 0 or more")
    return dict(servers=args.num_servers,
                server_hosts=_hosts.parse_hosts(args.server_hosts) if args.server_hosts else [],
                server_command=[sys.executable, "-m", "commlib.server"])


def _run(args, env: dict[str, str]) -> int:
    launcher_env, argv = build(args, env)
    hosts, _ = _slots(args)
    remote = [h for h in hosts if not _hosts.is_local(h.name)] if _allocation(args) is None else []
    nics = [n for n in (args.nics or "").split(",") if n]
    if remote or nics:
        _hosts.check(hosts, args.ssh_port, args.ssh_identity_file, nics, args.start_timeout, bool(args.verbose))
        if args.verbose:
            print(f"commlib-run: {len(hosts)} host(s) reachable", file=sys.stderr, flush=True)
    print(f"commlib-run: {_mpi.printable(launcher_env, argv)}", file=sys.stderr, flush=True)
    # the output's last chunks, where hydra's report names a lost server: a loaded machine's pipes deliver it a
    # line or less at a time, after the ranks' and proxies' last lines
    tail: collections.deque = collections.deque(maxlen=256)
    code = _execute(argv, tail, env=dict(os.environ, **launcher_env), timeout=args.timeout)
    if code and args.num_servers:
        workers, servers = _rank_hosts(args, hosts)
        for line in _mpi.lost_servers(b"".join(tail).decode(errors="replace"), workers, servers):
            print(f"commlib-run: error: {line}", file=sys.stderr, flush=True)
    return code


def _rank_hosts(args, hosts) -> tuple[list[str], list[str]]:
    """The host of each worker and of each server, in rank order (hydra's name for this machine where
    no hosts are given)."""
    _, np = _slots(args)
    workers, servers = _mpi.placement(_mpi.Launch(flavor="", mpiexec="", np=np, command=(), hosts=hosts,
                                                  **_servers(args)))
    if not workers:
        workers = [(socket.gethostname(), np)]
    if not servers:
        servers = [(socket.gethostname(), args.num_servers)]
    return ([name for name, k in workers for _ in range(k)], [name for name, k in servers for _ in range(k)])


def _execute(argv: list[str], tail: collections.deque, env: dict[str, str], timeout: float | None) -> int:
    """Run mpiexec in its own process group, its output passed on as whole lines (:mod:`.output`) and its
    last chunks kept in ``tail``; on a timeout, Ctrl-C or SIGTERM the whole group goes down."""
    job = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    relays = _output.relays(job, tail)
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        code = job.wait(timeout=timeout)
        for relay in relays:
            relay.join(timeout=5)  # a rank left behind may hold the pipe: what it writes later is lost
        return code
    except subprocess.TimeoutExpired:
        print(f"commlib-run: error: the job ran past --timeout {timeout:g} s; killed", file=sys.stderr)
        _kill(job)
        return 124
    except KeyboardInterrupt:
        _kill(job)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _kill(job: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, signal.SIGTERM)
    try:
        job.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def _run_elastic(args, env: dict[str, str], opts) -> int:
    """An elastic job on real hosts (or this machine): the driver restarts it as hosts come and go."""
    allocation = _allocation(args)
    given = _hosts.parse_hosts(args.hosts) if args.hosts else (
        _hosts.parse_hostfile(args.hostfile) if args.hostfile else (allocation.hosts if allocation else []))
    if not given and not opts.discovery_script:
        given = [_hosts.Host("localhost", opts.max_np or args.np or opts.min_np)]
    mpiexec = _mpiexec(args.mpiexec)
    flavor = _mpi.detect(mpiexec)
    nics = [n for n in (args.nics or "").split(",") if n]

    def command(hosts, np, settings):
        return _mpi.command_line(_mpi.Launch(
            flavor=flavor, mpiexec=mpiexec, np=np, command=args.command, hosts=hosts, settings=settings,
            forward=_mpi.forwarded(), nics=nics, ssh_port=args.ssh_port,
            ssh_identity_file=args.ssh_identity_file, output_filename=args.output_filename, tcp=args.tcp,
            binding_args=args.binding_args, mpi_args=args.mpi_args, as_root=os.geteuid() == 0))

    if allocation is not None:  # srun starts the ranks on the allocation's nodes: no ssh to check
        def slurm_command(hosts, np, settings):
            return _slurm.through_slurm(flavor, *command(hosts, np, settings), allocation, hosts, elastic=True,
                                        relay_dir=settings[FIELDS["elastic_dir"].env])

        launcher = _elastic.Launcher(command=slurm_command, kill=_kill, static_hosts=given,
                                     in_process=flavor == _mpi.MPICH, proxy_addresses=_slurm.node_addresses)
        return _elastic.Driver(opts, launcher, env).run()

    def check(hosts):
        if any(not _hosts.is_local(h.name) for h in hosts) or nics:
            _hosts.check(hosts, args.ssh_port, args.ssh_identity_file, nics, args.start_timeout, bool(args.verbose))

    launcher = _elastic.Launcher(command=command, kill=_kill, static_hosts=given, check_hosts=check,
                                 in_process=flavor == _mpi.MPICH)
    return _elastic.Driver(opts, launcher, env).run()


def _run_emulated(args, env: dict[str, str], opts=None) -> int:
    """The job on an emulated cluster of H hosts x R ranks (commlib.testing.cluster), torn down after."""
    from ..testing.cluster import Cluster, ClusterUnavailable, JobFailed

    try:
        nhosts, per_host = parse_shape(args.emulate)
    except ValueError as exc:
        raise UsageError(f"--emulate: {exc}") from None
    np = nhosts * per_host if args.np is None else args.np
    if np > nhosts * per_host:
        raise UsageError(f"-np {np} is more than the {nhosts * per_host} ranks of --emulate {args.emulate}")
    for flag, value in (("-H/--hostfile", args.hosts or args.hostfile), ("--ssh-port", args.ssh_port),
                        ("--ssh-identity-file", args.ssh_identity_file), ("--network-interface", args.nics)):
        if value:
            raise UsageError(f"{flag} does not apply to --emulate: the emulated hosts are reached through their "
                             "namespaces, over their eth0")
    # local options (after -n) in hydra's syntax: the cluster's command line ends with -n
    tail = [arg for name, value in sorted(env.items()) for arg in ("-env", name, value)]
    tail += _output.command(args.command, args.output_filename)
    timeout = 3600.0 if args.timeout is None else args.timeout
    if args.server_hosts:
        raise UsageError("--server-hosts does not apply to --emulate: the servers get emulated hosts of their own")
    own = 0 if args.colocate_servers else args.num_servers  # server hosts of their own
    try:
        with Cluster([per_host] * nhosts + [1] * own, rate=args.link_rate) as cluster:
            servers = (f", {args.num_servers} server(s) " + ("beside the workers" if args.colocate_servers else
                                                            "on hosts of their own")) if args.num_servers else ""
            print(f"commlib-run: emulated cluster {cluster.name}: {nhosts} hosts x {per_host} ranks{servers}, "
                  f"links {args.link_rate or 'unshaped'}", file=sys.stderr, flush=True)
            if opts is not None:
                launcher = _emulated_launcher(cluster, _output.command(args.command, args.output_filename))
                return _elastic.Driver(opts, launcher, env).run()
            if args.num_servers:
                return _emulated_servers(cluster, args, env, np, timeout)
            print(f"commlib-run: {_mpi.printable({}, cluster.mpiexec_args(np) + tail)}", file=sys.stderr, flush=True)
            done = cluster.mpiexec(tail, timeout=timeout, nprocs=np, check=False)
            _output.write(_output.join(done.stdout.encode()))
            return done.returncode
    except ClusterUnavailable as exc:
        raise UsageError(f"--emulate: {exc}") from None
    except JobFailed as exc:
        _output.write(_output.join((exc.completed.stdout or "").encode()))
        print(f"commlib-run: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 124 if exc.completed.returncode == -9 else (exc.completed.returncode or 1)


def _emulated_servers(cluster, args, env: dict[str, str], np: int, timeout: float) -> int:
    """An MPMD job on the emulated cluster: ``np`` workers on the first hosts, then one server on each of
    the last ``--num-servers`` hosts, or, with ``--colocate-servers``, one per worker host in turn."""
    per_host = cluster.ranks_per_host[0]
    workers = [r // per_host for r in range(np)]
    if args.colocate_servers:
        used = sorted(set(workers))
        servers = [used[i % len(used)] for i in range(args.num_servers)]
    else:
        servers = list(range(len(cluster.hosts) - args.num_servers, len(cluster.hosts)))
    programs = [(workers, _output.command(args.command, args.output_filename)),
                (servers, _output.command([sys.executable, "-m", "commlib.server"], args.output_filename))]
    print(f"commlib-run: {_mpi.printable(env, cluster.mpmd_args(programs))}", file=sys.stderr, flush=True)
    done = cluster.mpiexec_mpmd(programs, timeout=timeout, env=dict(os.environ, **env), check=False)
    _output.write(_output.join(done.stdout.encode()))
    if done.returncode:
        hosts = cluster.hosts
        for line in _mpi.lost_servers(done.stdout, [hosts[h] for h in workers], [hosts[h] for h in servers]):
            print(f"commlib-run: error: {line}", file=sys.stderr, flush=True)
    return done.returncode


def _emulated_launcher(cluster, command: Sequence[str]):
    """The elastic driver's launcher on an emulated cluster: any subset of its hosts; ``command``: what each
    rank runs (through the labeller)."""
    from ..testing import netns

    def argv_for(hosts, np, settings):
        argv = cluster.mpiexec_args(np)
        argv[argv.index("-hosts") + 1] = ",".join(f"{h.name}:{h.slots}" for h in hosts)
        tail = [a for name, value in sorted(settings.items()) for a in ("-env", name, value)]
        return {}, argv + tail + list(command)

    def kill(job):
        _kill(job)
        for host in cluster.hosts:
            netns.kill_processes(host)

    hosts = [_hosts.Host(name, k) for name, k in zip(cluster.hosts, cluster.ranks_per_host)]
    return _elastic.Launcher(command=argv_for, kill=kill, static_hosts=hosts,
                             discovery_env={"COMMLIB_RUN_HOSTS": ",".join(cluster.hosts)}, in_process=True)


def check_build(mpiexec: str | None = None) -> str:
    """What this commlib supports, in horovodrun --check-build's layout."""
    import commlib

    def mark(ok) -> str:
        return "[X]" if ok else "[ ]"

    frameworks = [("PyTorch", "torch"), ("TensorFlow", "tensorflow"), ("JAX", "jax")]
    plugins = {"torch": "commlib.torch", "tensorflow": "commlib.tensorflow", "jax": "commlib.jax"}
    lines = ["commlib:", "", "Available Frameworks:"]
    for label, module in frameworks:
        ok = importlib.util.find_spec(module) is not None and importlib.util.find_spec(plugins[module]) is not None
        lines.append(f"    {mark(ok)} {label}")
    try:
        path = _mpiexec(mpiexec)
        flavor = _mpi.detect(path)
        launcher = f"{flavor} ({path})"
    except UsageError as exc:
        launcher = f"none usable: {exc}"
    lines += ["", "Available Controllers:", f"    {mark(True)} MPI", f"    {mark(False)} Gloo", "",
              "Available Tensor Operations:", f"    {mark(commlib.nccl_built())} NCCL", f"    {mark(False)} DDL",
              f"    {mark(False)} CCL", f"    {mark(True)} MPI", f"    {mark(False)} Gloo", "",
              f"MPI launcher: {launcher}"]
    return "\n".join(lines)
