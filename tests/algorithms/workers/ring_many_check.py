"""Engine.allreduce_many_ (one ring pass over several buffers, no copies) against numpy references.

Buffer lists mix empty, single-element, fewer-than-ranks and segment-crossing sizes; every op and dtype;
Average (folded postscale) and a user postscale; the one-call-per-buffer fallback (native, rabenseifner, the
ring with a codec), which packs the small buffers first."""

import os

import ml_dtypes
import numpy as np
from mpi4py import MPI

from commlib.compression import Compression
from commlib.config import Config
from commlib.engine import Engine
from commlib.ops import ReduceOp
from commlib.topology import Topology
from commlib.transport.mpi import MPITransport
import spmd

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
# small segments so that buffers cross segment boundaries without large data (cma: 64 bytes)
engine = Engine(MPITransport(comm.Dup()), Topology.detect(comm),
                Config.load(ring_segment_bytes=4096, cma_segment_bytes=64))
# one node: cma is usable exactly when the kernel lets siblings read each other (tests/mpirun.py finds out)
CMA = engine.context.peer_memory is not None
DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int8, np.uint8, np.int32, np.int64]
NUMPY = {ReduceOp.SUM: np.add, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum, ReduceOp.PRODUCT: np.multiply}
LAYOUTS = [[0, 1, max(size - 1, 0), 5000, 3, 0, 2049], [1], [0, 0], [7] * 13, [size * 1000 + 1, 17]]


def data(seed, count, dtype, r):
    rng = np.random.default_rng([seed, r])
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 3, count).astype(dtype)
    return rng.uniform(-2, 2, count).astype(dtype)


@spmd.case
def cma_is_probed_as_the_kernel_allows():
    if size > 1:
        assert CMA == (os.environ["CMA_EXPECTED"] == "1"), engine.context.peer_memory_reason


@spmd.case
def every_layout_op_and_dtype():
    for dtype in DTYPES:
        for op in [ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT]:
            if op is ReduceOp.AVERAGE and np.dtype(dtype).kind in "iu":
                continue
            for li, layout in enumerate(LAYOUTS):
                for algorithm, postscale in [("ring", 1.0), ("ring", 0.5), ("native", 1.0)] + \
                        ([("cma", 1.0), ("cma", 0.5)] if CMA else []):
                    if postscale != 1.0 and np.dtype(dtype).kind in "iu":
                        continue
                    bufs = [data(1000 * li + i, n, dtype, rank) for i, n in enumerate(layout)]
                    engine.allreduce_many_(bufs, op, algorithm=algorithm, postscale=postscale)
                    for i, (n, got) in enumerate(zip(layout, bufs)):
                        parts = [data(1000 * li + i, n, dtype, r).astype(np.float64) for r in range(size)]
                        want = parts[0]
                        for part in parts[1:]:
                            want = NUMPY[op.kernel_op](want, part)
                        if op is ReduceOp.AVERAGE:
                            want = want / size
                        want = want * postscale
                        if np.dtype(dtype).kind in "iu":
                            ok = np.array_equal(got, want.astype(dtype))
                        else:
                            tol = 1e-12 if dtype == np.float64 else 1e-5 if dtype == np.float32 else 3e-2 * size
                            ok = np.allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
                        if not ok:
                            raise AssertionError(f"rank {rank}: {np.dtype(dtype).name} {op.name} layout {layout} "
                                                 f"buffer {i} ({algorithm}, postscale {postscale}): got "
                                                 f"{got[:5]}, want {want[:5]}")


@spmd.case
def cma_balances_its_shares():
    # cma moves the shares of a layout it has seen towards equal time: results stay right, and every rank
    # holds the same split
    layout = [300_000, 5, 200_003, 70_000]  # > 1 MiB of float32: balanced
    for repeat in range(4 if CMA else 0):
        bufs = [data(77 + i, n, np.float32, rank) for i, n in enumerate(layout)]
        engine.allreduce_many_(bufs, ReduceOp.AVERAGE, algorithm="cma")
        for i, (n, got) in enumerate(zip(layout, bufs)):
            want = sum(data(77 + i, n, np.float32, r).astype(np.float64) for r in range(size)) / size
            assert np.allclose(got, want, rtol=1e-5, atol=1e-6), f"rank {rank}: balanced cma, repeat {repeat}"


@spmd.case
def cma_with_a_codec():
    # cma with a codec, several buffers in one pass: the numbers of half-precision traffic (each contribution
    # and the result representable in the wire format, accumulated in float32), fp16's predivide included
    for codec, wire in ([(Compression.fp16, np.float16), (Compression.bf16, ml_dtypes.bfloat16)] if CMA else []):
        for op in (ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MAX):
            layout = [5000, 3, 0, 70_001]
            bufs = [data(300 + i, n, np.float32, rank) * 50 for i, n in enumerate(layout)]
            engine.allreduce_many_(bufs, op, algorithm="cma", codec=codec)
            pre = 1.0 / size if codec is Compression.fp16 and op is not ReduceOp.MAX else 1.0
            for i, (n, got) in enumerate(zip(layout, bufs)):
                parts = [(data(300 + i, n, np.float32, r) * 50 * np.float32(pre)).astype(wire).astype(np.float64)
                         for r in range(size)]
                want = np.max(parts, axis=0) if op is ReduceOp.MAX else np.sum(parts, axis=0)
                if op is not ReduceOp.MAX:
                    want = want / pre / (size if op is ReduceOp.AVERAGE else 1)
                if size > 1 and op is not ReduceOp.AVERAGE and codec is Compression.bf16:  # result is a wire value
                    assert np.array_equal(got, got.astype(wire).astype(np.float32)), f"{codec} {op.name}: not on the wire grid"
                rel = 2.0 ** -10 if codec is Compression.fp16 else 2.0 ** -7
                assert np.allclose(got, want, rtol=4 * rel, atol=1e-3), f"rank {rank}: cma {codec} {op.name} buffer {i}"
                assert comm.allgather(got.tobytes()) == [got.tobytes()] * size, "ranks differ"


@spmd.case
def a_call_per_buffer_packs_the_small_ones_first():
    # an algorithm that reduces a group a call per buffer (rabenseifner; the ring with a codec) gets those
    # under the limit packed into one buffer first: one call for 13 small buffers, one for the large one
    big = engine.fusion_inplace_bytes // 4 + 1
    calls = []
    original = engine.allreduce_
    engine.allreduce_ = lambda buf, *args, **kwargs: (calls.append(buf.size), original(buf, *args, **kwargs))[1]
    try:
        for algorithm, codec in [("rabenseifner", None), ("ring", Compression.fp16), ("native", None)]:
            layout = [7] * 13 + [0, big]
            bufs = [data(500 + i, n, np.float32, rank) for i, n in enumerate(layout)]
            calls.clear()
            engine.allreduce_many_(bufs, ReduceOp.AVERAGE, algorithm=algorithm, codec=codec)
            if size > 1:
                assert sorted(calls) == [7 * 13, big], f"{algorithm}: calls of {calls} values"
            tol = 4 * 2.0 ** -10 if codec else 1e-5
            for i, (n, got) in enumerate(zip(layout, bufs)):
                want = sum(data(500 + i, n, np.float32, r).astype(np.float64) for r in range(size)) / size
                assert np.allclose(got, want, rtol=tol, atol=tol), f"rank {rank}: {algorithm} buffer {i}"
    finally:
        del engine.allreduce_


@spmd.case
def every_rank_holds_the_same_split():
    if size > 1 and CMA:
        splits = dict(engine.context.cma_shares._offsets.items())
        assert len(splits) == 1 and comm.allgather(splits) == [splits] * size, splits


@spmd.case
def bad_input_is_refused():
    # bad input is refused before anything is sent (every rank passes the same, so every rank raises)
    for bad, needle in [([np.zeros(4, np.float32), np.zeros(4, np.float64)], "one dtype"),
                        ([np.zeros((4, 4), np.float32)[:, ::2], np.zeros(3, np.float32)], "not contiguous")]:
        try:
            engine.allreduce_many_(bad, ReduceOp.SUM, algorithm="ring")
        except Exception as exc:  # TypeError or CommlibError
            assert needle in str(exc), exc
        else:
            raise AssertionError(f"rank {rank}: allreduce_many_ accepted {needle!r} input")


@spmd.case
def close():
    engine.close()


if __name__ == "__main__":
    spmd.main()
