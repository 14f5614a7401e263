#!/usr/bin/env python
"""Throughput of commlib's C kernels against numpy / ml_dtypes, and a check that they agree.

For each case and size, numpy and commlib (SIMD loops, then the portable loops) run interleaved on the
same inputs (an in-place kernel's destination is restored before each call, untimed); in each of
``-n`` rounds every variant runs ``-w`` times untimed and once timed, and the best timed call is
reported. GB/s counts the bytes read plus the bytes written (an in-place ``a += b`` on n bytes moves
3n). Exits 1 if any result differs from numpy's, bit for bit (conversions against numpy's / ml_dtypes'
astype, which round to nearest even; float16/bfloat16 arithmetic against numpy's, which computes in
float32 and rounds once).

    python scripts/bench_kernels.py                 # 16 MiB and 64 MiB, best of 5, 1 warm-up
    python scripts/bench_kernels.py -s 1M,64M -n 3 -w 3
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Callable

import ml_dtypes
import numpy as np

from commlib import kernels
from commlib.config import parse_size
from commlib.ops import ReduceOp

F16, BF16, F32 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)
SCALE = 0.37


@dataclass
class Case:
    """One kernel: how to make its inputs, and the numpy and commlib calls that must agree.

    ``make(n)`` returns the arrays; ``numpy(*arrays)`` returns its result (conversions use ``astype``,
    as the brief and typical numpy code do, so they include allocating the result); ``commlib(*arrays,
    portable)`` writes into the last array; ``moved`` is the number of bytes read and written per
    element."""

    name: str
    make: Callable[[int, np.random.Generator], list]
    numpy: Callable
    commlib: Callable
    moved: int
    in_place: bool = True


def _f32(n, rng):
    return (rng.standard_normal(n) * 100).astype(F32)


CASES = [
    Case("f32->f16", lambda n, r: [_f32(n, r), np.empty(n, F16)],
         lambda s, d: s.astype(F16),
         lambda s, d, p: kernels.to_half(s, d, portable=p), 4 + 2, in_place=False),
    Case("f16->f32", lambda n, r: [_f32(n, r).astype(F16), np.empty(n, F32)],
         lambda s, d: s.astype(F32),
         lambda s, d, p: kernels.from_half(s, d, portable=p), 2 + 4, in_place=False),
    Case("f32->bf16", lambda n, r: [_f32(n, r), np.empty(n, BF16)],
         lambda s, d: s.astype(BF16),
         lambda s, d, p: kernels.to_half(s, d, portable=p), 4 + 2, in_place=False),
    Case("f16 add", lambda n, r: [_f32(n, r).astype(F16), _f32(n, r).astype(F16)],
         lambda s, d: np.add(d, s, out=d),
         lambda s, d, p: kernels.reduce_(d, s, ReduceOp.SUM, portable=p), 3 * 2),
    Case("bf16 add", lambda n, r: [_f32(n, r).astype(BF16), _f32(n, r).astype(BF16)],
         lambda s, d: np.add(d, s, out=d),
         lambda s, d, p: kernels.reduce_(d, s, ReduceOp.SUM, portable=p), 3 * 2),
    Case("f32 add", lambda n, r: [_f32(n, r), _f32(n, r)],
         lambda s, d: np.add(d, s, out=d),
         lambda s, d, p: kernels.reduce_(d, s, ReduceOp.SUM, portable=p), 3 * 4),
    Case("f32 scale", lambda n, r: [_f32(n, r)],
         lambda d: np.multiply(d, np.float32(SCALE), out=d),
         lambda d, p: kernels.scale_(d, SCALE, portable=p), 2 * 4),
    Case("widened f16->f32 add", lambda n, r: [_f32(n, r).astype(F16), _f32(n, r)],
         lambda s, d: np.add(d, s, out=d),
         lambda s, d, p: kernels.reduce_widened_(d, s, ReduceOp.SUM, portable=p), 2 + 2 * 4),
]


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _timed(fn: Callable, work: np.ndarray | None, original: np.ndarray) -> float:
    """Seconds for one call of ``fn``, after restoring ``work`` (the array it changes in place, if any)
    from ``original``; the restore is not timed."""
    if work is not None:
        np.copyto(work, original)
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_case(case: Case, nbytes: int, rounds: int, warmup: int, rng: np.random.Generator) -> dict:
    """Time numpy, commlib and commlib-portable on ``nbytes`` of the widest array; check the results."""
    elem = max(a.dtype.itemsize for a in case.make(1, rng))
    n = nbytes // elem
    originals = case.make(n, rng)
    arrays = [a.copy() for a in originals]
    variants = {
        "numpy": lambda: case.numpy(*arrays),
        "commlib": lambda: case.commlib(*arrays, False),
        "portable": lambda: case.commlib(*arrays, True),
    }
    results = {}
    for name, fn in variants.items():  # one untimed call each: the check, and the first touch of pages
        for work, orig in zip(arrays, originals):
            np.copyto(work, orig)
        out = fn()
        results[name] = (out if name == "numpy" else arrays[-1]).copy()
    best = {name: float("inf") for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            work = arrays[-1] if case.in_place else None
            for _ in range(warmup):  # the caches and the CPU as a loop of such calls has them
                _timed(fn, work, originals[-1])
            best[name] = min(best[name], _timed(fn, work, originals[-1]))
    wrong = {name: int(np.count_nonzero(_bits(results[name]) != _bits(results["numpy"])))
             for name in ("commlib", "portable")}
    return {"n": n, "gbps": {k: n * case.moved / t / 1e9 for k, t in best.items()}, "wrong": wrong}


def _size(nbytes: int) -> str:
    for unit, shift in (("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-s", "--sizes", default="16M,64M",
                        help="comma-separated sizes of the widest array, with K/M/G suffixes (default 16M,64M)")
    parser.add_argument("-n", "--rounds", type=int, default=5, help="timed rounds per variant (default 5)")
    parser.add_argument("-w", "--warmup", type=int, default=1,
                        help="untimed calls before each timed one, in each round (default 1)")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    rng = np.random.default_rng(0)

    features = kernels.cpu_features()
    print(f"# numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}; cpu_features {features}")
    print(f"# GB/s = (bytes read + bytes written) / best of {args.rounds} interleaved rounds (each after {args.warmup} untimed); "
          "ratio = commlib / numpy; wrong = elements whose bits differ from numpy's")
    header = f"{'kernel':<22}{'size':>8}{'numpy GB/s':>12}{'commlib GB/s':>14}{'portable GB/s':>15}{'ratio':>8}{'wrong':>7}"
    print(header)
    print("-" * len(header))
    failures = 0
    for nbytes in sizes:
        for case in CASES:
            r = run_case(case, nbytes, args.rounds, args.warmup, rng)
            g = r["gbps"]
            wrong = r["wrong"]["commlib"] + r["wrong"]["portable"]
            failures += wrong > 0
            print(f"{case.name:<22}{_size(nbytes):>8}{g['numpy']:>12.2f}{g['commlib']:>14.2f}"
                  f"{g['portable']:>15.2f}{g['commlib'] / g['numpy']:>7.1f}x{wrong:>7}", flush=True)
    if failures:
        print(f"# FAILED: {failures} case(s) differ from numpy", file=sys.stderr)
        return 1
    print("# all results bit-identical to numpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
