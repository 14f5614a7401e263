"""Small-message latency: a named in-place allreduce through commlib (negotiation included) against MPI's own
Allreduce called directly, interleaved in one job; also commlib with algorithm="native" (negotiation, then MPI's
allreduce: never eager, see commlib/coordinator/eager.py). Run under mpiexec (or on the emulated cluster:
``python -m commlib.testing.cluster run --hosts 2,2 --rate 1gbit -- python scripts/bench_latency.py``).

Each round times ``--iters`` consecutive calls of each, after a barrier, each round starting with the next
peer (``commlib.bench.core.turn_order``); the figure is the median over rounds of the slowest rank's time
per call. Rank 0 prints the medians and the ratio; --json writes them.
"""

import argparse
import json
import statistics
import time

import numpy as np
from mpi4py import MPI

import commlib as cl
from commlib.bench.core import turn_order
from commlib.config import parse_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=parse_size, default=4096, help="bytes of float32 (default 4K)")
    parser.add_argument("--iters", type=int, default=500, help="calls per round (default 500)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    cl.init()
    buf = np.ones(max(1, args.size // 4), np.float32)

    def mpi():
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def commlib():
        cl.allreduce_(buf, op=cl.Sum, name="latency")

    def commlib_native():  # a named algorithm: negotiation, then MPI's allreduce (never eager)
        cl.allreduce_(buf, op=cl.Sum, name="latency.native", algorithm="native")

    peers = {"mpi": mpi, "commlib": commlib, "commlib_native": commlib_native}
    for fn in peers.values():  # warm-up: connections, the negotiation cache
        for _ in range(50):
            fn()
    times = {k: [] for k in peers}
    names = list(peers)
    for r in range(args.rounds):
        for key in (names[i] for i in turn_order(len(names), r)):
            fn = peers[key]
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(args.iters):
                fn()
            times[key].append(comm.allreduce((time.perf_counter() - start) / args.iters, op=MPI.MAX))
    cl.shutdown()
    if comm.Get_rank() != 0:
        return
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"# {comm.Get_size()} ranks, {MPI.Get_library_version().splitlines()[0].strip()}; "
          f"{buf.nbytes} B float32 Sum, {args.rounds} rounds x {args.iters} calls, medians of the slowest rank")
    for key, values in times.items():
        print(f"{key:>14}: {med[key] * 1e6:9.1f} us per call  (rounds: "
              + ", ".join(f"{v * 1e6:.1f}" for v in values) + ")")
    print(f"commlib / mpi: {med['commlib'] / med['mpi']:.2f}x   "
          f"(commlib_native / mpi: {med['commlib_native'] / med['mpi']:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": comm.Get_size(), "nbytes": buf.nbytes, "median_s": med, "rounds_s": times}, f,
                      indent=1)


if __name__ == "__main__":
    main()
