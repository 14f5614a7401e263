"""Worker: the Engine's collectives (allreduce_ with scaling/Average/codecs, allgather, broadcast_,
reducescatter, alltoall, barrier) against numpy, sizes 0 and 1 and multi-dimensional arrays.

    mpiexec -n P python engine_check.py [--local-size K]
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
from mpi4py import MPI

from commlib.algorithms import partition
from commlib.compression import Compression, CompressionOverflowWarning
from commlib.config import Config
from commlib.dtypes import BFLOAT16, FLOAT16, REDUCIBLE, UnsupportedDtypeError
from commlib.engine import Engine
from commlib.errors import CommlibError, ConfigError
from commlib.ops import ReduceOp
from commlib.topology import Topology
from commlib.transport.mpi import MPITransport
import spmd
from spmd import expect_error

REL = {FLOAT16: 2.0 ** -9, BFLOAT16: 2.0 ** -6, np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}
MOVABLE = list(REDUCIBLE) + [np.dtype(np.complex128)]


def expected(inputs, op, dtype, p, postscale=1.0):
    """The reduction as documented: bool by logic, integers exactly (an Average or a factor as Horovod:
    float64 product, truncated), floating types in float64."""
    stack = np.stack(inputs)
    if dtype.kind == "b":
        return (np.any if op in (ReduceOp.SUM, ReduceOp.MAX) else np.all)(stack, axis=0)
    if dtype.kind in "iu":
        total = {ReduceOp.SUM: stack.sum(0), ReduceOp.AVERAGE: stack.sum(0), ReduceOp.MIN: stack.min(0),
                 ReduceOp.MAX: stack.max(0), ReduceOp.PRODUCT: stack.prod(0)}[op].astype(dtype)
        factor = postscale / p if op is ReduceOp.AVERAGE and p > 1 else postscale
        return total if factor == 1.0 else np.trunc(total.astype(np.float64) * factor).astype(dtype)
    wide = stack.astype(np.float64)
    return {ReduceOp.SUM: wide.sum(0), ReduceOp.AVERAGE: wide.sum(0) / p, ReduceOp.MIN: wide.min(0),
            ReduceOp.MAX: wide.max(0), ReduceOp.PRODUCT: wide.prod(0)}[op] * postscale


def data(rank: int, shape, dtype, salt: int = 0) -> np.ndarray:
    rng = np.random.default_rng([rank, salt, int(np.prod(shape))])
    dtype = np.dtype(dtype)
    if dtype.kind in "iub":
        return rng.integers(0, 4, shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.uniform(0.5, 1.5, shape).astype(dtype)


def close(got, want, dtype, what, p, rel_dtype=None):
    """``got`` has ``dtype`` and equals ``want`` (exactly for integers, else within p roundings of the
    precision of ``rel_dtype``, default ``dtype``)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iub":
        ok = np.array_equal(got, want)
    else:
        rel = REL[np.dtype(rel_dtype or dtype)]
        ok = np.allclose(got.astype(np.float64), want, rtol=rel * p, atol=0)
    if not ok or got.shape != np.shape(want) or got.dtype != dtype:
        raise AssertionError(f"{what}: got {got.dtype}{got.shape} {got.ravel()[:6]}, want {np.ravel(want)[:6]}")


parser = argparse.ArgumentParser()
parser.add_argument("--local-size", type=int, default=None)
args = parser.parse_args()
comm = MPI.COMM_WORLD
p, rank = comm.size, comm.rank
config = Config.load({}, local_size=args.local_size, small_message_bytes=512, ring_segment_bytes=4096)
engine = Engine(MPITransport.duplicate(comm), Topology.detect(comm, args.local_size), config)
shapes = [(0,), (1,), (3, 4), (2, 0, 3), (5, 3, 7)]


@spmd.case
def allreduce_every_dtype_op_shape_algorithm():
    # allreduce_: every dtype and op, several shapes and algorithms.
    ops = [ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT]
    for algorithm in (None, "ring", "rabenseifner", "hierarchical", "native"):
        for dtype in REDUCIBLE:
            for op in ops:
                if op is ReduceOp.AVERAGE and dtype.kind == "b":
                    continue
                for shape in shapes:
                    inputs = [data(r, shape, dtype, int(op)) for r in range(p)]
                    buf = inputs[rank].copy()
                    out = engine.allreduce_(buf, op, algorithm=algorithm, name="t")
                    assert out is buf
                    want = expected(inputs, op, dtype, p)
                    close(buf, want, dtype, f"allreduce_ {algorithm} {dtype} {op.name} {shape}", p)


@spmd.case
def prescale_postscale_average_and_codecs():
    # prescale / postscale, with Average and codecs.
    for dtype in (np.float32, np.float64, FLOAT16, BFLOAT16):
        for op in (ReduceOp.SUM, ReduceOp.AVERAGE):
            for codec in (None, Compression.fp16, Compression.bf16):
                if codec is not None and dtype != np.float32:
                    continue
                inputs = [data(r, (6, 5), dtype, 7) for r in range(p)]
                buf = inputs[rank].copy()
                engine.allreduce_(buf, op, prescale=0.5, postscale=3.0, codec=codec)
                want = np.stack(inputs).astype(np.float64).sum(0) * 1.5 / (p if op is ReduceOp.AVERAGE else 1)
                close(buf, want, dtype, f"scaled {dtype} {op.name} {codec}", p, codec and codec.wire_dtype)


@spmd.case
def integers_scaled_as_horovod():
    # integers with scale factors and Average, as Horovod on the CPU: each product in float64, truncated
    # toward zero (prescale on every rank's input, postscale and Average's 1/p in one pass on the result).
    for algorithm in (None, "ring", "native"):
        for dtype in map(np.dtype, (np.uint8, np.int8, np.int16, np.int32, np.int64)):
            for op in (ReduceOp.SUM, ReduceOp.AVERAGE):
                shift = 0 if dtype.kind == "u" else 2
                inputs = [(data(r, (7, 3), dtype, 9).astype(np.int64) * 3 - shift).astype(dtype) for r in range(p)]
                buf = inputs[rank].copy()
                engine.allreduce_(buf, op, algorithm=algorithm, prescale=0.7, postscale=1.9)
                pre = [np.trunc(x.astype(np.float64) * 0.7).astype(dtype) for x in inputs]
                close(buf, expected(pre, op, dtype, p, postscale=1.9), dtype,
                      f"scaled {algorithm} {dtype} {op.name}", p)
                got = engine.reducescatter(inputs[rank], op, prescale=0.7, postscale=1.9)
                rows = partition.offsets(7, p)
                close(got, expected(pre, op, dtype, p, postscale=1.9)[rows[rank]:rows[rank + 1]], dtype,
                      f"scaled reducescatter {dtype} {op.name}", p)


@spmd.case
def fp16_codec_overflow():
    # fp16 codec: values up to 65504 * p stay finite (divided by p on the wire); beyond that, inf + warning.
    big = np.full(5, 60000.0, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompressionOverflowWarning)
        engine.allreduce_(big, ReduceOp.SUM, codec=Compression.fp16, name="big")
    assert np.allclose(big, 60000.0 * p, rtol=1e-3), big
    huge = np.full(5, 70000.0 * p, np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.allreduce_(huge, ReduceOp.AVERAGE, codec=Compression.fp16, name="huge")
    if p > 1:
        assert np.isinf(huge).all(), huge
        # The rank whose encoding overflowed is warned; ranks that only received the inf are not.
        messages = [str(w.message) for w in caught if issubclass(w.category, CompressionOverflowWarning)]
        assert all("huge" in m for m in messages), messages
        assert comm.allreduce(len(messages)) >= 1, "no rank was warned of the overflow"
    else:
        assert np.all(huge == 70000.0), huge  # one rank: nothing travels


@spmd.case
def allgather():
    # allgather: first dimension differs per rank (rank 0 may contribute nothing).
    for dtype in MOVABLE:
        for tail in ((), (3,), (2, 0)):
            parts = [data(r, (r % 3,) + tail, dtype, 11) for r in range(p)]
            got = engine.allgather(parts[rank])
            want = np.concatenate(parts)
            assert got.dtype == np.dtype(dtype) and np.array_equal(got, want), f"allgather {dtype} {tail}"
    got = engine.allgather(np.arange(12.0).reshape(3, 4)[:, ::2])  # non-contiguous input is copied
    assert np.array_equal(got, np.tile(np.arange(12.0).reshape(3, 4)[:, ::2], (p, 1)))


@spmd.case
def broadcast_from_every_root():
    # broadcast_: every root, dtypes, empty and multi-dimensional.
    for root in range(p):
        for dtype in MOVABLE:
            for shape in ((0,), (1,), (4, 3)):
                buf = data(rank, shape, dtype, 13)
                assert engine.broadcast_(buf, root) is buf
                assert np.array_equal(buf, data(root, shape, dtype, 13)), f"broadcast {root} {dtype} {shape}"


@spmd.case
def reducescatter():
    # reducescatter: earlier ranks take the extra rows; Average divides by the size.
    for dtype in REDUCIBLE:
        for op in (ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MAX):
            if op is ReduceOp.AVERAGE and dtype.kind == "b":
                continue
            for shape in ((0,), (1,), (max(p - 1, 1), 2), (7, 3), (2 * p + 1,)):
                inputs = [data(r, shape, dtype, 17) for r in range(p)]
                got = engine.reducescatter(inputs[rank], op)
                full = expected(inputs, op, dtype, p)
                rows = partition.offsets(shape[0], p)
                close(got, full[rows[rank]:rows[rank + 1]], dtype, f"reducescatter {dtype} {op.name} {shape}", p)


@spmd.case
def alltoall():
    # alltoall: equal split, custom splits (some zero), multi-dimensional.
    for dtype in (np.float32, np.int64, BFLOAT16, np.complex128):
        send = data(rank, (2 * p, 3), dtype, 19)
        got, received = engine.alltoall(send)
        want = np.concatenate([data(r, (2 * p, 3), dtype, 19)[2 * rank:2 * rank + 2] for r in range(p)])
        assert np.array_equal(got, want) and received.tolist() == [2] * p, f"alltoall equal {dtype}"
        splits_of = lambda r: [(r + i) % 3 for i in range(p)]  # noqa: E731
        sends = [data(r, (sum(splits_of(r)), 2), dtype, 23) for r in range(p)]
        got, received = engine.alltoall(sends[rank], splits_of(rank))
        pieces = []
        for r in range(p):
            start = sum(splits_of(r)[:rank])
            pieces.append(sends[r][start:start + splits_of(r)[rank]])
        assert np.array_equal(got, np.concatenate(pieces)), f"alltoall splits {dtype}"
        assert received.tolist() == [splits_of(r)[rank] for r in range(p)], received
    empty, received = engine.alltoall(np.zeros((0, 4), np.float32))
    assert empty.shape == (0, 4) and received.tolist() == [0] * p


@spmd.case
def errors_alike_on_every_rank():
    # Errors, raised alike on every rank.
    f32 = np.ones(8, np.float32)
    expect_error(CommlibError, "not contiguous", lambda: engine.allreduce_(np.ones((4, 4), np.float32)[:, 1], "sum", name="w"),
                 "non-contiguous allreduce_")
    expect_error(ConfigError, "unknown algorithm", lambda: engine.allreduce_(f32, "sum", algorithm="fastest"), "bad algorithm")
    expect_error(ConfigError, "native", lambda: engine.allreduce_(f32, "sum", algorithm="native", codec=Compression.fp16),
                 "native with codec")
    expect_error(UnsupportedDtypeError, "Average", lambda: engine.allreduce_(np.ones(3, np.bool_), "average"), "bool average")
    expect_error(TypeError, "prescale", lambda: engine.allreduce_(np.ones(3, np.bool_), "sum", prescale=2.0), "bool prescale")
    expect_error(TypeError, "float32", lambda: engine.allreduce_(np.ones(3), "sum", codec=Compression.bf16), "codec on float64")
    expect_error(CommlibError, "root", lambda: engine.broadcast_(f32, p), "bad root")
    if p > 1:
        expect_error(CommlibError, "divisible", lambda: engine.alltoall(np.ones(p + 1)), "alltoall indivisible")
    expect_error(CommlibError, "splits", lambda: engine.alltoall(np.ones(p), [2] * p), "alltoall bad splits")
    assert np.all(f32 == 1)  # no failed call touched the buffer


@spmd.case
def barrier_and_close():
    engine.barrier()
    engine.close()
    engine.close()  # idempotent


if __name__ == "__main__":
    spmd.main()
