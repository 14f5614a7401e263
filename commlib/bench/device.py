"""``commlib-bench --device cuda``: allreduce of device buffers through commlib's device path.

For each size, on a CuPy buffer of this rank's GPU, interleaved round by round as the host sweep is:

- ``staged``: the coordinator's device path forced through the host (the fused buffer in segments to
  pinned memory, reduced by the lane's engine, copied back), what runs where NCCL cannot;
- ``nccl``: the same path on its NCCL route, where the route allows it (every rank on a GPU of its own;
  one GPU shared by several ranks never does, and the header says why);
- the copy bound: copying the buffer (the wire bytes) to pinned host memory and back, each direction at
  the rate measured here, which the staged path cannot beat however well it overlaps.

Each call is timed to the event after which the result is on the device. The check (``-c 1``) gives every
rank values whose reduction is exact in the wire type and counts wrong elements after one call per path.
Without CuPy or a GPU on some rank, every rank refuses with exit status 2 and the reason.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time

import numpy as np

from ..ops import ReduceOp
from .core import codec_of, count_wrong, tolerance
from .options import Options

_NO_SPAN = contextlib.nullcontext()


def why_not_here() -> str:
    """'' when this rank can run the device benchmark, else why not."""
    from ..device import cuda_built

    try:
        import cupy  # noqa: F401
    except ImportError as exc:
        return f"CuPy is not installed ({exc}); pip install 'commlib[cuda12]' or 'commlib[cuda13]'"
    if not cuda_built():
        return "no CUDA GPU is visible to this process (commlib.cuda_built() is False: no driver, or CUDA_VISIBLE_DEVICES)"
    return ""


def refusal(comm) -> str | None:
    """Collective: the error every rank prints when some rank cannot run ``--device cuda`` (None: all can)."""
    reasons = comm.allgather(why_not_here())
    missing = [r for r, why in enumerate(reasons) if why]
    if not missing:
        return None
    return (f"commlib-bench: error: --device cuda needs CuPy and a visible CUDA GPU on every rank; rank(s) "
            f"{missing} cannot: {reasons[missing[0]]}")


def run(options: Options, comm, lane, command: str) -> int:
    """The device sweep (module docstring); rank 0 prints. Returns the exit status."""
    error = refusal(comm)
    if error is not None:
        if comm.Get_rank() == 0:
            print(error, file=sys.stderr, flush=True)
        return 2
    import cupy

    from ..coordinator.device_path import DevicePath
    from ..transport.nccl import STAGED
    from ..transport.streams import cuda_streams

    rank, size = comm.Get_rank(), comm.Get_size()
    engine = lane.engine
    streams = cuda_streams(lane.topology.local_rank % cupy.cuda.runtime.getDeviceCount())
    path = DevicePath(engine, engine.config.device_segment_bytes)
    path.bind(streams)
    route, why = path.decide_route()
    codec = codec_of(options)
    wire = codec.wire_dtype if codec is not None else options.dtype
    paths = [STAGED] + ([route] if route != STAGED else [])
    if rank == 0:
        print(f"# commlib-bench --device cuda: {command}", flush=True)
        print(f"# {size} rank(s), GPU {streams.index} of each, dtype {options.dtype.name}, op {options.op.name}, "
              f"compression {options.compression}, segment {engine.config.device_segment_bytes} B", flush=True)
        print(f"# NCCL route: {route}: {why}", flush=True)
        columns = "".join(f"{p + ' time(us)':>18}{'busbw':>9}" for p in paths)
        print(f"#{'size':>11}{'count':>12}{columns}{'bound(us)':>12}{'x bound':>9}{'#wrong':>8}", flush=True)
    results = []
    try:
        with streams.activate():
            for nbytes in options.sizes():
                count = max(1, nbytes // options.dtype.itemsize)
                result = _one_size(options, comm, path, streams, count, paths, wire, rank, size)
                results.append(result)
                if rank == 0:
                    print(_row(result, paths, options), flush=True)
    finally:
        path.close()
    if rank == 0 and options.json_path:
        with open(options.json_path, "w") as out:
            json.dump({"command": command, "ranks": size, "route": route, "why": why, "results": results}, out,
                      indent=1)
        print(f"# JSON written to {options.json_path}", flush=True)
    wrong = sum(r["wrong"] for r in results)
    return 1 if wrong else 0


def _one_size(options: Options, comm, path, streams, count: int, paths: list[str], wire, rank: int, size: int):
    import cupy

    from ..coordinator.requests import Entry, Handle, Kind, Meta, Response
    from ..device import DeviceTensor
    from ..transport.device_kernels import device_dtype

    dtype = options.dtype
    pattern = (np.arange(count) % 7 + 1).astype(np.float64)
    buffer = cupy.empty(count, device_dtype(dtype))  # bfloat16 as its bits, as the device path keeps it
    user = streams.user_stream(buffer)
    meta = {how: Meta("bench", Kind.ALLREDUCE, dtype.name, (count,), int(options.op),
                      compression=options.compression, algorithm="nccl" if how != "staged" else "", device="cuda")
            for how in paths}

    def call(how: str):
        tensor = DeviceTensor(buffer, streams, buffer, dtype, (count,), streams.record(user))
        path.allreduce(Response(Kind.ALLREDUCE, [meta[how]]), [Entry(meta[how], tensor, tensor, Handle("bench"))],
                       lambda *a, **k: _NO_SPAN, how=how)
        streams.synchronize(tensor.done)

    wrong = 0
    for how in paths:
        if options.check:
            buffer.set(((rank + 1) * pattern).astype(dtype).view(buffer.dtype))
            call(how)
            expected = _expected(options.op, pattern, size)
            got = cupy.asnumpy(buffer).view(dtype)
            wrong += count_wrong(got, expected, tolerance(expected, dtype, options.op, size, codec_of(options)))
        buffer.set(np.ones(count, dtype).view(buffer.dtype))
        for _ in range(options.warmup_iters):
            call(how)
    per_round = max(1, options.iters // options.rounds)
    times: dict[str, list[float]] = {how: [] for how in paths}
    for index in range(options.rounds):
        for how in paths[index % len(paths):] + paths[:index % len(paths)]:
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(per_round):
                call(how)
            elapsed = (time.perf_counter() - start) / per_round
            times[how].append(comm.allreduce(elapsed, op=_max()))
    nbytes = count * dtype.itemsize
    bound = _copy_bound(streams, count * np.dtype(wire).itemsize, comm)
    factor = 2 * (size - 1) / size if size > 1 else 1.0
    return {"nbytes": nbytes, "count": count, "bound_us": bound * 1e6, "wrong": int(wrong),
            "paths": {how: {"time_us": statistics.median(t) * 1e6,
                            "busbw_gbs": nbytes / statistics.median(t) * factor / 1e9} for how, t in times.items()}}


def _expected(op: ReduceOp, pattern: np.ndarray, size: int) -> np.ndarray:
    ranks = np.arange(1, size + 1, dtype=np.float64)
    if op in (ReduceOp.SUM, ReduceOp.AVERAGE):
        total = pattern * ranks.sum()
        return total / size if op is ReduceOp.AVERAGE else total
    if op is ReduceOp.MAX:
        return pattern * size
    if op is ReduceOp.MIN:
        return pattern
    return pattern ** size * np.prod(ranks)


def _copy_bound(streams, nbytes: int, comm) -> float:
    """Seconds to copy ``nbytes`` to pinned host memory and back at the rate measured here (the median of 5
    of each, the slowest rank's)."""
    device = streams.empty(max(nbytes, 1), np.dtype(np.uint8))
    host = streams.pinned(max(nbytes, 1), np.dtype(np.uint8))
    stream = streams.new_stream()
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        streams.to_host(stream, device, host)
        streams.synchronize(streams.record(stream))
        middle = time.perf_counter()
        streams.to_device(stream, host, device)
        streams.synchronize(streams.record(stream))
        timings.append((middle - start, time.perf_counter() - middle))
    down = statistics.median(t[0] for t in timings)
    up = statistics.median(t[1] for t in timings)
    return comm.allreduce(down + up, op=_max())


def _max():
    from mpi4py import MPI

    return MPI.MAX


def _row(result: dict, paths: list[str], options: Options) -> str:
    cells = "".join(f"{result['paths'][p]['time_us']:>18.1f}{result['paths'][p]['busbw_gbs']:>9.2f}" for p in paths)
    staged = result["paths"]["staged"]["time_us"]
    ratio = staged / result["bound_us"] if result["bound_us"] else float("nan")
    return (f"{result['nbytes']:>12}{result['count']:>12}{cells}{result['bound_us']:>12.1f}{ratio:>9.2f}"
            f"{result['wrong']:>8}")
