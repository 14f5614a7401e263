"""GPU benchmarks for docs/gpu.md (need CuPy and a GPU; never run in CI).

    python scripts/bench_gpu.py casting                  # one process
    mpiexec -n P python scripts/bench_gpu.py staged      # P ranks, sharing the GPU or not

casting: commlib's fused scale-and-cast kernel (float32 -> float16 / bfloat16 bits) against CuPy's
``(x * s).astype(float16)`` and plain ``x.astype(float16)``, timed with CUDA events, interleaved; reports
GB/s counted as bytes read + written, and the ratio to the device-to-device copy of the same bytes (the
physical bound of a memory-bound kernel).

staged: ``commlib.allreduce_`` of a CuPy array (the coordinator's device path: segments to pinned memory
overlapped with the host reduction, or NCCL where its route allows) against the plain loop
``host = cupy.asnumpy(x); comm.Allreduce(IN_PLACE, host); x.set(host)``, and MPI's own Allreduce of a host
buffer of the same size (the network part alone). Interleaved, median of the repetitions, on every size.
``commlib-bench --device cuda`` measures the device path against the copy bound.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _events_ms(cupy, fn, reps: int) -> float:
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / reps


def casting(args) -> None:
    import cupy

    from commlib.transport.device_kernels import DeviceKernels

    kernels = DeviceKernels(cupy)
    print(f"# device: {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}  reps={args.reps} "
          f"rounds={args.rounds} (interleaved; median of rounds)")
    print(f"# {'elements':>10} {'case':<28} {'ms':>9} {'GB/s':>8} {'vs copy':>8}")
    for count in (1 << 20, 1 << 24, 1 << 26):
        x = cupy.random.standard_normal(count, dtype=cupy.float32)
        half = cupy.empty(count, cupy.float16)
        bits = cupy.empty(count, cupy.uint16)
        copy_dst = cupy.empty(count * 3 // 4, cupy.float32)   # read + written: 6 bytes per element, as f32 -> f16
        copy_src = cupy.empty_like(copy_dst)
        cases = {
            "d2d copy (same bytes)": lambda: copy_dst.__setitem__(Ellipsis, copy_src),
            "commlib scale_cast f16": lambda: kernels.scale_cast(x, 0.5, half),
            "cupy (x*s).astype(f16)": lambda: (x * np.float32(0.5)).astype(cupy.float16),
            "cupy x.astype(f16)": lambda: x.astype(cupy.float16),
            "commlib scale_cast bf16": lambda: kernels.scale_cast(x, 0.5, bits),
        }
        for fn in cases.values():
            fn()
        times = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, fn in cases.items():
                times[name].append(_events_ms(cupy, fn, args.reps))
        copy_ms = statistics.median(times["d2d copy (same bytes)"])
        for name, samples in times.items():
            ms = statistics.median(samples)
            gbs = count * 6 / (ms * 1e-3) / 1e9
            print(f"  {count:>10} {name:<28} {ms:9.4f} {gbs:8.1f} {copy_ms / ms:8.2f}"
                  f"   (min {min(samples):.4f} max {max(samples):.4f})")


def staged(args) -> None:
    import cupy
    from mpi4py import MPI

    import commlib as cl
    from commlib import lifecycle

    cl.init()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    cupy.cuda.Device(cl.local_rank() % cupy.cuda.runtime.getDeviceCount()).use()
    if rank == 0:
        print(f"# ranks={size} COMMLIB_DEVICE_SEGMENT={lifecycle.config().device_segment_bytes} B reps={args.reps} "
              "(interleaved, median; ms per call)")
        print(f"# {'bytes':>11} {'commlib':>9} {'plain':>9} {'mpi host':>9} {'plain/commlib':>13} {'mpi/commlib':>11}")
    for nbytes in (4 << 10, 256 << 10, 4 << 20, 64 << 20, 256 << 20):
        count = nbytes // 4
        x = cupy.ones(count, cupy.float32)
        host = np.ones(count, np.float32)

        def run_commlib():  # the public API: the coordinator's device path
            cl.allreduce_(x, op=cl.Sum, name="x")
            cupy.cuda.get_current_stream().synchronize()

        def run_plain():
            h = cupy.asnumpy(x)
            comm.Allreduce(MPI.IN_PLACE, h, op=MPI.SUM)
            x.set(h)

        def run_mpi():
            comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)

        cases = {"commlib": run_commlib, "plain": run_plain, "mpi": run_mpi}
        times = {name: [] for name in cases}
        for rep in range(args.reps + 1):
            for name, fn in cases.items():
                x.fill(1.0)
                host.fill(1.0)
                cupy.cuda.get_current_stream().synchronize()
                comm.Barrier()
                t0 = time.perf_counter()
                fn()
                elapsed = time.perf_counter() - t0
                if rep:  # the first round warms up
                    times[name].append(comm.allreduce(elapsed, op=MPI.MAX))
                got = float(host[0]) if name == "mpi" else float(x[-1])
                assert got == size, f"{name}: wrong result {got} on {size} ranks"
        if rank == 0:
            med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
            print(f"  {nbytes:>11} {med['commlib']:9.3f} {med['plain']:9.3f} {med['mpi']:9.3f} "
                  f"{med['plain'] / med['commlib']:13.2f} {med['mpi'] / med['commlib']:11.2f}", flush=True)
    cl.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("casting", "staged"))
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    {"casting": casting, "staged": staged}[args.what](args)


if __name__ == "__main__":
    main()
