"""The command line of commlib-bench: nccl-tests' flags, parsed once into one immutable :class:`Options`.

Every check of an option against another happens here, so an incompatible combination fails before any
MPI traffic with a message that says what to change.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from ..algorithms.spec import get as spec_of, names as algorithm_names
from ..config import Config, parse_shape, parse_size
from ..dtypes import TABLE
from ..errors import ConfigError
from ..ops import ReduceOp

#: -d names: nccl-tests' first (the table prints the first name of a dtype), then every numeric row of the
#: dtype table (commlib/dtypes.py) by numpy's name. bool has no check values (they are counts).
_NCCL_NAMES = {"float": "float32", "half": "float16", "double": "float64", "char": "int8", "int": "int32"}
_BY_NAME = {row.name: row.numpy for row in TABLE if row.kind != "bool"}
DTYPES = {**{alias: _BY_NAME[name] for alias, name in _NCCL_NAMES.items()}, **_BY_NAME, "bf16": _BY_NAME["bfloat16"]}

#: -o names as nccl-tests spells them.
OPS = {"sum": ReduceOp.SUM, "prod": ReduceOp.PRODUCT, "min": ReduceOp.MIN, "max": ReduceOp.MAX,
       "avg": ReduceOp.AVERAGE}

COMPRESSIONS = ("none", "fp16", "bf16")

COLLECTIVE_NAMES = ("allreduce", "allgather", "broadcast", "reducescatter", "alltoall")


class UsageError(ValueError):
    """An option, or a combination of options, that commlib-bench cannot run."""


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything one run of commlib-bench needs; built by :func:`parse_options`."""

    collective: str = "allreduce"
    minbytes: int = 32 << 20
    maxbytes: int = 32 << 20
    stepfactor: int = 2
    iters: int = 20
    warmup_iters: int = 5
    rounds: int = 5
    auto_warmup: int | None = None  # --auto-warmup: auto's untimed calls per size (None: warmup_iters)
    auto_pace: float = 0.0  # --auto-pace: COMMLIB_AUTO_PACE for this run
    min_time: float = 0.0  # --min-time: more rounds per size until each algorithm's timed calls take this
    root: int = 0
    check: bool = True
    op: ReduceOp = ReduceOp.SUM
    dtype: np.dtype = np.dtype(np.float32)
    algorithms: tuple[str, ...] = ("native",)
    all_algorithms: bool = False  # --algo all: leave out, with a note, the algorithms this shape refuses
    local_size: int | None = None
    torus_shape: tuple[int, int] | None = None
    compression: str = "none"
    json_path: str | None = None
    plot_path: str | None = None
    progress: bool | None = None  # None: only when stderr is a terminal
    calibrate_path: str | None = None  # --calibrate: fit the cost model and write the profile here
    explain: bool = False  # --explain: the model's predicted time beside each measured one
    link_rate: float | None = None  # --link-rate: bytes/s of each node's link, for the "x bound" column
    device: str = "cpu"  # --device cuda: device buffers through the staged path and NCCL (bench/device.py)

    @property
    def dtype_name(self) -> str:
        """The dtype as the table prints it (nccl-tests' name)."""
        for name, dtype in DTYPES.items():
            if dtype == self.dtype:
                return name
        return str(self.dtype)

    @property
    def op_name(self) -> str:
        return next(name for name, op in OPS.items() if op is self.op)

    def sizes(self) -> list[int]:
        """The byte counts of the sweep, before each collective rounds them to whole elements."""
        sizes, size = [], self.minbytes
        while size <= self.maxbytes:
            sizes.append(size)
            if self.stepfactor == 1:
                break
            size *= self.stepfactor
        return sizes

    def config(self) -> Config:
        """commlib's configuration with this run's node size and torus shape applied on top of COMMLIB_*."""
        return Config.load(local_size=self.local_size, torus_shape=self.torus_shape, auto_pace=self.auto_pace)


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _at_least(kind: type, least, what: str):
    """An argparse type: ``kind(text)``, at least ``least`` (NaN is not), else an error naming ``what``."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value >= least:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value
    return parse


_positive = _at_least(int, 1, "a positive integer")
_non_negative = _at_least(int, 0, "a non-negative integer")
_share = _at_least(float, 0.0, "a number >= 0")


def _choice(table: dict):
    def parse(text: str):
        key = text.strip().lower()
        if key not in table:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of: {', '.join(table)}")
        return table[key]
    return parse


def _algorithms(text: str) -> tuple[str, ...]:
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if names == ["all"]:  # the algorithms of host buffers (nccl is measured by --device cuda)
        return tuple(n for n in algorithm_names(with_auto=False) if not spec_of(n).device) + ("auto",)
    unknown = [n for n in names if n not in algorithm_names()]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown algorithm(s) {', '.join(unknown) or repr(text)}; use 'all' or a comma list of: "
            + ", ".join(algorithm_names()))
    return tuple(dict.fromkeys(names))  # keep order, drop repeats


def parse_rate(text: str) -> float:
    """A link rate as tc writes it (``1gbit``, ``100mbit``, ``125mbps`` = bytes), in bytes per second: the
    same syntax as the emulated cluster's ``--rate``."""
    from ..testing.cluster import parse_rate as bits_per_second

    try:
        value = bits_per_second(text) / 8
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a link rate must be positive")
    return value


def _shape(text: str) -> tuple[int, int]:
    try:
        return parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="commlib-bench",
        description="Bandwidth and correctness of commlib's collectives over a range of sizes, every "
                    "allreduce algorithm side by side with MPI's own. Run it under mpiexec; rank 0 prints.",
        epilog="Example: mpiexec -n 2 commlib-bench -b 4K -e 64M -f 2 --algo all --json out.json")
    add = parser.add_argument
    add("-C", "--collective", default="allreduce", choices=COLLECTIVE_NAMES,
        help="collective to measure (default allreduce)")
    add("-b", "--minbytes", type=_size, default=32 << 20, help="smallest size, bytes, K/M/G suffix (default 32M)")
    add("-e", "--maxbytes", type=_size, default=None, help="largest size (default: minbytes)")
    add("-f", "--stepfactor", type=_positive, default=2, help="multiply the size by this each step (default 2)")
    add("-n", "--iters", type=_positive, default=20, help="timed iterations per algorithm and size (default 20)")
    add("-w", "--warmup_iters", type=_non_negative, default=5,
        help="untimed iterations per algorithm and size first (default 5)")
    add("--rounds", type=_positive, default=5,
        help="split the timed iterations into this many interleaved rounds (default 5; at most -n)")
    add("--auto-warmup", type=_non_negative, default=None, metavar="N",
        help="untimed calls of auto per size, in which it explores and settles (default: -w); its timed "
             "calls then measure what it settled on after N calls")
    add("--auto-pace", type=_share, default=0.0, metavar="SHARE",
        help="COMMLIB_AUTO_PACE for this run (default 0: auto explores each size at once, within its "
             "--auto-warmup calls, where a training job spreads its exploring over its calls)")
    add("--min-time", type=float, default=0.0, metavar="SECONDS",
        help="per size, add rounds (of -n/--rounds calls each) until each algorithm's timed calls take "
             "about this long, from the warm-up calls' times (default 0: -n calls); short calls then get "
             "many interleaved rounds, whose median one noisy round cannot move")
    add("-r", "--root", type=_non_negative, default=0, help="root rank of broadcast (default 0)")
    add("-c", "--check", type=int, choices=(0, 1), default=1, help="check the results (default 1)")
    add("-o", "--op", type=_choice(OPS), default=ReduceOp.SUM, help="sum, prod, min, max or avg (default sum)")
    add("-d", "--datatype", type=_choice(DTYPES), default=np.dtype(np.float32),
        help="float, half, bfloat16, double, int8, uint8, int32, int64 or a numpy name (default float)")
    add("--algo", type=_algorithms, default=None,
        help="allreduce algorithms, comma separated, or 'all' (default native); one of: " + ", ".join(algorithm_names()))
    add("--local-size", type=_positive, default=None, metavar="K",
        help="treat consecutive blocks of K ranks as one node (emulates several nodes)")
    add("--torus", type=_shape, default=None, metavar="XxY", help="grid of the torus2d algorithm")
    add("--compression", choices=COMPRESSIONS, default="none",
        help="wire format of float32 allreduce (not with native) (default none)")
    add("--json", dest="json_path", default=None, metavar="FILE", help="write every result as JSON to FILE")
    add("--plot", dest="plot_path", default=None, metavar="FILE",
        help="draw busbw against size per algorithm to a PNG (needs matplotlib: pip install commlib[bench])")
    add("--calibrate", dest="calibrate_path", nargs="?", const="", default=None, metavar="FILE",
        help="measure the links, kernels and MPI's allreduce on this job, fit the cost model and write the "
             "tuning profile to FILE (default: COMMLIB_TUNING_FILE, else ~/.cache/commlib/tuning.json); "
             "then run the sweep with it. (-o is the reduction op, as in nccl-tests)")
    add("--explain", action="store_true",
        help="print the cost model's predicted time beside each measured one, and what auto chose")
    add("--link-rate", type=parse_rate, default=None, metavar="RATE",
        help="each node's link rate as tc writes it (e.g. 1gbit, 10gbit, 125mbps = bytes): add each time as a multiple of the link "
             "bound 2(n-1)/n x size / rate for n nodes (wire bytes with --compression)")
    add("--device", choices=("cpu", "cuda"), default="cpu",
        help="cuda: allreduce CuPy device buffers through commlib's device path, the staged path and NCCL "
             "where it can run, against the copy bound (device to host + host to device at the measured "
             "PCIe rate); needs CuPy and a GPU on every rank (default cpu)")
    progress = parser.add_mutually_exclusive_group()
    progress.add_argument("--progress", dest="progress", action="store_true", default=None,
                          help="show a progress bar on stderr (default: only when stderr is a terminal)")
    progress.add_argument("--no-progress", dest="progress", action="store_false", help="never show it")
    return parser


def parse_options(argv: list[str] | None = None) -> Options:
    """Parse and validate ``argv``; a bad flag or combination exits with status 2 and a message."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return validate(args)
    except (UsageError, ConfigError) as exc:
        parser.error(str(exc))
        raise  # parser.error exits; this keeps type checkers quiet


def validate(args: argparse.Namespace) -> Options:
    """Turn parsed arguments into :class:`Options`, rejecting combinations that cannot run."""
    maxbytes = args.minbytes if args.maxbytes is None else args.maxbytes
    if not 0 <= args.min_time < float("inf"):
        raise UsageError(f"--min-time must be a finite number of seconds, at least 0 (got {args.min_time})")
    if args.minbytes < 1:
        raise UsageError(f"-b/--minbytes must be at least 1 byte (got {args.minbytes})")
    if maxbytes < args.minbytes:
        raise UsageError(f"-e/--maxbytes ({maxbytes}) is smaller than -b/--minbytes ({args.minbytes})")
    algorithms = args.algo
    if args.collective != "allreduce":
        if algorithms is not None:
            raise UsageError(f"--algo chooses allreduce algorithms; {args.collective} has one implementation")
        if args.compression != "none":
            raise UsageError(f"--compression applies to allreduce only, not {args.collective}")
        algorithms = ("engine",)
    elif algorithms is None:
        algorithms = ("native",)
    if args.compression != "none":
        if args.datatype != np.dtype(np.float32):
            raise UsageError(f"--compression {args.compression} compresses float32 buffers; "
                             f"drop it or use -d float (got -d {args.datatype})")
        if "native" in algorithms and args.algo != _algorithms("all"):  # all: left out with a note
            raise UsageError(f"--compression {args.compression} cannot apply to native (MPI's own allreduce "
                             "sends float32); leave native out of --algo or use --compression none")
    reduces = args.collective in ("allreduce", "reducescatter")
    if reduces and args.op is ReduceOp.AVERAGE and args.datatype.kind in "iu":
        raise UsageError(f"-o avg needs a floating type, not {args.datatype} (the mean is not an integer)")
    if args.root and args.collective != "broadcast":
        raise UsageError(f"-r/--root applies to broadcast, not {args.collective}")
    if not reduces and args.op is not ReduceOp.SUM:
        raise UsageError(f"-o applies to reductions; {args.collective} does not reduce")
    options = Options(
        collective=args.collective, minbytes=args.minbytes, maxbytes=maxbytes, stepfactor=args.stepfactor,
        iters=args.iters, warmup_iters=args.warmup_iters, rounds=min(args.rounds, args.iters),
        auto_warmup=args.auto_warmup, auto_pace=args.auto_pace, min_time=args.min_time, root=args.root,
        check=bool(args.check), op=args.op, dtype=args.datatype, algorithms=tuple(algorithms),
        all_algorithms=args.algo == _algorithms("all"),
        local_size=args.local_size, torus_shape=args.torus, compression=args.compression,
        json_path=args.json_path, plot_path=args.plot_path, progress=args.progress,
        calibrate_path=args.calibrate_path, explain=args.explain, link_rate=args.link_rate, device=args.device)
    if options.device == "cuda":
        if options.collective != "allreduce":
            raise UsageError(f"--device cuda measures allreduce, not {options.collective}")
        if args.algo is not None or options.calibrate_path is not None or options.plot_path is not None:
            raise UsageError("--device cuda measures the staged path and NCCL in one table: drop --algo, "
                             "--calibrate and --plot")
    if (options.explain or options.calibrate_path is not None) and options.collective != "allreduce":
        raise UsageError(f"--explain and --calibrate model allreduce, not {options.collective}")
    if options.stepfactor == 1 and options.minbytes != options.maxbytes:
        raise UsageError("-f 1 would never reach -e; use -f 2 or larger, or -e equal to -b")
    options.config()  # COMMLIB_* and --local-size/--torus must agree before anything runs
    return options
