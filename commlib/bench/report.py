"""What commlib-bench writes: the text table (``#`` metadata, one row per size, footer), JSON and a plot."""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

from .core import SizeResult

# One row per size and algorithm, so the table keeps its width however many algorithms run:
# size, count, algorithm, time, algbw, busbw, #wrong, then the optional x bound, predicted and meas/pred.
_WIDTHS = (12, 12, 28, 11, 8, 8, 7)
_BOUND, _PRED, _RATIO = 8, 11, 9

@dataclasses.dataclass(frozen=True)
class RunInfo:
    """The ``#`` metadata lines, also written to JSON."""

    collective: str
    commlib_version: str
    mpi_version: str
    ranks: int
    nodes: int
    node_sizes: tuple[int, ...]
    local_size_emulated: bool
    dtype: str
    op: str
    iters: int
    warmup_iters: int
    rounds: int
    check: bool
    compression: str
    torus: str | None
    algorithms: tuple[str, ...]
    skipped: dict[str, str]  # algorithm -> why this job's shape refuses it
    load_average: float | None  # rank 0's machine, 1-minute load average at the start (None if unknown)
    command: str
    link_rate: float | None = None  # bytes/s per node (--link-rate)
    explain: bool = False
    model: list[str] = dataclasses.field(default_factory=list)  # the cost model, as # lines (--explain)
    learned: list[str] = dataclasses.field(default_factory=list)  # what auto measured (--explain)
    auto_warmup: int | None = None  # --auto-warmup: auto's untimed calls per size
    min_time: float = 0.0  # --min-time: seconds of timed calls per algorithm and size, at least


def header(info: RunInfo) -> list[str]:
    nodes = (f"{info.nodes} node(s) of {'/'.join(map(str, info.node_sizes))} rank(s)"
             + (" (emulated with --local-size)" if info.local_size_emulated else " (MPI shared-memory split)"))
    lines = [
        f"# commlib-bench {info.collective}: {info.command}",
        f"# commlib {info.commlib_version}; MPI: {info.mpi_version}",
        f"# ranks {info.ranks}, {nodes}"
        + (f"; load average at start {info.load_average:.2f}" if info.load_average is not None else ""),
        f"# dtype {info.dtype}, op {info.op}, iters {info.iters} in {info.rounds} interleaved round(s)"
        + (f" (more rounds where they take under {info.min_time:g} s)" if info.min_time else "")
        + f", warmup {info.warmup_iters}"
        + (f" (auto {info.auto_warmup})" if info.auto_warmup is not None else "")
        + f", check {'on' if info.check else 'off'}, compression {info.compression}"
        + (f", torus {info.torus}" if info.torus else ""),
        *[f"# skipped {algorithm}: {reason}" for algorithm, reason in info.skipped.items()],
        "# time: median over rounds of the slowest rank's time per call; algbw = size / time; "
        "busbw = algbw * bus factor",
        "#",
    ]
    if info.explain:
        lines += info.model + ["# pred: the model's time; meas/pred: measured / predicted; auto:X ran X", "#"]
    if info.link_rate:
        lines += [f"# x bound: time / (2(n-1)/n x wire bytes / {info.link_rate * 8 / 1e9:g} Gbit/s) on "
                  f"n = {info.nodes} node(s)", "#"]
    w = _WIDTHS
    names = f"#{'size':>{w[0] - 1}} {'count':>{w[1]}} {'algorithm':<{w[2]}} {'time(us)':>{w[3]}} " \
            f"{'algbw':>{w[4]}} {'busbw':>{w[5]}} {'#wrong':>{w[6]}}"
    units = f"#{'(B)':>{w[0] - 1}} {'(elements)':>{w[1]}} {'':<{w[2]}} {'':>{w[3]}} " \
            f"{'(GB/s)':>{w[4]}} {'(GB/s)':>{w[5]}} {'':>{w[6]}}"
    if info.link_rate:
        names += f" {'x bound':>{_BOUND}}"
        units += f" {'':>{_BOUND}}"
    if info.explain:
        names += f" {'pred(us)':>{_PRED}} {'meas/pred':>{_RATIO}}"
        units += f" {'':>{_PRED}} {'':>{_RATIO}}"
    return lines + [names, units]


def row(result: SizeResult, info: RunInfo) -> str:
    """The rows of one size: one per algorithm."""
    w = _WIDTHS
    lines = []
    for m in result.measurements:
        wrong = "N/A" if m.wrong is None else str(m.wrong)
        name = f"{m.algorithm}:{m.chosen}" if m.chosen else m.algorithm
        line = (f"{result.nbytes:>{w[0]}} {result.count:>{w[1]}} {name:<{w[2]}} {m.time_us:>{w[3]}.1f} "
                f"{m.algbw_gbs:>{w[4]}.3f} {m.busbw_gbs:>{w[5]}.3f} {wrong:>{w[6]}}")
        if info.link_rate:
            line += f" {_fmt(m.x_bound, '.2f'):>{_BOUND}}"
        if info.explain:
            ratio = m.time_us / m.predicted_us if m.predicted_us else None
            line += f" {_fmt(m.predicted_us, '.1f'):>{_PRED}} {_fmt(ratio, '.2f'):>{_RATIO}}"
        lines.append(line)
    return "\n".join(lines)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or value != value or value == float("inf") else format(value, spec)


def total_wrong(results: Sequence[SizeResult]) -> int:
    return sum(m.wrong or 0 for r in results for m in r.measurements)


def average_busbw(results: Sequence[SizeResult], algorithm: str) -> float:
    values = [m.busbw_gbs for r in results for m in r.measurements if m.algorithm == algorithm]
    return sum(values) / len(values) if values else 0.0


def winners(results: Sequence[SizeResult]) -> list[dict]:
    """Per size: the algorithm with the highest busbw, and its busbw over native's (None without native)."""
    rows = []
    for r in results:
        best = max(r.measurements, key=lambda m: m.busbw_gbs)
        native = next((m for m in r.measurements if m.algorithm == "native"), None)
        best_other = max((m for m in r.measurements if m.algorithm != "native"), key=lambda m: m.busbw_gbs,
                         default=None)
        auto = next((m for m in r.measurements if m.algorithm == "auto"), None)
        fastest = min(r.measurements, key=lambda m: m.time_us)
        rows.append({
            "nbytes": r.nbytes,
            "auto_vs_fastest": auto.time_us / fastest.time_us if auto else None,
            "best": best.algorithm,
            "best_busbw_gbs": best.busbw_gbs,
            "best_commlib": best_other.algorithm if best_other else None,
            "best_commlib_vs_native": (best_other.busbw_gbs / native.busbw_gbs
                                       if native and best_other and native.busbw_gbs > 0 else None),
        })
    return rows


def footer(results: Sequence[SizeResult], info: RunInfo) -> list[str]:
    lines = ["#", "# Average bus bandwidth (GB/s): " + ", ".join(
        f"{a} {average_busbw(results, a):.3f}" for a in info.algorithms)]
    wrong = total_wrong(results)
    if info.check:
        lines.append(f"# Wrong values: {wrong} " + ("OK" if wrong == 0 else "FAILED"))
    else:
        lines.append("# Wrong values: not checked (-c 0)")
    if len(info.algorithms) > 1:
        has_native = "native" in info.algorithms
        lines.append("#")
        lines.append("# Fastest per size" + (", and the best non-native algorithm's busbw / native's busbw"
                                             if has_native else ""))
        has_auto = "auto" in info.algorithms
        lines.append(f"#{'size(B)':>{_WIDTHS[0] - 1}} {'fastest':>20} {'busbw':>8}"
                     + (f" {'best commlib':>20} {'x native':>9}" if has_native else "")
                     + (f" {'auto/fastest':>12}" if has_auto else ""))
        for w in winners(results):
            line = f"#{w['nbytes']:>{_WIDTHS[0] - 1}} {w['best']:>20} {w['best_busbw_gbs']:>8.3f}"
            if has_native:
                ratio = w["best_commlib_vs_native"]
                line += f" {w['best_commlib'] or '-':>20} {_fmt(ratio, '.2f'):>9}"
            if has_auto:
                line += f" {_fmt(w['auto_vs_fastest'], '.2f'):>12}"
            lines.append(line)
    return lines


def to_json(results: Sequence[SizeResult], info: RunInfo) -> dict:
    return {
        "metadata": dataclasses.asdict(info),
        "results": [
            {"nbytes": r.nbytes, "count": r.count, "rounds": r.rounds, "iters": r.iters,
             "algorithms": {m.algorithm: {"time_us": m.time_us, "algbw_gbs": m.algbw_gbs,
                                          "busbw_gbs": m.busbw_gbs, "wrong": m.wrong, "chosen": m.chosen,
                                          "predicted_us": m.predicted_us, "x_bound": m.x_bound}
                            for m in r.measurements}}
            for r in results
        ],
        "average_busbw_gbs": {a: average_busbw(results, a) for a in info.algorithms},
        "winners": winners(results),
        "wrong_total": total_wrong(results) if info.check else None,
    }


def write_json(path: str, results: Sequence[SizeResult], info: RunInfo) -> None:
    with open(path, "w") as f:
        json.dump(to_json(results, info), f, indent=2)
        f.write("\n")


class PlotUnavailable(RuntimeError):
    """--plot was given but matplotlib is not installed."""


def check_plot_available() -> None:
    """Fail before the sweep, not after it, when --plot cannot be honoured."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib, which is not installed; "
                              "pip install 'commlib[bench]' (or pip install matplotlib), or drop --plot") from None


def human_size(nbytes: float) -> str:
    """4096 -> '4K', 67108864 -> '64M' (powers of 1024, as -b/-e take them)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return f"{nbytes:g}"


def write_plot(path: str, results: Sequence[SizeResult], info: RunInfo) -> None:
    """busbw against size, one line per algorithm, log-scaled size axis, as a PNG."""
    check_plot_available()
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(8, 5))
    sizes = [r.nbytes for r in results]
    for algorithm in info.algorithms:
        busbw = [next(m.busbw_gbs for m in r.measurements if m.algorithm == algorithm) for r in results]
        ax.plot(sizes, busbw, marker="o", label=algorithm)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: human_size(x)))
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"commlib-bench {info.collective}: {info.ranks} ranks, {info.dtype} {info.op}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
