"""The coordinator against its peers, interleaved in one run (run under mpiexec, e.g. -n 2).

Rounds alternate between:
  mpi_per_tensor   one MPI Allreduce per ResNet-50 gradient (161 calls, in backward order)
  packed_best      the 161 gradients pre-packed in one buffer, reduced by the best commlib algorithm
                   (packing not timed: this is the floor a fused implementation could reach)
  commlib          allreduce_async_ of all 161 in backward order, then synchronize all
  commlib_fp16     the same with Compression.fp16
and, for latency, a 4 KiB float32 allreduce: raw MPI Allreduce against commlib's allreduce_.
Prints medians and ratios on rank 0; --json writes them.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))
import commlib as cl  # noqa: E402
from commlib.algorithms import select  # noqa: E402
from commlib.config import Config  # noqa: E402
from commlib.engine import Engine  # noqa: E402
from commlib.topology import Topology  # noqa: E402
from commlib.transport.mpi import MPITransport  # noqa: E402
from resnet50_shapes import resnet50_shapes  # noqa: E402


def timed(comm, fn) -> float:
    comm.Barrier()
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    return comm.allreduce(elapsed, op=MPI.MAX)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--rounds", type=int, default=10)
    parser.add_argument("--latency-iters", type=int, default=2000)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--also", nargs="*", default=[], metavar="ALGORITHM",
                        help="also time the coordinator with these algorithms forced")
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    cl.init()
    rank = comm.Get_rank()
    def fresh():
        return [np.random.default_rng(i).standard_normal(int(np.prod(s))).astype(np.float32).reshape(s)
                for i, s in enumerate(resnet50_shapes())]

    grads, mpi_grads = fresh(), fresh()
    backward = list(reversed(range(len(grads))))
    total = sum(g.size for g in grads)
    packed = np.concatenate([g.reshape(-1) for g in grads])
    config = Config.load()  # COMMLIB_LOCAL_SIZE applies to the packed peer as to the coordinator
    engine = Engine(MPITransport(comm.Dup()), Topology.detect(comm, config.local_size), config)
    candidates = [s.name for s in select.candidates(engine.context, None) if s.name != "native"]  # that can run

    def mpi_per_tensor():
        for i in backward:
            comm.Allreduce(MPI.IN_PLACE, mpi_grads[i], op=MPI.SUM)

    def packed_with(algorithm):
        return lambda: engine.allreduce_(packed, cl.Average, algorithm=algorithm)

    def through_commlib(compression, algorithm=None):
        def run():
            handles = [cl.allreduce_async_(grads[i], op=cl.Average, name=f"grad.{i}", compression=compression,
                                           algorithm=algorithm)
                       for i in backward]
            for handle in handles:
                cl.synchronize(handle)
        return run

    # pick the best algorithm for the packed buffer first (2 timed tries each)
    best = min(candidates, key=lambda a: min(timed(comm, packed_with(a)) for _ in range(2)))
    peers = {"mpi_per_tensor": mpi_per_tensor, f"packed_{best}": packed_with(best),
             "commlib": through_commlib(None), "commlib_fp16": through_commlib(cl.Compression.fp16)}
    for algorithm in args.also:
        peers[f"commlib_{algorithm}"] = through_commlib(None, algorithm)
    for fn in peers.values():  # warm-up: caches, scratch buffers, negotiation cache
        fn()
    times = {k: [] for k in peers}
    for _ in range(args.rounds):
        for key, fn in peers.items():
            times[key].append(timed(comm, fn))

    small = np.ones(1024, np.float32)
    lat = {"mpi_4KiB": [], "commlib_4KiB": []}
    for _ in range(5):
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(args.latency_iters):
            comm.Allreduce(MPI.IN_PLACE, small, op=MPI.SUM)
        lat["mpi_4KiB"].append((time.perf_counter() - start) / args.latency_iters)
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(args.latency_iters):
            cl.allreduce_(small, op=cl.Sum, name="lat")
        lat["commlib_4KiB"].append((time.perf_counter() - start) / args.latency_iters)

    cl.shutdown()
    engine.close()
    if rank != 0:
        return
    med = {k: statistics.median(v) for k, v in {**times, **lat}.items()}
    print(f"# {comm.Get_size()} ranks, {MPI.Get_library_version().splitlines()[0].strip()}")
    print(f"# ResNet-50 gradients: {len(grads)} float32 tensors, {total:,} values ({4 * total / 1e6:.1f} MB); "
          f"{args.rounds} interleaved rounds, medians")
    for key in times:
        print(f"{key:>24}: {med[key] * 1e3:8.2f} ms   (min {min(times[key]) * 1e3:.2f})")
    print(f"{'ratio commlib/mpi_per_tensor':>40}: {med['commlib'] / med['mpi_per_tensor']:.3f}")
    print(f"{'ratio commlib/packed_' + best:>40}: {med['commlib'] / med['packed_' + best]:.3f}")
    print(f"{'ratio commlib_fp16/commlib':>40}: {med['commlib_fp16'] / med['commlib']:.3f}")
    print(f"{'4 KiB latency mpi':>40}: {med['mpi_4KiB'] * 1e6:8.1f} us")
    print(f"{'4 KiB latency commlib':>40}: {med['commlib_4KiB'] * 1e6:8.1f} us "
          f"({med['commlib_4KiB'] / med['mpi_4KiB']:.2f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps({"ranks": comm.Get_size(), "best_packed": best,
                                               "median_s": med, "samples_s": {**times, **lat}}, indent=1))


if __name__ == "__main__":
    main()
