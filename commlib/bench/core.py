"""The benchmark core: buffers, warm-up, correctness check, interleaved timing, max over ranks.

First every algorithm runs once at the largest size (creating its scratch buffers and sub-groups).
Then, for each size, every algorithm runs ``warmup_iters`` untimed calls (``auto``: ``auto_warmup`` where
given, the calls in which it explores and settles), then one checked call on fresh inputs, then ``iters``
timed calls split into ``rounds`` rounds; with ``min_time``, more rounds of the same length where the
warm-up calls show that those would take less than ``min_time`` per algorithm (the median of many rounds
is what one noisy round cannot move; the rounds are agreed, the slowest rank's warm-up times deciding).
Within a round the algorithms take turns,
each timing a block of consecutive calls after a barrier, and each round starts with the next algorithm
(A, B, C, then B, C, A, ...), so machine noise lands on every algorithm alike, and so does whatever comes
with a position in the round (on the emulated cluster a round's first block runs slower, whichever
algorithm runs there: docs/results/design_choices.md). A block's time per call is the slowest rank's; an algorithm's time is the
median over its rounds.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
import warnings
from typing import Callable, Iterator

import ml_dtypes
import numpy as np

from ..compression import Compression, CompressionOverflowWarning, WireCodec
from ..errors import ConfigError
from ..ops import ReduceOp
from .collective import Collective, Layout, exact_limit
from .options import Options

#: Called after every size with (sizes done, sizes in all).
ProgressFn = Callable[[int, int], None]


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One algorithm at one size. ``wrong`` is None when the check was off."""

    algorithm: str
    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: int | None
    chosen: str | None = None  # auto: the algorithm it ran
    predicted_us: float | None = None  # the cost model's time (--explain)
    x_bound: float | None = None  # time / the link bound (--link-rate)


@dataclasses.dataclass(frozen=True)
class SizeResult:
    nbytes: int
    count: int
    measurements: tuple[Measurement, ...]
    rounds: int | None = None  # timed rounds run at this size
    iters: int | None = None   # timed calls per algorithm at this size


def codec_of(options: Options):
    """The WireCodec of ``--compression`` (None for none)."""
    codec = getattr(Compression, options.compression)
    return codec if isinstance(codec, WireCodec) else None


def check_limit(options: Options) -> int:
    """Largest check value that the dtype, and the wire format if compressed, hold exactly."""
    codec = codec_of(options)
    limit = exact_limit(options.dtype)
    return min(limit, exact_limit(codec.wire_dtype)) if codec is not None else limit


def _eps(dtype: np.dtype) -> float:
    return float(ml_dtypes.finfo(dtype).eps)  # ml_dtypes' finfo also knows bfloat16


def tolerance(expected: np.ndarray, dtype: np.dtype, op: ReduceOp, nranks: int, codec) -> np.ndarray | float:
    """How far a correct result may be from ``expected``: 0 except where rounding is inherent.

    Average divides by the number of ranks, which rounds (allow 2 ulps); float16 compression divides by the
    number of ranks before encoding, which rounds each contribution (allow n float16 epsilons of the
    magnitude). Every other result is an exact integer in the dtype and must match exactly."""
    if dtype.kind in "iu":
        return 0.0
    tol = 0.0
    if op is ReduceOp.AVERAGE:
        tol = 2 * _eps(dtype) * np.abs(expected)
    if codec is not None:
        tol = tol + nranks * _eps(codec.wire_dtype) * np.maximum(np.abs(expected), 1.0)
    return tol


def count_wrong(result: np.ndarray, expected: np.ndarray, tol) -> int:
    """Elements of ``result`` farther than ``tol`` from ``expected`` (NaN counts as wrong)."""
    if result.shape != expected.shape:
        return int(max(result.size, expected.size))
    if result.dtype.kind in "iu":
        return int(np.count_nonzero(result.astype(np.int64) != expected))
    diff = np.abs(result.astype(np.float64) - expected)
    return int(np.count_nonzero(~(diff <= tol)))


class _Arena:
    """Two buffers sized for the largest step, allocated and touched once: fresh pages on every size
    would add page-fault time to the first calls."""

    def __init__(self, dtype: np.dtype, count: int):
        self.pristine = np.zeros(count, dtype=dtype)
        self.work = np.zeros(count, dtype=dtype)

    def views(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        return self.pristine[:count], self.work[:count]


def layouts(options: Options, collective: Collective, nranks: int) -> list[Layout]:
    """The sweep's distinct layouts, in size order (sizes that round to the same elements run once)."""
    seen, result = set(), []
    for nbytes in options.sizes():
        layout = collective.layout(nbytes, options.dtype.itemsize, nranks)
        if layout.nbytes not in seen:
            seen.add(layout.nbytes)
            result.append(layout)
    return result


def refusals(options: Options, collective: Collective, engine) -> dict[str, str]:
    """The algorithms that refuse this job's shape (e.g. torus2d on nodes of unequal size), with their
    reasons. Collective over the engine: each algorithm runs once on one element.

    An algorithm refuses with a ConfigError before any communication, and its verdict depends only on
    the topology and configuration, which every rank shares - so every rank reaches the same verdict."""
    if collective.name != "allreduce":
        return {}
    reasons = {}
    codec = codec_of(options)
    for algorithm in options.algorithms:
        try:
            engine.allreduce_(np.ones(1, options.dtype), options.op, algorithm=algorithm, codec=codec)
        except ConfigError as exc:
            reasons[algorithm] = str(exc)
    return reasons


def turn_order(count: int, round_index: int) -> list[int]:
    """The order in which ``count`` interleaved algorithms take turns in round ``round_index``: each round
    starts with the next one (0, 1, 2, then 1, 2, 0, ...), so no algorithm always runs first; and every
    ``count`` rounds the stride changes (1, then the next one coprime with ``count``: 0, 2, 1, ...), so
    no algorithm always runs right after the same one. A block can pay for how the one before it ended
    (docs/results/design_choices.md)."""
    strides = [s for s in range(1, count) if math.gcd(s, count) == 1] or [1]
    stride = strides[(round_index // count) % len(strides)]
    return [(round_index + i * stride) % count for i in range(count)]


def _block_lengths(iters: int, rounds: int) -> list[int]:
    base, extra = divmod(iters, rounds)
    return [base + (1 if r < extra else 0) for r in range(rounds)]


#: At most this many timed rounds per size with ``min_time``: enough for every algorithm to follow each
#: of the others many times (``turn_order``), so that the same algorithm under two names measures alike
#: (docs/results/design_choices.md).
MAX_ROUNDS = 400


def timed_blocks(iters: int, rounds: int, min_time: float, call_s: float) -> list[int]:
    """The timed calls per round: ``iters`` in ``rounds`` rounds, and where ``min_time`` asks, more rounds of
    the same lengths (at most MAX_ROUNDS) until ``call_s`` seconds per call add up to ``min_time``."""
    blocks = _block_lengths(iters, rounds)
    if min_time <= 0 or call_s <= 0:
        return blocks
    per_round = call_s * iters / rounds
    wanted = min(MAX_ROUNDS, max(rounds, math.ceil(min_time / per_round - 1e-9)))
    return [blocks[r % rounds] for r in range(wanted)]


class _Sweep:
    """One rank's part of a sweep: the options, the engine and the benchmark's own communicator."""

    def __init__(self, options: Options, collective: Collective, comm, engine):
        self.options, self.collective, self.comm, self.engine = options, collective, comm, engine
        self.rank, self.nranks = comm.Get_rank(), comm.Get_size()
        self.codec, self.limit = codec_of(options), check_limit(options)

    def call(self, algorithm: str, send: np.ndarray, layout: Layout) -> np.ndarray:
        o = self.options
        return self.collective.run(self.engine, send, layout, o.op, algorithm, self.codec, o.root)

    def fill(self, pristine: np.ndarray) -> None:
        o = self.options
        self.collective.fill(pristine, self.rank, self.nranks, o.op, o.root, self.limit)

    def warm_up(self, layout: Layout, pristine: np.ndarray, work: np.ndarray, calls: int,
                auto_calls: int | None = None, algorithms=None) -> dict[str, float]:
        """``calls`` untimed calls per algorithm (``auto_calls`` for auto where given); returns this rank's
        seconds per call of each algorithm that ran."""
        seconds = {}
        with warnings.catch_warnings():
            # Repeated in-place reductions grow the values; overflow here is expected and not checked.
            warnings.simplefilter("ignore", CompressionOverflowWarning)
            for algorithm in self.options.algorithms if algorithms is None else algorithms:
                n = auto_calls if algorithm == "auto" and auto_calls is not None else calls
                np.copyto(work, pristine)
                start = time.perf_counter()
                for _ in range(n):
                    self.call(algorithm, work, layout)
                if n:
                    seconds[algorithm] = (time.perf_counter() - start) / n
        return seconds

    def blocks(self, seconds: dict[str, float]) -> list[int]:
        """The timed calls per round at this size (:func:`timed_blocks`), equal on every rank: the typical
        call is the mean, over the algorithms named (auto's explores), of the slowest rank's warm-up call."""
        o = self.options
        if o.min_time <= 0:
            return _block_lengths(o.iters, o.rounds)
        from mpi4py import MPI

        names = [a for a in o.algorithms if a != "auto"] or list(o.algorithms)
        local = np.array([seconds.get(a, 0.0) for a in names], dtype=np.float64)
        self.comm.Allreduce(MPI.IN_PLACE, local, op=MPI.MAX)
        measured = local[local > 0]
        return timed_blocks(o.iters, o.rounds, o.min_time, float(measured.mean()) if measured.size else 0.0)

    def check(self, layout: Layout, pristine: np.ndarray, work: np.ndarray) -> np.ndarray:
        """Wrong elements of one call per algorithm on fresh inputs, on this rank."""
        o = self.options
        wrong = np.zeros(len(o.algorithms), dtype=np.int64)
        if o.check:
            expected = self.collective.expected(layout, self.rank, self.nranks, o.op, o.root, self.limit)
            tol = tolerance(expected, o.dtype, o.op, self.nranks, self.codec)
            for a, algorithm in enumerate(o.algorithms):
                np.copyto(work, pristine)
                wrong[a] = count_wrong(self.call(algorithm, work, layout), expected, tol)
        return wrong

    def time_rounds(self, layout: Layout, pristine: np.ndarray, work: np.ndarray,
                    blocks: list[int] | None = None) -> np.ndarray:
        """Seconds per call, shape (rounds, algorithms), on this rank; algorithms interleaved per round."""
        o = self.options
        blocks = _block_lengths(o.iters, o.rounds) if blocks is None else blocks
        times = np.zeros((len(blocks), len(o.algorithms)), dtype=np.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CompressionOverflowWarning)
            for r, length in enumerate(blocks):
                for a in turn_order(len(o.algorithms), r):
                    algorithm = o.algorithms[a]
                    np.copyto(work, pristine)
                    self.comm.Barrier()
                    start = time.perf_counter()
                    for _ in range(length):
                        self.call(algorithm, work, layout)
                    times[r, a] = (time.perf_counter() - start) / length
        return times

    def summarize(self, layout: Layout, times: np.ndarray, wrong: np.ndarray) -> SizeResult:
        """Every rank's numbers combined: slowest rank per block, median over rounds, wrong summed."""
        from mpi4py import MPI

        self.comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
        self.comm.Allreduce(MPI.IN_PLACE, wrong, op=MPI.SUM)
        factor = self.collective.bus_factor(self.nranks)
        measurements = []
        for a, algorithm in enumerate(self.options.algorithms):
            seconds = max(statistics.median(times[:, a].tolist()), 1e-9)
            algbw = layout.nbytes / seconds / 1e9
            measurements.append(Measurement(
                algorithm=algorithm, time_us=seconds * 1e6, algbw_gbs=algbw, busbw_gbs=algbw * factor,
                wrong=int(wrong[a]) if self.options.check else None))
        return SizeResult(nbytes=layout.nbytes, count=layout.count, measurements=tuple(measurements),
                          rounds=len(times), iters=None)


def run_sweep(options: Options, collective: Collective, comm, engine,
              progress: ProgressFn | None = None) -> Iterator[SizeResult]:
    """Measure every size of ``options`` on every algorithm, yielding each size's results as it finishes;
    collective over ``comm`` (every rank yields the same results).

    ``comm`` is an mpi4py communicator used only for the benchmark's own barriers and reductions of times
    and error counts; the collectives themselves run on ``engine``."""
    sweep = _Sweep(options, collective, comm, engine)
    steps = layouts(options, collective, sweep.nranks)
    arena = _Arena(options.dtype, max(layout.send_count for layout in steps))

    # Before anything is timed, each algorithm runs once at the largest size, so the scratch buffers and
    # sub-communicators it creates on first use exist already (the first size would pay for them). Not
    # auto: it runs the same algorithms, and a call here would count in its largest size's calls.
    largest = max(steps, key=lambda s: s.send_count)
    pristine, work = arena.views(largest.send_count)
    sweep.fill(pristine)
    sweep.warm_up(largest, pristine, work, calls=1,
                  algorithms=[a for a in options.algorithms if a != "auto"] or options.algorithms)

    for done, layout in enumerate(steps, start=1):
        pristine, work = arena.views(layout.send_count)
        sweep.fill(pristine)
        seconds = sweep.warm_up(layout, pristine, work, calls=options.warmup_iters,
                                auto_calls=options.auto_warmup)
        blocks = sweep.blocks(seconds)
        wrong = sweep.check(layout, pristine, work)
        times = sweep.time_rounds(layout, pristine, work, blocks)
        result = sweep.summarize(layout, times, wrong)
        yield dataclasses.replace(result, iters=sum(blocks))
        if progress is not None:
            progress(done, len(steps))
