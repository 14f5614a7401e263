"""Compare each allreduce algorithm with MPI's native Allreduce, interleaved so both see the same load.

    mpiexec -n 2 python scripts/ring_vs_native.py [--bytes 64M] [--iters 10] [--segment 1M]
        [--algorithms ring,rabenseifner,...] [--dtype float32] [--codec fp16|bf16]

Prints, per algorithm, the median time of ``--iters`` calls, algbw = bytes / time and
busbw = algbw * 2(p-1)/p (nccl-tests' definition), and the ratio of its busbw to native's. With
``--codec`` every algorithm but native carries the data in half precision (bytes count the float32 size). Each
measured call is preceded by a barrier; values are reset from a pristine copy outside the timing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

from commlib.algorithms import AlgorithmContext, run_allreduce
from commlib.compression import Compression
from commlib.config import Config, parse_size
from commlib.ops import ReduceOp
from commlib.topology import Topology
from commlib.transport.mpi import MPITransport


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", default="64M", type=parse_size)
    parser.add_argument("--iters", default=10, type=int)
    parser.add_argument("--warmup", default=2, type=int)
    parser.add_argument("--segment", default=None, type=parse_size, help="ring segment bytes (default: config)")
    parser.add_argument("--algorithms", default="ring,rabenseifner,recursive_doubling,hierarchical,torus2d")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--codec", choices=("fp16", "bf16"), default=None)
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    config = Config.load(ring_segment_bytes=args.segment)
    transport = MPITransport.duplicate(comm)
    ctx = AlgorithmContext.create(transport, Topology.detect(comm, config.local_size), config)
    p = comm.size
    dtype = np.dtype(args.dtype)
    count = args.bytes // dtype.itemsize
    pristine = np.random.default_rng(comm.rank).standard_normal(count).astype(dtype)
    buf = np.empty_like(pristine)
    names = ["native"] + [a for a in args.algorithms.split(",") if a and a != "native"]
    codec = getattr(Compression, args.codec) if args.codec else None
    times: dict[str, list[float]] = {name: [] for name in names}
    for it in range(args.warmup + args.iters):
        for name in names:  # interleaved: every algorithm sees the same machine state
            np.copyto(buf, pristine)
            comm.Barrier()
            start = time.perf_counter()
            run_allreduce(ctx, buf, ReduceOp.SUM, name, None if name == "native" else codec)
            elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
            if it >= args.warmup:
                times[name].append(elapsed)
    if comm.rank == 0:
        nbytes = count * dtype.itemsize
        factor = 2 * (p - 1) / p if p > 1 else 1.0
        print(f"# ranks {p}, {nbytes} bytes {dtype}, median of {args.iters} (+{args.warmup} warm-up), "
              f"ring segment {config.ring_segment_bytes} bytes, codec {args.codec}")
        print(f"{'algorithm':>20} {'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'vs native':>10}")
        native_bus = None
        for name in names:
            t = statistics.median(times[name])
            bus = nbytes / t / 1e9 * factor
            native_bus = native_bus or bus
            print(f"{name:>20} {t * 1e6:10.1f} {nbytes / t / 1e9:12.2f} {bus:12.2f} {bus / native_bus:9.2f}x")
    ctx.close()
    transport.free()


if __name__ == "__main__":
    main()
