"""All of commlib's configuration, parsed in one place.

Every ``COMMLIB_*`` environment variable maps to exactly one field of :class:`Config` and is documented in
``docs/configuration.md``. Precedence: an explicit argument overrides the environment, which overrides
the default. An unknown ``COMMLIB_*`` variable or an invalid value is a :class:`ConfigError` naming it.
No other module reads these variables (``tests/core/test_config_reads.py``): the library, ``commlib-run``
and its elastic driver all parse them here, and the launcher writes the settings it passes to the ranks
with :func:`environment`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from typing import Any, Callable, Mapping

from .algorithms.spec import names
from .errors import ConfigError
from .validation import algorithm as _algorithm_rule


def algorithm_names() -> tuple[str, ...]:
    """The names COMMLIB_ALGORITHM accepts: ``auto`` and every algorithm of the registry
    (:mod:`commlib.algorithms.spec`; the algorithms sit below the configuration, which they are handed)."""
    return names()

_SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Parse a byte count with an optional K/M/G suffix (powers of 1024): ``"64M"`` -> 67108864."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not match:
        raise ValueError(f"{text!r} is not a byte count (examples: 4096, 64K, 16M, 1G)")
    return int(match.group(1)) * _SIZE_SUFFIXES[match.group(2).upper()]


def parse_shape(text: str) -> tuple[int, int]:
    """Parse a grid shape ``"XxY"`` such as ``"2x4"``."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", str(text))
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise ValueError(f"{text!r} is not a grid shape; write it as XxY with positive X and Y, e.g. 2x4")
    return int(match.group(1)), int(match.group(2))


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{text!r} must be a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"{text!r} must be an integer >= 0")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError(f"{text!r} must be >= 0")
    return value


def _positive_int_size(text: str) -> int:
    value = parse_size(text)
    if value < 1:
        raise ValueError(f"{text!r} must be at least 1 byte")
    return value


def _switch(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not a switch; use 1 or 0")


def _algorithm(text: str) -> str:
    message = _algorithm_rule(str(text), algorithm_names())
    if message:
        raise ValueError(message)
    return str(text).strip().lower()


def _auto_on_off(text: str) -> str:
    value = str(text).strip().lower()
    value = {"1": "on", "true": "on", "yes": "on", "0": "off", "false": "off", "no": "off"}.get(value, value)
    if value not in ("auto", "on", "off"):
        raise ValueError(f"{text!r} is not auto, on or off")
    return value


def _server_transport(text: str) -> str:
    value = str(text).strip().lower()
    if value not in ("tcp", "mpi"):
        raise ValueError(f"{text!r} is not tcp or mpi")
    return value


def _interfaces(text: str) -> str | None:
    """Network interface names, comma-separated (None for none)."""
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", name):
            raise ValueError(f"{name!r} is not a network interface's name (e.g. eth0, ib0)")
    return ",".join(names) or None


def _non_negative_size(text: str) -> int:
    value = parse_size(text)
    if value < 0:
        raise ValueError(f"{text!r} must be >= 0")
    return value


def _congestion(text: str) -> str:
    """A TCP congestion control's name (Linux: /proc/sys/net/ipv4/tcp_available_congestion_control), or
    ``default`` (""): the kernel's."""
    value = str(text).strip().lower()
    if value in ("", "default"):
        return ""
    if not re.fullmatch(r"[a-z0-9_]{1,15}", value):
        raise ValueError(f"{text!r} is not a congestion control's name (e.g. reno, cubic, bbr) or default")
    return value


def _size_or_auto(text: str) -> int | None:
    """A byte count, or ``auto`` (None): the cost model decides."""
    return None if str(text).strip().lower() == "auto" else parse_size(text)


_DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds, with an optional unit s, m (or min) or h: ``"90"``, ``"90s"``, ``"10m"``; must be > 0."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|m|min|h)?\s*", str(text), re.IGNORECASE)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a positive duration (examples: 30, 90s, 10m, 1h)")
    return float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "").lower()]


def _staleness(text: str) -> int | None:
    if str(text).strip().lower() in ("", "none", "unbounded"):
        return None
    return _non_negative_int(text)


def _optional_path(text: str) -> str | None:
    return str(text) or None


WIRE_COMPRESSIONS = ("none", "fp16", "bf16")


def _wire_compression(text: str) -> str:
    value = str(text).strip().lower()
    if value not in WIRE_COMPRESSIONS:
        raise ValueError(f"{text!r} is not one of {', '.join(WIRE_COMPRESSIONS)}")
    return value


@dataclasses.dataclass(frozen=True)
class _Field:
    env: str
    parse: Callable[[str], Any]
    doc: str


@dataclasses.dataclass(frozen=True)
class Config:
    """commlib's settings. Build it with :meth:`Config.load`; it is immutable afterwards."""

    algorithm: str = "auto"
    local_size: int | None = None
    torus_shape: tuple[int, int] | None = None
    ring_segment_bytes: int = 1 << 20
    small_message_bytes: int = 128 << 10
    cma: bool = True
    cma_segment_bytes: int = 256 << 10
    cycle_time_ms: float = 1.0
    fusion_threshold_bytes: int = 64 << 20
    fusion_inplace_bytes: int | None = None  # None: auto (the cost model's limit)
    eager_bytes: int = 64 << 10
    num_streams: int = 1
    stall_check_time_s: float = 60.0
    stall_shutdown_time_s: float = 0.0
    timeout_s: float = 600.0
    cache_capacity: int = 1024
    direct_max_ranks: int = 16
    timeline: str | None = None
    timeline_mark_cycles: bool = False
    tuning_file: str | None = None
    auto_learn: bool = True
    auto_pace: float = 0.05
    auto_cache: str | None = None  # None: the default location; "none": off
    server_partition_bytes: int = 4096000
    start_timeout_s: float = 60.0
    server_timeout_s: float = 30.0
    elastic_dir: str | None = None
    elastic_in_process: bool = False
    priority_partition_bytes: int = 4096000
    priority_credit_bytes: int = 8192000
    server_host_reduce: str = "auto"
    geo_steps: int = 4
    geo_staleness: int | None = None
    server_transport: str = "tcp"
    server_tcp_congestion: str = "reno"
    server_tcp_rcvbuf: int = 512 << 10
    torch_compression: str = "none"
    network_interface: str | None = None
    device_segment_bytes: int = 4 << 20

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "Config":
        """Defaults, then ``COMMLIB_*`` variables from ``environ`` (default ``os.environ``), then
        ``overrides`` (argument values; ``None`` means "not given")."""
        environ = os.environ if environ is None else environ
        known = {f.env for f in FIELDS.values()}
        unknown = sorted(k for k in environ if k.startswith("COMMLIB_") and k not in known)
        if unknown:
            raise ConfigError(
                f"unknown environment variable(s) {', '.join(unknown)}; commlib reads: {', '.join(sorted(known))}"
                " (see docs/configuration.md)"
            )
        values: dict[str, Any] = horovod_values(environ)  # Horovod's twins first: COMMLIB_* wins
        for attr, field in FIELDS.items():
            if field.env in environ:
                raw = environ[field.env]
                try:
                    values[attr] = field.parse(raw)
                except (TypeError, ValueError) as exc:
                    raise ConfigError(f"{field.env}={raw!r} is invalid: {exc}") from None
        for attr, value in overrides.items():
            if attr not in FIELDS:
                raise ConfigError(f"unknown setting {attr!r}; settings: {', '.join(FIELDS)}")
            if value is None:
                continue
            if isinstance(value, str) and attr not in ("timeline", "tuning_file", "elastic_dir", "auto_cache"):
                try:
                    value = FIELDS[attr].parse(value)
                except (TypeError, ValueError) as exc:
                    raise ConfigError(f"{attr}={value!r} is invalid: {exc}") from None
            values[attr] = value
        config = cls(**values)
        config._validate()
        return config

    @property
    def recovers_in_process(self) -> bool:
        """Elastic in-process recovery applies: under the elastic driver, which asked for it (hydra
        started with ``-disable-auto-cleanup``, so a dead rank's endpoint stays in MPI)."""
        return bool(self.elastic_dir) and self.elastic_in_process

    @property
    def wait_limit_s(self) -> float:
        """The longest wait for a peer anywhere: the timeout, or the stall shutdown time if shorter (a
        rank stuck in a transfer gives up as one stuck in a negotiation round would)."""
        if self.stall_shutdown_time_s:
            return min(self.timeout_s, self.stall_shutdown_time_s)
        return self.timeout_s

    #: Settings every rank must share: each rank decides fusion, cache ids and lanes by itself.
    AGREED = ("fusion_threshold_bytes", "fusion_inplace_bytes", "eager_bytes", "num_streams", "cache_capacity",
              "direct_max_ranks", "algorithm", "auto_learn", "auto_pace", "server_partition_bytes",
              "priority_partition_bytes", "priority_credit_bytes", "server_host_reduce", "device_segment_bytes")

    def agreed_values(self) -> tuple:
        return tuple(getattr(self, attr) for attr in self.AGREED)

    @classmethod
    def check_agreement(cls, values_by_rank: list[tuple]) -> None:
        """Raise, naming the variable and every rank's value, if the ranks' :attr:`AGREED` settings differ
        (``values_by_rank[r]`` is rank r's :meth:`agreed_values`)."""
        for i, attr in enumerate(cls.AGREED):
            values = [v[i] for v in values_by_rank]
            if len(set(values)) > 1:
                listing = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
                raise ConfigError(f"{FIELDS[attr].env} must be the same on every rank ({listing}); set it "
                                  "alike everywhere, e.g. with mpiexec -genv")

    def _validate(self) -> None:
        if not self.timeout_s > 0:
            raise ConfigError(f"COMMLIB_TIMEOUT (timeout) must be a positive number of seconds, got {self.timeout_s}")
        if self.cma_segment_bytes < 64:
            raise ConfigError(f"COMMLIB_CMA_SEGMENT must be at least 64 bytes, got {self.cma_segment_bytes}")
        if self.algorithm not in algorithm_names():
            raise ConfigError(f"unknown algorithm {self.algorithm!r}; use one of: "
                              f"{', '.join(algorithm_names())}")
        if self.stall_shutdown_time_s and self.stall_shutdown_time_s < self.stall_check_time_s:
            raise ConfigError(
                "COMMLIB_STALL_SHUTDOWN_TIME must be 0 (off) or at least COMMLIB_STALL_CHECK_TIME "
                f"({self.stall_shutdown_time_s} < {self.stall_check_time_s})"
            )


FIELDS: dict[str, _Field] = {
    "algorithm": _Field("COMMLIB_ALGORITHM", _algorithm,
                        "allreduce algorithm: auto (the cost model's choice) or a name of the registry "
                        "(docs/algorithms.md) (default auto)"),
    "local_size": _Field("COMMLIB_LOCAL_SIZE", _positive_int,
                         "treat consecutive blocks of k ranks as one node (emulates multi-node shapes); "
                         "default: MPI's shared-memory split"),
    "torus_shape": _Field("COMMLIB_TORUS_SHAPE", parse_shape,
                          "XxY grid of the torus2d algorithm; default X = ranks per node, Y = nodes"),
    "ring_segment_bytes": _Field("COMMLIB_RING_SEGMENT", parse_size,
                                 "pipeline segment of the ring algorithm, bytes (K/M/G suffix; default 1M)"),
    "device_segment_bytes": _Field("COMMLIB_DEVICE_SEGMENT", _positive_int_size,
                                   "staged GPU path: a fused device buffer crosses to the host and back in "
                                   "segments of this many bytes, each reduced while the next copies run "
                                   "(docs/gpu.md; default 4M)"),
    "small_message_bytes": _Field("COMMLIB_SMALL_MESSAGE", parse_size,
                                  "hierarchical: shards up to this size cross nodes by recursive doubling, "
                                  "larger ones by ring (default 128K)"),
    "cma": _Field("COMMLIB_CMA", _switch,
                  "1: on one node, probe cross-memory attach at init and let auto use the cma algorithm; "
                  "0: never (default 1)"),
    "cma_segment_bytes": _Field("COMMLIB_CMA_SEGMENT", parse_size,
                                "bytes the cma algorithm copies from a peer per step, kept in cache; "
                                "rounded down to a multiple of 64 (default 256K)"),
    "cycle_time_ms": _Field("COMMLIB_CYCLE_TIME", _non_negative_float,
                            "longest sleep of the background coordinator between polls, ms (default 1)"),
    "fusion_threshold_bytes": _Field("COMMLIB_FUSION_THRESHOLD", parse_size,
                                     "largest fused buffer, bytes; 0 disables fusion (default 64M)"),
    "fusion_inplace_bytes": _Field("COMMLIB_FUSION_INPLACE", _size_or_auto,
                                   "tensors at least this large are reduced in place, never copied into "
                                   "a fusion buffer; auto: the largest size whose copy the cost model "
                                   "predicts to cost less than the call it saves (default auto)"),
    "eager_bytes": _Field("COMMLIB_EAGER_BYTES", parse_size,
                          "an allreduce whose bytes times (ranks - 1) are at most this travels inside the "
                          "negotiation round, and every rank reduces it itself: one latency instead of two "
                          "(auto only, no compression); 0 disables (default 64K)"),
    "num_streams": _Field("COMMLIB_NUM_STREAMS", _positive_int,
                          "execution lanes, each with its own communicator (default 1)"),
    "stall_check_time_s": _Field("COMMLIB_STALL_CHECK_TIME", _non_negative_float,
                                 "seconds before rank 0 reports tensors some ranks have not submitted (and "
                                 "every rank reports peers that stopped answering); "
                                 "0 disables (default 60)"),
    "stall_shutdown_time_s": _Field("COMMLIB_STALL_SHUTDOWN_TIME", _non_negative_float,
                                    "seconds after which a stalled tensor fails on every rank, and a rank "
                                    "that has waited that long for a silent peer gives up on it (commlib "
                                    "then fails on every rank, naming the peer); 0 disables (default 0)"),
    "timeout_s": _Field("COMMLIB_TIMEOUT", parse_duration,
                        "longest wait for a peer (a negotiation round, a send, a receive, a collective, "
                        "the goodbyes); then the call fails with PeerLostError naming the peers, and so "
                        "does every later call (docs/failures.md). Seconds, or with a unit: 90s, 10m, 1h "
                        "(default 10m)"),
    "cache_capacity": _Field("COMMLIB_CACHE_CAPACITY", _positive_int,
                             "negotiated tensors remembered for the fast path (default 1024)"),
    "direct_max_ranks": _Field("COMMLIB_DIRECT_MAX_RANKS", _non_negative_int,
                               "up to this many ranks, each rank sends its negotiation messages to every "
                               "other; above, through rank 0 (default 16)"),
    "timeline": _Field("COMMLIB_TIMELINE", _optional_path,
                       "write a Chrome-trace JSON timeline to this path (default: off)"),
    "timeline_mark_cycles": _Field("COMMLIB_TIMELINE_MARK_CYCLES", _switch,
                                   "1: the timeline marks each coordinator cycle that negotiated or ran "
                                   "something with a CYCLE_START instant (default 0)"),
    "tuning_file": _Field("COMMLIB_TUNING_FILE", _optional_path,
                          "cost-model profile auto reads (commlib-bench --calibrate writes it); 'none': the "
                          "built-in defaults; default ~/.cache/commlib/tuning.json ($XDG_CACHE_HOME) if it "
                          "exists. Rank 0's profile is broadcast to every rank"),
    "auto_learn": _Field("COMMLIB_AUTO_LEARN", _switch,
                         "1: auto measures the algorithms the cost model is unsure between on the first "
                         "calls of each size class (agreed between ranks) and keeps the fastest; 0: auto is "
                         "the cost model's choice alone (default 1)"),
    "auto_pace": _Field("COMMLIB_AUTO_PACE", _non_negative_float,
                        "the share of a size class's call time that auto's exploring may add: a slower "
                        "candidate's calls wait until the class's calls have earned what they cost over the "
                        "best so far, which runs meanwhile (classes the model predicts under 2 ms, and those "
                        "whose calls take 50 ms or more, explore at once); 0: every candidate at once "
                        "(default 0.05)"),
    "auto_cache": _Field("COMMLIB_AUTO_CACHE", _optional_path,
                         "directory where auto keeps what it settled, one file per layout, so that a later job "
                         "of the same layout starts settled; 'none': nothing kept or read; default "
                         "~/.cache/commlib/auto ($XDG_CACHE_HOME). Rank 0 reads it and broadcasts it"),
    "server_partition_bytes": _Field("COMMLIB_SERVER_PARTITION", _positive_int_size,
                                     "push_pull through summation servers: a tensor travels in partitions "
                                     "of at most this many bytes, spread over the servers (K/M/G suffix; "
                                     "default 4096000, BytePS's)"),
    "server_timeout_s": _Field("COMMLIB_SERVER_TIMEOUT", _non_negative_float,
                               "seconds a worker waits for a summation server that has stopped answering "
                               "before failing the tensor, naming the server; 0 waits forever (default 30)"),
    "start_timeout_s": _Field("COMMLIB_START_TIMEOUT", _non_negative_float,
                              "seconds the first commlib.init() (and each summation server) waits for every "
                              "process of the MPI job to start, and a later init() for every worker to call it; "
                              "then every process that came fails, naming the ranks missing; 0 waits forever "
                              "(default 60)"),
    "elastic_dir": _Field("COMMLIB_ELASTIC_DIR", _optional_path,
                          "set by commlib-run's elastic driver: where rank 0 keeps the last committed elastic "
                          "state and the driver flags host changes (docs/elastic.md); default: not elastic"),
    "elastic_in_process": _Field("COMMLIB_ELASTIC_IN_PROCESS", _switch,
                                 "set by commlib-run's elastic driver when its MPI lets the survivors of a lost "
                                 "rank go on (hydra with -disable-auto-cleanup): 1: they rebuild commlib over "
                                 "themselves in process; 0: the job is restarted (docs/elastic.md; default 0)"),
    "priority_partition_bytes": _Field("COMMLIB_PRIORITY_PARTITION", _positive_int_size,
                                       "priority scheduling (allreduces with a priority): a larger tensor runs "
                                       "in partitions of at most this many bytes, so that a more urgent one can "
                                       "go between them (K/M/G suffix; default 4096000)"),
    "priority_credit_bytes": _Field("COMMLIB_PRIORITY_CREDIT", _positive_int_size,
                                    "priority scheduling: bytes started per negotiation round, most urgent "
                                    "first; the rest waits for the next round, where newly ready tensors "
                                    "compete again (K/M/G suffix; default 8192000, two partitions)"),
    "server_host_reduce": _Field("COMMLIB_SERVER_HOST_REDUCE", _auto_on_off,
                                 "push_pull and algorithm='ps' with several workers on a host: reduce inside "
                                 "the host first, so that each partition is pushed once per host; auto: where "
                                 "the cost model finds it cheaper (the host's link to the servers is the "
                                 "bottleneck), on, off (default auto)"),
    "server_transport": _Field("COMMLIB_SERVER_TRANSPORT", _server_transport,
                               "summation servers: how push_pull's partitions and answers travel between "
                               "workers and servers; tcp: plain TCP connections, one per worker and server "
                               "(MPI still finds the servers and carries control messages); mpi: MPI "
                               "point-to-point, e.g. to use an RDMA fabric MPI drives. Read by the servers; "
                               "the workers follow them (default tcp)"),
    "server_tcp_congestion": _Field("COMMLIB_SERVER_TCP_CONGESTION", _congestion,
                                    "summation servers over TCP: the congestion control of push_pull's "
                                    "connections (both ends; 'default': the kernel's; default reno)"),
    "server_tcp_rcvbuf": _Field("COMMLIB_SERVER_TCP_RCVBUF", _non_negative_size,
                                "summation servers over TCP: the receive buffer of a worker's connections "
                                "to the servers, which bounds the answers in flight towards it (K/M/G "
                                "suffix; 0: the kernel's autotuning; default 512K)"),
    "torch_compression": _Field("COMMLIB_TORCH_COMPRESSION", _wire_compression,
                                "the torch.distributed backend 'commlib': wire compression of float32 "
                                "all_reduce (DDP's buckets) with SUM or AVG: none, fp16 or bf16 (float32 "
                                "accumulation); a process group's options override it (default none)"),
    "network_interface": _Field("COMMLIB_NETWORK_INTERFACE", _interfaces,
                                "the network interface(s) of the job, comma-separated (commlib-run "
                                "--network-interface sets it): summation servers listen for push_pull over "
                                "TCP on their addresses only (default: the interface the host's name resolves "
                                "to, else the one that routes to the job's other hosts; loopback on one host)"),
    "geo_steps": _Field("COMMLIB_GEO_STEPS", _positive_int,
                        "Geo-SGD: local steps between two exchanges with the servers, GeoSGD's k (default 4)"),
    "geo_staleness": _Field("COMMLIB_GEO_STALENESS", _staleness,
                            "Geo-SGD: a worker waits while it is more than this many rounds ahead of the slowest "
                            "worker; 'none' (the default): never"),
}


# ---- the MPI launcher ----------------------------------------------------------------------------------
#: Variables an MPI launcher sets in every process it starts: MPICH's hydra and Slurm's PMI-2 (PMI_*), PMIx
#: (Slurm, Open MPI 5), Open MPI's own. A process without any was started some other way (torchrun,
#: multiprocessing): MPI would make it a world of its own.
MPI_LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_FD", "PMI_PORT", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")


def mpi_launched(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started by an MPI launcher (mpiexec, commlib-run, srun with PMI)."""
    environ = os.environ if environ is None else environ
    return any(environ.get(name) for name in MPI_LAUNCHER_VARIABLES)


# ---- settings for other processes (commlib-run and its elastic driver) ----------------------------------


def environment(**values: Any) -> dict[str, str]:
    """The ``COMMLIB_*`` variables that give these settings (field name -> value) to another process, such
    as the ranks ``commlib-run`` starts: each value written as its variable's parser reads it back. A value
    that parser refuses is the :class:`ConfigError` ``Config.load`` would raise, naming the variable."""
    variables = {}
    for attr, value in values.items():
        if attr not in FIELDS:
            raise ConfigError(f"unknown setting {attr!r}; settings: {', '.join(FIELDS)}")
        field = FIELDS[attr]
        text = _text(value)
        try:
            field.parse(text)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{field.env}={text!r} is invalid: {exc}") from None
        variables[field.env] = text
    return variables


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, tuple):
        return "x".join(map(str, value))
    return "" if value is None else str(value)


def for_job(variables: Mapping[str, str] | None = None, **overrides: Any) -> Config:
    """The configuration a process started with this process's environment plus ``variables`` (the
    ``COMMLIB_*`` variables a launcher passes to the ranks) loads at ``init()``; ``commlib-run`` checks the
    job's settings with it before it starts anything. Horovod's variables that commlib cannot honour are
    not warned about here: the ranks do."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IgnoredSettingWarning)
        return Config.load({**os.environ, **(variables or {})}, **overrides)


def is_set(attr: str, variables: Mapping[str, str] | None = None) -> bool:
    """Whether this process's environment plus ``variables`` gives setting ``attr`` a value: its
    ``COMMLIB_*`` variable, or a ``HOROVOD_*`` twin set to ask for one (an invalid value counts: loading it
    is the error)."""
    environ = {**os.environ, **(variables or {})}
    if FIELDS[attr].env in environ:
        return True
    for twin in HOROVOD_TWINS:
        if twin.attr == attr and twin.env in environ:
            try:
                if twin.parse(environ[twin.env]) is not None:
                    return True
            except (TypeError, ValueError):
                return True
    return False


# ---- Horovod's environment -----------------------------------------------------------------------------
# A job written for Horovod sets HOROVOD_* variables (horovodrun turns its flags into them). Each one with a
# commlib meaning is read as the twin of a COMMLIB_* setting (the COMMLIB_* variable wins when both are
# set); each one commlib cannot honour is a warning naming it, once per process. docs/configuration.md
# lists both tables.


class IgnoredSettingWarning(UserWarning):
    """A HOROVOD_* variable commlib cannot honour is set."""


@dataclasses.dataclass(frozen=True)
class _Twin:
    env: str
    attr: str
    parse: Callable[[str], Any]  # returns the field's value, or None: this value asks for nothing
    doc: str


def _horovod_timeline(text: str) -> str | None:
    # DYNAMIC: Horovod's "no file now, start_timeline() later", which commlib always allows
    return None if str(text).strip().upper() in ("", "DYNAMIC") else str(text)


def _algorithm_switch(name: str) -> Callable[[str], str | None]:
    return lambda text: name if _switch(text) else None


def _stall_check_disable(text: str) -> float | None:
    return 0.0 if _switch(text) else None


HOROVOD_TWINS: tuple[_Twin, ...] = (
    _Twin("HOROVOD_FUSION_THRESHOLD", "fusion_threshold_bytes", parse_size, "bytes; 0 disables fusion"),
    _Twin("HOROVOD_CYCLE_TIME", "cycle_time_ms", _non_negative_float, "milliseconds"),
    _Twin("HOROVOD_CACHE_CAPACITY", "cache_capacity", _positive_int,
          "Horovod's 0 (no response cache) is an error: commlib's fast path always has a cache"),
    _Twin("HOROVOD_TIMELINE", "timeline", _horovod_timeline,
          "rank 0 writes this file, rank r > 0 writes name.rankR.json; DYNAMIC: none until start_timeline()"),
    _Twin("HOROVOD_TIMELINE_MARK_CYCLES", "timeline_mark_cycles", _switch, "1/0"),
    _Twin("HOROVOD_STALL_CHECK_TIME_SECONDS", "stall_check_time_s", _non_negative_float, "seconds"),
    _Twin("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "stall_shutdown_time_s", _non_negative_float, "seconds"),
    _Twin("HOROVOD_STALL_CHECK_DISABLE", "stall_check_time_s", _stall_check_disable,
          "1: COMMLIB_STALL_CHECK_TIME=0 (wins over HOROVOD_STALL_CHECK_TIME_SECONDS, as in Horovod)"),
    _Twin("HOROVOD_HIERARCHICAL_ALLREDUCE", "algorithm", _algorithm_switch("hierarchical"),
          "1: COMMLIB_ALGORITHM=hierarchical; 0: no effect"),
    _Twin("HOROVOD_TORUS_ALLREDUCE", "algorithm", _algorithm_switch("torus2d"),
          "1: COMMLIB_ALGORITHM=torus2d; 0: no effect"),
    _Twin("HOROVOD_NUM_NCCL_STREAMS", "num_streams", _positive_int,
          "execution lanes, each with its own communicator (on the host as on the GPU)"),
)

#: HOROVOD_* variables commlib cannot honour -> why (the warning's text). Switches warn only when on.
HOROVOD_IGNORED: dict[str, str] = {
    "HOROVOD_AUTOTUNE": "commlib does not search fusion threshold and cycle time at run time; COMMLIB_ALGORITHM=auto "
                        "picks the algorithm per size from the cost model (commlib-bench --calibrate fits it)",
    "HOROVOD_AUTOTUNE_LOG": "no autotuning, so no autotune log",
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "no autotuning",
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "no autotuning",
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "no autotuning",
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "no autotuning",
    "HOROVOD_HIERARCHICAL_ALLGATHER": "commlib's allgather has one schedule (MPI's)",
    "HOROVOD_MPI_THREADS_DISABLE": "commlib's coordinator thread calls MPI: it always asks for MPI_THREAD_MULTIPLE",
    "HOROVOD_BATCH_D2D_MEMCOPIES": "commlib packs fusion buffers with its own kernels",
    "HOROVOD_THREAD_AFFINITY": "commlib does not pin its coordinator thread",
    "HOROVOD_DISABLE_GROUP_FUSION": "commlib fuses grouped tensors like any others",
    "HOROVOD_ENABLE_ASYNC_COMPLETION": "commlib completes a handle when its collective has finished",
    "HOROVOD_ENABLE_XLA_OPS": "no XLA ops",
    "HOROVOD_ADASUM_MPI_CHUNK_SIZE": "commlib's Adasum has no chunk-size setting",
    "HOROVOD_GLOO_IFACE": "commlib runs on MPI, not Gloo: choose the interface with commlib-run --network-interface",
    "HOROVOD_GLOO_TIMEOUT_SECONDS": "commlib runs on MPI, not Gloo",
    "HOROVOD_CCL_CACHE": "commlib does not use oneCCL",
    "HOROVOD_LOG_LEVEL": "commlib logs through Python's logging module (logging.getLogger('commlib'))",
    "HOROVOD_LOG_HIDE_TIME": "commlib logs through Python's logging module",
}
_IGNORED_SWITCHES = frozenset(("HOROVOD_AUTOTUNE", "HOROVOD_HIERARCHICAL_ALLGATHER", "HOROVOD_MPI_THREADS_DISABLE",
                               "HOROVOD_BATCH_D2D_MEMCOPIES", "HOROVOD_DISABLE_GROUP_FUSION",
                               "HOROVOD_ENABLE_ASYNC_COMPLETION", "HOROVOD_ENABLE_XLA_OPS"))
#: HOROVOD_* variables that choose what commlib always does: accepted, nothing to change.
HOROVOD_INHERENT: dict[str, Callable[[str], bool]] = {
    "HOROVOD_CONTROLLER": lambda v: v.strip().upper() in ("", "MPI"),
    "HOROVOD_CPU_OPERATIONS": lambda v: v.strip().upper() in ("", "MPI"),
    "HOROVOD_DISABLE_NVTX_RANGES": lambda v: True,   # commlib emits no NVTX ranges
    "HOROVOD_DYNAMIC_PROCESS_SETS": lambda v: True,  # commlib's add_process_set works at any time
}

_warned: set[str] = set()


def horovod_values(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings Horovod's variables in ``environ`` ask for (field name -> value); warns, once per process
    and variable, about each set variable commlib cannot honour. An invalid value is a ConfigError naming it."""
    values: dict[str, Any] = {}
    asked: dict[str, str] = {}
    for twin in HOROVOD_TWINS:
        if twin.env not in environ:
            continue
        raw = environ[twin.env]
        try:
            value = twin.parse(raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{twin.env}={raw!r} is invalid: {exc} (commlib reads it as "
                              f"{FIELDS[twin.attr].env})") from None
        if value is None:
            continue
        if twin.attr == "algorithm" and "algorithm" in values and values["algorithm"] != value:
            raise ConfigError(f"{asked['algorithm']} and {twin.env} ask for two allreduce algorithms; set one")
        if twin.attr == "stall_check_time_s" and asked.get("stall_check_time_s") == "HOROVOD_STALL_CHECK_DISABLE":
            continue  # disable wins, whichever order
        values[twin.attr] = value
        asked[twin.attr] = twin.env
    for name, why in HOROVOD_IGNORED.items():
        raw = environ.get(name)
        if raw is None or not raw.strip():
            continue
        if name in _IGNORED_SWITCHES and raw.strip().lower() in ("0", "false", "no", "off"):
            continue
        _warn_once(name, f"{name}={raw} is not honoured by commlib: {why}")
    for name, accepted in HOROVOD_INHERENT.items():
        raw = environ.get(name)
        if raw is not None and not accepted(raw):
            _warn_once(name, f"{name}={raw} is not honoured by commlib: commlib runs its collectives on MPI")
    return values


def _warn_once(name: str, message: str) -> None:
    if name not in _warned:
        _warned.add(name)
        warnings.warn(message, IgnoredSettingWarning, stacklevel=3)
