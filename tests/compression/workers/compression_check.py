"""Lossy compressors on N ranks against numpy references: every check runs on every rank and asserts;
a failure aborts the job. Named cases on every rank (tests/spmd.py)."""

import numpy as np

import commlib as cl
from commlib import CollectiveError
from commlib.compression import DGC, OneBit, PowerSGD, RandomK, TopK
import spmd

C = cl.Compression
rank, size = spmd.rank_and_size()  # the job's, which commlib's are once init() ran


def gather_rows(x: np.ndarray, name: str) -> np.ndarray:
    return cl.allgather(np.ascontiguousarray(x).reshape(1, -1), name=name)


def same_on_every_rank(x: np.ndarray, name: str) -> None:
    rows = gather_rows(x.view(np.uint32), name)
    assert (rows == rows[0]).all(), f"{name}: ranks decoded different bits"


def grad(seed, n, scale=1.0):
    return (np.random.default_rng([seed, rank]).standard_normal(n) * scale).astype(np.float32)


class HalfCompressor:
    @staticmethod
    def compress(tensor):
        return tensor.astype(np.float16), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.astype(ctx)


@spmd.case
def init():
    # learning auto may run the two calls compared bit for bit below with different algorithms (different
    # summation orders): the model's choice alone keeps them on the same one
    cl.init(auto_learn=False)


@spmd.case
def topk_1_is_the_dense_allreduce():
    # topk(1.0) is the dense allreduce, bit for bit (k * ranks >= n: the pairs would move more bytes).
    for n in (0, 1, 3, 1000, 5000):
        x = grad(1, n)
        got = cl.allreduce(x, op=cl.Sum, name=f"full.{n}", compression=C.topk(1.0, min_elements=0))
        ref = cl.allreduce(x, op=cl.Sum, name=f"full.ref.{n}")
        assert np.array_equal(got, ref), (n, got, ref)


@spmd.case
def sparse_exchange_sums_every_ranks_topk():
    # sparse exchange: the sum of every rank's top-k, scattered in rank order, and the same on every rank.
    n = 20000
    for ratio in (0.001, 0.01, 0.1):
        x = grad(2, n)
        comp = TopK(ratio, min_elements=0)
        got = cl.allreduce(x, op=cl.Sum, name=f"topk.{ratio}", compression=comp)
        every = gather_rows(x, f"topk.in.{ratio}")
        ref = np.zeros(n, np.float32)
        k = max(1, int(np.ceil(ratio * n)))
        for r in range(size):
            idx = np.sort(np.argsort(-np.abs(every[r]), kind="stable")[:k])
            if k * size < n:
                np.add.at(ref, idx, every[r][idx])
        if k * size >= n:
            ref = None
        if ref is not None:
            assert np.array_equal(got, ref), ratio
        same_on_every_rank(got, f"topk.same.{ratio}")
        avg = cl.allreduce(x, op=cl.Average, name=f"topk.avg.{ratio}", compression=TopK(ratio, min_elements=0))
        assert np.allclose(avg * size, got, rtol=1e-6, atol=0), ratio


@spmd.case
def error_feedback_keeps_what_was_not_sent():
    # error feedback: everything sent (summed over steps) plus every rank's residual is the sum of all
    #    gradients fed in; for topk, randomk and onebit.
    for label, comp in (("topk", C.topk(0.02, min_elements=0)), ("randomk", C.randomk(0.02, seed=7, min_elements=0)),
                        ("onebit", C.onebit(min_elements=0))):
        fed = np.zeros(4000, np.float64)
        sent = np.zeros(4000, np.float64)
        for step in range(6):
            g = grad(100 + step, 4000)
            fed += g
            out = cl.allreduce(g, op=cl.Sum, name=f"ef.{label}", compression=comp)
            same_on_every_rank(out, f"ef.{label}.same.{step}")
            sent += out
        fed_all = cl.allreduce(fed, op=cl.Sum, name=f"ef.{label}.fed")
        residual = comp.state[f"ef.{label}"]["residual"].astype(np.float64)
        residual_all = cl.allreduce(residual, op=cl.Sum, name=f"ef.{label}.residual")
        assert np.allclose(sent + residual_all, fed_all, rtol=1e-5, atol=1e-4), label


@spmd.case
def randomk_positions_and_onebit_signs():
    # random-k: the same positions on every rank (only values travel); one-bit: signs times mean magnitude.
    x = grad(4, 3000)
    got = cl.allreduce(x, op=cl.Sum, name="rk", compression=RandomK(0.05, seed=3, min_elements=0))
    positions = np.flatnonzero(got)
    assert positions.size <= 150
    every = gather_rows(x, "rk.in")
    assert np.allclose(got[positions], every[:, positions].sum(0), rtol=1e-5)
    same_on_every_rank(got, "rk.same")
    got = cl.allreduce(x, op=cl.Sum, name="ob", compression=OneBit(min_elements=0))
    ref = np.zeros(3000, np.float32)
    for r in range(size):
        ref += np.float32(np.abs(every[r]).mean(dtype=np.float64)) * np.where(every[r] >= 0, 1, -1).astype(np.float32)
    assert np.allclose(got, ref, rtol=1e-6, atol=1e-6)
    same_on_every_rank(got, "ob.same")


@spmd.case
def small_tensors_go_dense_and_state_is_per_name():
    # tensors below min_elements go dense (exactly the allreduce); state is per name.
    x = grad(5, 100)
    assert np.array_equal(cl.allreduce(x, op=cl.Sum, name="small", compression=C.topk(0.01)),
                          cl.allreduce(x, op=cl.Sum, name="small.ref"))
    comp = C.topk(0.01, min_elements=0)
    cl.allreduce(grad(6, 2000), name="a", compression=comp)
    cl.allreduce(grad(6, 500), name="b", compression=comp)
    assert comp.state["a"]["residual"].size == 2000 and comp.state["b"]["residual"].size == 500


@spmd.case
def powersgd():
    # PowerSGD: dense before start_step and for 1-D tensors (bit for bit); at full rank the dense sum.
    m = grad(7, 24 * 10).reshape(24, 10)
    ps = PowerSGD(rank=2, start_step=1)
    assert np.array_equal(cl.allreduce(m, op=cl.Sum, name="ps", compression=ps),
                          cl.allreduce(m, op=cl.Sum, name="ps.ref"))
    v = grad(8, 50)
    assert np.array_equal(cl.allreduce(v, op=cl.Sum, name="ps1d", compression=PowerSGD(1, 0)),
                          cl.allreduce(v, op=cl.Sum, name="ps1d.ref"))
    full = PowerSGD(rank=10, start_step=0, min_compression_rate=0.0)
    for step in range(3):
        m = grad(20 + step, 24 * 10).reshape(24, 10)
        got = cl.allreduce(m, op=cl.Sum, name="psfull", compression=full)
        ref = cl.allreduce(m, op=cl.Sum, name="psfull.ref")
        assert np.allclose(got, ref, rtol=1e-4, atol=1e-4), (step, np.abs(got - ref).max())
        same_on_every_rank(got, f"psfull.same.{step}")
    low = PowerSGD(rank=1, start_step=0)
    fed = np.zeros((64, 32))
    sent = np.zeros((64, 32))
    for step in range(4):
        m = grad(30 + step, 64 * 32).reshape(64, 32)
        fed += m
        out = cl.allreduce(m, op=cl.Sum, name="pslow", compression=low)
        same_on_every_rank(out, f"pslow.same.{step}")
        sent += out
    err = cl.allreduce(low.state["pslow"]["error"].astype(np.float64), op=cl.Sum, name="pslow.err")
    assert np.allclose(sent + err, cl.allreduce(fed, op=cl.Sum, name="pslow.fed"), rtol=1e-4, atol=1e-3)


@spmd.case
def dgc_follows_its_warmup_schedule():
    # DGC: the warm-up follows its schedule (dense first, then k = n * (1 - sparsity) per rank).
    sched = DGC(momentum=0.0, rampup_begin_step=2, rampup_step=5, min_elements=0)
    expected = [None, None, 0.75, 0.9375, 0.984375, 0.996, 0.999, 0.999]
    assert [sched.sparsity_at(s) for s in range(8)] == expected
    n = 8000
    for step, s in enumerate(expected):
        x = grad(40 + step, n) + 0.5  # no zeros
        out = cl.allreduce(x, op=cl.Sum, name="dgc", compression=sched)
        same_on_every_rank(out, f"dgc.same.{step}")
        if s is None:
            assert np.array_equal(out, cl.allreduce(x, op=cl.Sum, name=f"dgc.ref.{step}")), step
        else:
            k = int(np.ceil(n * (1 - s)))
            nonzero = np.count_nonzero(out)
            assert (nonzero == k) if size == 1 else (k <= nonzero <= size * k or k * size >= n), (step, nonzero, k)


@spmd.case
def async_compressed_tensors_in_place():
    # async: several compressed tensors in flight at once, in place.
    tensors = [grad(50 + i, 3000 + i) for i in range(5)]
    refs = [cl.allreduce(t, op=cl.Sum, name=f"async.ref.{i}") for i, t in enumerate(tensors)]
    comps = [TopK(1.0, min_elements=0), PowerSGD(1, 10), C.onebit(), C.topk(0.5), DGC(rampup_begin_step=5)]
    handles = [cl.allreduce_async_(t, op=cl.Sum, name=f"async.{i}", compression=c)
               for i, (t, c) in enumerate(zip(tensors, comps))]
    for h in handles:
        cl.synchronize(h)
    for i in (0, 1):
        assert np.array_equal(tensors[i], refs[i]), i
    assert np.array_equal(tensors[4], refs[4])  # DGC before warm-up: the dense sum (momentum from zero)


@spmd.case
def horovods_compressor_interface():
    # Horovod's Compressor interface: built-in objects, and a user-written class with static methods.
    x = grad(9, 300)
    half, ctx = C.fp16.compress(x)
    assert half.dtype == np.float16 and C.fp16.decompress(half, ctx).dtype == np.float32
    assert C.none.compress(x)[0] is x

    got = cl.allreduce(x, op=cl.Sum, name="user", compression=HalfCompressor)
    ref = cl.allreduce(x.astype(np.float16), op=cl.Sum, name="user.ref").astype(np.float32)
    assert got.dtype == np.float32 and np.array_equal(got, ref)
    y = x.copy()
    cl.allreduce_(y, op=cl.Sum, name="user.inplace", compression=HalfCompressor)
    assert np.array_equal(y, ref)


@spmd.case
def errors_name_the_tensor_on_every_rank():
    # errors: on every rank, naming the tensor.
    try:
        cl.allreduce(np.ones(5000), name="bad.dtype", compression=C.topk(0.1))
        raise AssertionError("float64 with topk was accepted")
    except CollectiveError as exc:
        assert "bad.dtype" in str(exc) and "float32" in str(exc), exc
    if size > 1:  # rank 0 passes float64, the others float32: every rank fails
        data = np.ones(5000, np.float64 if rank == 0 else np.float32)
        try:
            cl.allreduce(data, name="bad.mixed", compression=C.topk(0.01))
            raise AssertionError("mixed dtypes were accepted")
        except CollectiveError as exc:
            assert "bad.mixed" in str(exc), exc
    try:
        cl.allreduce(np.ones(10, np.float32), op=cl.Max, name="bad.op", compression=C.topk(0.1))
        raise AssertionError("Max with topk was accepted")
    except CollectiveError as exc:
        assert "Sum or Average" in str(exc), exc


@spmd.case
def shutdown():
    cl.shutdown()


if __name__ == "__main__":
    spmd.main()
