"""Every collective through the coordinator against numpy references, on whatever number of ranks.

Named cases on every rank (tests/spmd.py); also run on emulated hosts (tests/testing/test_cluster.py).
"""

import time

import ml_dtypes
import numpy as np

import commlib as cl
import spmd

rank, size = spmd.rank_and_size()  # the job's, which commlib's are once init() ran
DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.int32, np.int64,
          np.bool_]
OPS = {cl.Sum: np.add, cl.Min: np.minimum, cl.Max: np.maximum, cl.Product: np.multiply}


def inputs(seed, count, dtype, r):
    rng = np.random.default_rng(seed * 1000 + r)
    if np.dtype(dtype).kind == "b":
        return rng.random(count) < 0.5
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 3, count).astype(dtype)  # small: products and sums stay exact
    return rng.uniform(-2, 2, count).astype(dtype)


def reference(seed, count, dtype, op):
    parts = [inputs(seed, count, dtype, r).astype(np.float64) for r in range(size)]
    if np.dtype(dtype).kind == "b":  # Sum and Max: or; Product and Min: and
        return (np.any if op in (cl.Sum, cl.Max) else np.all)(np.array(parts, bool), axis=0).astype(np.float64)
    if op is cl.Average and np.dtype(dtype).kind in "iu":  # as Horovod: the sum times 1/size, truncated
        return np.trunc(np.sum(parts, axis=0) * (1.0 / size))
    if op is cl.Average:
        return np.sum(parts, axis=0) / size
    out = parts[0]
    for p in parts[1:]:
        out = OPS[op](out, p)
    return out


def check(name, got, want, dtype):
    dtype = np.dtype(dtype)
    tol = {2: 2e-2 * size, 4: 1e-5, 8: 1e-12}[dtype.itemsize] if dtype.kind == "f" or dtype == np.dtype(ml_dtypes.bfloat16) else 0
    if dtype == np.dtype(ml_dtypes.bfloat16):
        tol = 4e-2 * size
    got64 = np.asarray(got).astype(np.float64)
    if dtype.kind in "iub":
        want = want.astype(dtype).astype(np.float64)  # wraps like the dtype
    if not np.allclose(got64, want, rtol=tol, atol=tol, equal_nan=True):
        bad = np.flatnonzero(~np.isclose(got64.ravel(), want.ravel(), rtol=tol, atol=tol))
        raise AssertionError(f"rank {rank}: {name}: wrong at {bad[:5]}: got {got64.ravel()[bad[:5]]}, "
                             f"want {want.ravel()[bad[:5]]}")


@spmd.case
def init():
    cl.init()


@spmd.case
def allreduce_every_op_dtype_size():
    # allreduce: every op x dtype x size, sync out-of-place and in-place
    sizes = [0, 1, max(size - 1, 0), 7, 97, 4099]
    seed = 0
    for dtype in DTYPES:
        for op in [cl.Sum, cl.Average, cl.Min, cl.Max, cl.Product]:
            if op is cl.Average and np.dtype(dtype).kind == "b":
                continue
            for count in sizes:
                seed += 1
                x = inputs(seed, count, dtype, rank)
                want = reference(seed, count, dtype, op)
                got = cl.allreduce(x, op=op, name=f"ar.{seed}")
                check(f"allreduce {np.dtype(dtype).name} {op.name} n={count}", got, want, dtype)
                assert np.array_equal(x, inputs(seed, count, dtype, rank)), "allreduce modified its input"
                y = x.copy()
                assert cl.allreduce_(y, op=op, name=f"ari.{seed}") is y
                check(f"allreduce_ {np.dtype(dtype).name} {op.name} n={count}", y, want, dtype)


@spmd.case
def submission_order_differs_per_rank():
    # different submission order per rank, many small tensors in flight, mixed dtypes
    names = [f"mix.{i}" for i in range(300)]
    order = np.random.default_rng(rank).permutation(len(names))
    handles = {}
    for i in order:
        dtype = DTYPES[i % len(DTYPES)]
        if np.dtype(dtype).kind in "iub":
            handles[i] = cl.allreduce_async(inputs(5000 + i, 1 + i % 50, dtype, rank), op=cl.Sum, name=names[i])
        else:
            handles[i] = cl.allreduce_async(inputs(5000 + i, 1 + i % 50, dtype, rank), op=cl.Average, name=names[i])
    for i in range(len(names)):
        dtype = DTYPES[i % len(DTYPES)]
        op = cl.Sum if np.dtype(dtype).kind in "iub" else cl.Average
        check(names[i], cl.synchronize(handles[i]), reference(5000 + i, 1 + i % 50, dtype, op), dtype)


@spmd.case
def thousands_of_small_tensors_twice():
    # thousands of small tensors, twice (the second time through the cache)
    for rnd in range(2):
        xs = [np.full(3, rank + i, np.float32) for i in range(2000)]
        hs = [cl.allreduce_async_(x, op=cl.Sum, name=f"small.{i}") for i, x in enumerate(xs)]
        for i, h in enumerate(hs):
            out = cl.synchronize(h)
            assert out is xs[i] and np.all(out == sum(r + i for r in range(size))), (i, out)


@spmd.case
def a_cached_name_renegotiated_with_a_new_shape():
    # a cached name renegotiated with a new shape on every rank, submitted at staggered times (a rank that has
    # nothing to submit answers the rounds the others start) and interleaved with cached calls
    for n in (5, 7, 5, 7):
        time.sleep(0.02 * rank)
        h = cl.allreduce_async(np.ones(2), op=cl.Sum, name="steady")
        got = cl.allreduce(np.full(n, rank + 1.0), op=cl.Sum, name="reshaped")
        assert got.shape == (n,) and np.all(got == size * (size + 1) / 2), (n, got)
        assert np.all(cl.synchronize(h) == size)


@spmd.case
def scale_factors_on_a_large_tensor():
    # scale factors and a large in-place tensor
    x = inputs(9, 3 << 20, np.float32, rank)
    got = cl.allreduce(x, op=cl.Sum, prescale_factor=0.5, postscale_factor=3.0, name="scaled")
    check("scaled", got, reference(9, 3 << 20, np.float32, cl.Sum) * 1.5, np.float32)


@spmd.case
def compression_on_the_wire():
    # compression: fp16 and bf16 on the wire, float32 accumulation
    for comp, tol in [(cl.Compression.fp16, 2e-3), (cl.Compression.bf16, 2e-2)]:
        x = inputs(11, 100003, np.float32, rank)
        got = cl.allreduce(x, op=cl.Average, compression=comp, name=f"comp.{comp.name}")
        want = reference(11, 100003, np.float32, cl.Average)
        assert np.allclose(got, want, rtol=tol, atol=tol), (comp, np.abs(got - want).max())


@spmd.case
def grouped_allreduce():
    # grouped
    xs = [inputs(20 + i, 10 * i + 1, np.float64, rank) for i in range(5)]
    outs = cl.grouped_allreduce(xs, op=cl.Sum, name="grp")
    for i, o in enumerate(outs):
        check(f"grouped {i}", o, reference(20 + i, 10 * i + 1, np.float64, cl.Sum), np.float64)


@spmd.case
def allgather_first_dimension_differs():
    # allgather with a different first dimension per rank
    for count in [0, 1, 3]:
        x = np.full((rank + count, 2), rank, np.int32)
        got = cl.allgather(x, name=f"ag.{count}")
        want = np.concatenate([np.full((r + count, 2), r, np.int32) for r in range(size)])
        assert np.array_equal(got, want), (count, got, want)


@spmd.case
def broadcast_from_every_root():
    # broadcast from every root, in place and not
    for root in range(size):
        x = np.arange(5, dtype=np.float64) + rank
        got = cl.broadcast(x, root, name=f"bc.{root}")
        assert np.array_equal(got, np.arange(5) + root) and np.array_equal(x, np.arange(5) + rank)
        cl.broadcast_(x, root, name=f"bci.{root}")
        assert np.array_equal(x, np.arange(5) + root)


@spmd.case
def reducescatter():
    # reducescatter: earlier ranks take the extra rows
    rows = 2 * size + 1
    x = np.stack([inputs(30 + r, 4, np.float32, rank) for r in range(rows)])
    got = cl.reducescatter(x, op=cl.Sum, name="rs")
    full = np.stack([reference(30 + r, 4, np.float32, cl.Sum) for r in range(rows)])
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    check("reducescatter", got, full[start:start + counts[rank]], np.float32)


@spmd.case
def reducescatter_of_integers_as_horovod():
    # reducescatter of integers with Average and scale factors, as Horovod on the CPU: each rank's input times
    # the prescale, truncated; the sum times postscale / size (Average), truncated
    rows = 2 * size + 1
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    for dtype in (np.int32, np.int64, np.int16):
        x = (np.stack([inputs(40 + r, 3, dtype, rank) for r in range(rows)]).astype(np.int64) * 7 - 5).astype(dtype)
        every = [(np.stack([inputs(40 + r, 3, dtype, q) for r in range(rows)]).astype(np.int64) * 7 - 5) for q in range(size)]
        pre = [np.trunc(e * 0.6) for e in every]
        want = np.trunc(np.sum(pre, axis=0) * (1.5 / size))
        got = cl.reducescatter(x, op=cl.Average, prescale_factor=0.6, postscale_factor=1.5, name=f"rs.int.{dtype.__name__}")
        assert got.dtype == np.dtype(dtype)
        check(f"reducescatter {dtype.__name__} average scaled", got, want[start:start + counts[rank]], dtype)
        got = cl.allreduce(x, op=cl.Average, prescale_factor=0.6, postscale_factor=1.5, name=f"ar.int.{dtype.__name__}")
        check(f"allreduce {dtype.__name__} average scaled", got, want, dtype)


@spmd.case
def alltoall_uneven_splits():
    # alltoall with uneven splits: rank r sends (r + d) % 3 rows to rank d
    splits = [(rank + d) % 3 for d in range(size)]
    x = np.concatenate([np.full((splits[d], 2), 100 * rank + d, np.int64) for d in range(size)] or
                       [np.zeros((0, 2), np.int64)])
    out, received = cl.alltoall(x, splits=splits, name="a2a")
    want_splits = [(s + rank) % 3 for s in range(size)]
    assert list(received) == want_splits, (received, want_splits)
    want = np.concatenate([np.full((want_splits[s], 2), 100 * s + rank, np.int64) for s in range(size)])
    assert np.array_equal(out, want), (out, want)


@spmd.case
def objects_and_barrier():
    # objects, barrier
    assert cl.broadcast_object({"from": rank} if rank == size - 1 else None, root_rank=size - 1) == {"from": size - 1}
    assert cl.allgather_object(("r", rank)) == [("r", r) for r in range(size)]
    cl.barrier()


@spmd.case
def join_with_uneven_batch_counts():
    # join with uneven batch counts: rank r runs r + 1 batches; joined ranks contribute zeros
    for batch in range(rank + 1):
        got = cl.allreduce(np.ones(4, np.float32), op=cl.Sum, name=f"join.batch{batch}")
        active = sum(1 for r in range(size) if r + 1 > batch)
        assert np.all(got == active), (batch, got, active)
    last = cl.join()
    assert last == size - 1, last


@spmd.case
def shutdown_then_init_again():
    cl.shutdown()
    assert not cl.is_initialized()
    try:
        cl.allreduce(np.ones(2), name="after")
    except cl.CommlibError as exc:
        assert "not initialized" in str(exc)
    else:
        raise AssertionError("allreduce after shutdown did not raise")
    # init after shutdown works
    cl.init()
    assert np.all(cl.allreduce(np.ones(2), op=cl.Sum, name="again") == size)
    cl.shutdown()


if __name__ == "__main__":
    spmd.main()
