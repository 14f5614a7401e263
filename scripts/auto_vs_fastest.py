#!/usr/bin/env python
"""Per size of a ``commlib-bench --algo all --json`` run: what auto ran, auto over the fastest algorithm and
auto over MPI's own allreduce (``native``), against the targets (within 10% of the fastest, at most 10%
slower than MPI's); and auto over the row of the algorithm it ran (the same calls under two names: how far
apart the method's noise puts them), with the timed rounds per size.

    python scripts/auto_vs_fastest.py RUN.json
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> int:
    data = json.loads(open(path).read())
    print(f"{'size (B)':>10} {'auto ran':<24} {'auto us':>10} {'fastest':<24} {'us':>10} {'auto/fastest':>13} "
          f"{'native us':>10} {'auto/native':>12} {'auto/same':>10} {'rounds':>7}")
    within = below_mpi = total = 0
    for result in data["results"]:
        algorithms = result["algorithms"]
        auto = algorithms.get("auto")
        if auto is None:
            continue
        others = {name: m["time_us"] for name, m in algorithms.items() if name != "auto"}
        fastest = min(others, key=others.get)
        native = others.get("native")
        ratio = auto["time_us"] / others[fastest]
        versus = auto["time_us"] / native if native else None
        same = others.get(auto.get("chosen"))
        total += 1
        within += ratio <= 1.10
        below_mpi += versus is None or versus <= 1.10
        print(f"{result['nbytes']:>10} {auto.get('chosen') or '?':<24} {auto['time_us']:>10.1f} {fastest:<24} "
              f"{others[fastest]:>10.1f} {ratio:>12.2f}x {native or float('nan'):>10.1f} "
              + (f"{versus:>11.2f}x" if versus else f"{'-':>12}")
              + (f" {auto['time_us'] / same:>9.2f}x" if same else f" {'-':>10}")
              + f" {result.get('rounds') or '-':>7}")
    print(f"# auto within 10% of the fastest algorithm at {within} of {total} sizes; at most 10% slower than "
          f"MPI's own at {below_mpi} of {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
