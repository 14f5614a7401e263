"""commlib-run's command line: horovodrun's flags, and what each one sets for the ranks.

A flag with a commlib meaning becomes the ``COMMLIB_*`` variable of its setting (:data:`SETTING_FLAGS`:
the field of :mod:`commlib.config` it sets; the variable's name, parser and description come from there),
passed to every rank on the MPI command line, so it wins over the same setting in the caller's environment
as a flag should. A flag commlib cannot honour is a warning naming it (the same reasons as the
``HOROVOD_*`` variables it would set, :data:`commlib.config.HOROVOD_IGNORED`); one that cannot work at all
(``--gloo``, ``--jsrun``, ``--config-file``) is an error saying what to do instead.
"""

from __future__ import annotations

import argparse
from typing import Sequence

from ..config import FIELDS, HOROVOD_IGNORED, environment, parse_duration
from ..errors import ConfigError


class UsageError(ValueError):
    """A command line commlib-run cannot run; the message says what to change."""


def _about(attr: str, unit: str | None = None) -> str:
    """A settings flag's help: the variable it sets and what that means (commlib.config's one description)."""
    field = FIELDS[attr]
    return f"sets {field.env}{f' (given in {unit})' if unit else ''}: {field.doc}"


def _duration(text: str) -> float:
    """A duration flag, read as COMMLIB_TIMEOUT is (:func:`commlib.config.parse_duration`)."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: flags that set a setting: the flag's destination -> (the Config field, the field's value from the flag's)
SETTING_FLAGS = {
    "fusion_threshold_mb": ("fusion_threshold_bytes", lambda mib: int(mib * (1 << 20))),
    "cycle_time_ms": ("cycle_time_ms", float),
    "cache_capacity": ("cache_capacity", int),
    "timeline_filename": ("timeline", str),
    "timeline_mark_cycles": ("timeline_mark_cycles", bool),
    "stall_check_warning_time_seconds": ("stall_check_time_s", float),
    "stall_check_shutdown_time_seconds": ("stall_shutdown_time_s", float),
    "num_nccl_streams": ("num_streams", int),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="commlib-run",
        description="Start a data-parallel job on MPI: horovodrun's flags, the right command line for the MPI "
                    "found (MPICH/hydra or Open MPI), hosts checked first. See docs/launcher.md.",
        usage="commlib-run [-h] -np N [-H HOSTS | --hostfile FILE | --emulate HxR] [options] command ...")
    p.add_argument("-np", "--num-proc", dest="np", type=int, help="number of ranks (default: the hosts' slots)")
    p.add_argument("-H", "--hosts", dest="hosts", default=None,
                   help="host:slots,... (e.g. a:2,b:2); default: this host")
    p.add_argument("-hostfile", "--hostfile", dest="hostfile", default=None,
                   help="file with one host per line, as 'host slots=N' (horovodrun's form) or 'host:N'")
    p.add_argument("--network-interface", "--network-interfaces", dest="nics", default=None,
                   help="network interface(s) the ranks talk over, comma-separated (MPICH takes one)")
    p.add_argument("-p", "--ssh-port", dest="ssh_port", type=int, default=None, help="ssh port of the hosts")
    p.add_argument("-i", "--ssh-identity-file", dest="ssh_identity_file", default=None, help="ssh identity file")
    p.add_argument("--num-servers", type=int, default=0,
                   help="also start this many summation servers (python -m commlib.server) as further ranks of "
                        "the job, for push_pull and algorithm='ps' (docs/servers.md)")
    p.add_argument("--server-hosts", default=None,
                   help="the servers' hosts, e.g. s1:1,s2:1 (default: one per worker host in turn; with "
                        "--emulate: hosts of their own)")
    p.add_argument("--colocate-servers", action="store_true",
                   help="put the servers beside the workers, one per worker host in turn (the default on real "
                        "hosts without --server-hosts; with --emulate the servers otherwise get hosts of their own)")
    p.add_argument("--start-timeout", type=_duration, default=30.0,
                   help="how long each host check (ssh) may take: seconds, or 90s, 10m, 1h (default 30)")
    p.add_argument("--output-filename", default=None, help="also write each rank's output, as it wrote it, to DIR/rank.N/stdout and stderr "
                        "(horovodrun's layout)", metavar="DIR")
    p.add_argument("--verbose", action="count", default=0, help="say what is checked and run")
    p.add_argument("--mpiexec", default=None,
                   help="the mpiexec/mpirun to run (default: the one beside this Python, else on PATH)")
    p.add_argument("--mpi-args", default=None, help="extra arguments for mpiexec, as one string")
    p.add_argument("--binding-args", default=None, help="Open MPI's binding flags (default -bind-to none -map-by slot)")
    p.add_argument("--tcp", dest="tcp", action="store_true", help="TCP only, no RDMA transports")
    p.add_argument("--disable-cache", action="store_true", help="accepted; commlib-run keeps no host-check cache")
    p.add_argument("-cb", "--check-build", action="store_true", help="print what this commlib supports, and exit")
    p.add_argument("--mpi", action="store_true", help="run on MPI (the only controller commlib has)")
    p.add_argument("--gloo", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--jsrun", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=_duration, default=None,
                   help="kill the job after this long: seconds, or 90s, 10m, 1h (default: never; --emulate: 1h)")
    # the emulated cluster (commlib.testing.cluster)
    p.add_argument("--emulate", default=None, metavar="HxR",
                   help="run on an emulated cluster of H hosts with R ranks each (network namespaces, one "
                        "machine; needs root), e.g. 2x2")
    p.add_argument("--link-rate", default=None, help="with --emulate: each host's link rate, e.g. 1gbit")

    tune = p.add_argument_group("settings (each sets a COMMLIB_* variable; docs/configuration.md)")
    tune.add_argument("--fusion-threshold-mb", type=float, default=None, help=_about("fusion_threshold_bytes", "MiB"))
    tune.add_argument("--cycle-time-ms", type=float, default=None, help=_about("cycle_time_ms"))
    tune.add_argument("--cache-capacity", type=int, default=None, help=_about("cache_capacity"))
    for name, text in (("hierarchical-allreduce", "allreduce with the hierarchical schedule"),
                       ("torus-allreduce", "allreduce with the torus2d schedule")):
        group = tune.add_mutually_exclusive_group()
        group.add_argument(f"--{name}", dest=name.replace("-", "_"), action="store_true", default=None,
                           help=f"{text} ({FIELDS['algorithm'].env})")
        group.add_argument(f"--no-{name}", dest=name.replace("-", "_"), action="store_false",
                           help="leave the choice to auto (the default)")
    tune.add_argument("--timeline-filename", default=None, help=_about("timeline"))
    marks = tune.add_mutually_exclusive_group()
    marks.add_argument("--timeline-mark-cycles", dest="timeline_mark_cycles", action="store_true", default=None,
                       help=_about("timeline_mark_cycles"))
    marks.add_argument("--no-timeline-mark-cycles", dest="timeline_mark_cycles", action="store_false")
    stall = tune.add_mutually_exclusive_group()
    stall.add_argument("--no-stall-check", dest="stall_check", action="store_false", default=None,
                       help=f"no stall warnings ({FIELDS['stall_check_time_s'].env}=0)")
    stall.add_argument("--stall-check", dest="stall_check", action="store_true")
    tune.add_argument("--stall-check-warning-time-seconds", type=float, default=None,
                      help=_about("stall_check_time_s"))
    tune.add_argument("--stall-check-shutdown-time-seconds", type=float, default=None,
                      help=_about("stall_shutdown_time_s"))
    tune.add_argument("--num-nccl-streams", type=int, default=None, help=_about("num_streams"))

    ignored = p.add_argument_group("horovodrun flags commlib cannot honour (a warning each)")
    autotune = ignored.add_mutually_exclusive_group()
    autotune.add_argument("--autotune", dest="autotune", action="store_true", default=None)
    autotune.add_argument("--no-autotune", dest="autotune", action="store_false")
    for flag in ("--autotune-log-file", "--autotune-warmup-samples", "--autotune-steps-per-sample",
                 "--autotune-bayes-opt-max-samples", "--autotune-gaussian-process-noise", "--thread-affinity",
                 "--gloo-timeout-seconds", "--log-level"):
        ignored.add_argument(flag, default=None)
    for name in ("hierarchical-allgather", "mpi-threads-disable"):
        group = ignored.add_mutually_exclusive_group()
        group.add_argument(f"--{name}", dest=name.replace("-", "_"), action="store_true", default=None)
        group.add_argument(f"--no-{name}", dest=name.replace("-", "_"), action="store_false")
    for flag in ("--log-with-timestamp", "--log-without-timestamp", "--log-hide-timestamp",
                 "--no-log-hide-timestamp", "-prefix-timestamp", "--prefix-output-with-timestamp"):
        ignored.add_argument(flag, action="store_true", default=False)

    elastic = p.add_argument_group("elastic training (docs/elastic.md): the driver restarts the job from the "
                                   "last commit when a host is lost or added")
    elastic.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int, default=None,
                         help="fewest ranks to train with (wait for them, at most --elastic-timeout)")
    elastic.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int, default=None,
                         help="most ranks to start")
    elastic.add_argument("--host-discovery-script", default=None,
                         help="prints the available hosts, one 'host' or 'host:slots' per line")
    elastic.add_argument("--slots-per-host", type=int, default=None, help="slots of a discovered host without :slots")
    elastic.add_argument("--elastic-timeout", type=_duration, default=None,
                         help="how long to wait for --min-np slots: seconds, or 90s, 10m, 1h (default 10m)")
    elastic.add_argument("--reset-limit", type=int, default=None, help="most restarts before the job fails")
    elastic.add_argument("--blacklist-cooldown-range", nargs=2, default=None, metavar=("LOW", "HIGH"),
                         help="a failed host comes back after a random LOW..HIGH seconds (default: never)")
    p.add_argument("--config-file", default=None, help=argparse.SUPPRESS)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return p


#: flags without a commlib meaning -> the HOROVOD_* variable whose reason the warning gives
_IGNORED_FLAGS = {
    "autotune": "HOROVOD_AUTOTUNE", "autotune_log_file": "HOROVOD_AUTOTUNE_LOG",
    "autotune_warmup_samples": "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
    "autotune_steps_per_sample": "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE",
    "autotune_bayes_opt_max_samples": "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
    "autotune_gaussian_process_noise": "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
    "hierarchical_allgather": "HOROVOD_HIERARCHICAL_ALLGATHER", "mpi_threads_disable": "HOROVOD_MPI_THREADS_DISABLE",
    "thread_affinity": "HOROVOD_THREAD_AFFINITY", "gloo_timeout_seconds": "HOROVOD_GLOO_TIMEOUT_SECONDS",
    "log_level": "HOROVOD_LOG_LEVEL", "log_with_timestamp": "HOROVOD_LOG_HIDE_TIME",
    "log_without_timestamp": "HOROVOD_LOG_HIDE_TIME", "log_hide_timestamp": "HOROVOD_LOG_HIDE_TIME",
    "no_log_hide_timestamp": "HOROVOD_LOG_HIDE_TIME",
}


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """Parse and check ``argv``; raise :class:`UsageError` for what cannot run."""
    args = parser().parse_args(list(argv))
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if args.gloo or args.jsrun:
        raise UsageError(f"commlib runs on MPI only; drop {'--gloo' if args.gloo else '--jsrun'} (commlib-run "
                         "starts the job with the mpiexec it finds)")
    if args.config_file is not None:
        raise UsageError("--config-file (horovodrun's YAML) is not read by commlib-run; pass the settings as "
                         "flags or COMMLIB_* variables")
    if args.check_build:
        return args
    if not args.command:
        raise UsageError("no command given: commlib-run -np 2 python train.py")
    if args.np is not None and args.np < 1:
        raise UsageError(f"-np must be at least 1, got {args.np}")
    given = [f for f, v in (("-H", args.hosts), ("--hostfile", args.hostfile), ("--emulate", args.emulate)) if v]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} both name the hosts; give one")
    if args.link_rate and not args.emulate:
        raise UsageError("--link-rate shapes an emulated cluster's links: use it with --emulate HxR")
    if args.server_hosts and args.colocate_servers:
        raise UsageError("--server-hosts and --colocate-servers both place the servers; give one")
    if (args.server_hosts or args.colocate_servers) and not args.num_servers:
        raise UsageError(f"{'--server-hosts' if args.server_hosts else '--colocate-servers'} needs --num-servers N")
    if args.stall_check is False and args.stall_check_warning_time_seconds is not None:
        raise UsageError("--no-stall-check and --stall-check-warning-time-seconds contradict each other")
    if args.hierarchical_allreduce and args.torus_allreduce:
        raise UsageError("--hierarchical-allreduce and --torus-allreduce ask for two allreduce algorithms; give one")
    return args


def settings(args: argparse.Namespace) -> tuple[dict[str, str], list[str]]:
    """The ``COMMLIB_*`` variables the flags set for every rank (written by :func:`commlib.config.environment`,
    so each is what ``init()`` reads), and a warning for each flag commlib cannot honour. A value the
    setting's parser refuses is a :class:`UsageError` naming the flag and the variable."""
    values: dict[str, object] = {}
    flags: dict[str, str] = {}
    for dest, (attr, value_of) in SETTING_FLAGS.items():
        given = getattr(args, dest)
        if given is not None and given != "":
            values[attr], flags[attr] = value_of(given), "--" + dest.replace("_", "-")
    if args.hierarchical_allreduce:
        values["algorithm"], flags["algorithm"] = "hierarchical", "--hierarchical-allreduce"
    if args.torus_allreduce:
        values["algorithm"], flags["algorithm"] = "torus2d", "--torus-allreduce"
    if args.stall_check is False:
        values["stall_check_time_s"], flags["stall_check_time_s"] = 0.0, "--no-stall-check"
    env: dict[str, str] = {}
    for attr, value in values.items():
        try:
            env.update(environment(**{attr: value}))
        except ConfigError as exc:
            raise UsageError(f"{flags[attr]}: {exc}") from None
    warnings = []
    for attr, variable in _IGNORED_FLAGS.items():
        value = getattr(args, attr)
        if value in (None, False):
            continue
        flag = "--" + attr.replace("_", "-")
        warnings.append(f"{flag} is not honoured by commlib: {HOROVOD_IGNORED[variable]}")
    if args.prefix_timestamp or args.prefix_output_with_timestamp:
        warnings.append("--prefix-output-with-timestamp is not honoured: MPICH's hydra has no timestamp option "
                        "(Open MPI's --timestamp-output can go in --mpi-args)")
    return env, warnings
