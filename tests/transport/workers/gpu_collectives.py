"""Worker (GPU only): CuPy arrays and torch CUDA tensors through commlib's collectives (staged through
pinned host memory), against numpy; a GPU tensor on one rank and a CPU tensor on the others fails on
every rank naming the device of each rank (Horovod's cpu_gpu_error). Several ranks may share one GPU.

    mpiexec -n P python gpu_collectives.py
"""

from __future__ import annotations

import cupy
import numpy as np

import commlib as cl
import spmd


def data(rank, shape, dtype, salt=0):
    rng = np.random.default_rng([rank, salt, int(np.prod(shape))])
    return rng.uniform(0.5, 1.5, shape).astype(dtype)


def expect_error(fn, *needles):
    try:
        fn()
    except cl.CommlibError as exc:
        missing = [n for n in needles if n not in str(exc)]
        assert not missing, f"error lacks {missing}: {exc}"
        return
    raise AssertionError("no error raised")


def check_cupy(rank, size):
    for shape in [(0,), (1,), (size - 1 or 1,), (7,), (3, 5)]:
        for dtype, tol in [(np.float32, 1e-6), (np.float64, 1e-12), (np.float16, 3e-3), (np.int32, 0)]:
            mine = data(rank, shape, dtype)
            everyone = np.stack([data(r, shape, dtype).astype(np.float64) for r in range(size)])
            op = cl.Sum if np.dtype(dtype).kind == "i" else cl.Average
            want = everyone.sum(0) if op is cl.Sum else everyone.mean(0)
            out = cl.allreduce(cupy.asarray(mine), op=op, name=f"ar.{shape}.{np.dtype(dtype)}")
            assert isinstance(out, cupy.ndarray) and out.shape == shape and out.dtype == dtype
            np.testing.assert_allclose(cupy.asnumpy(out).astype(np.float64), want, rtol=tol, atol=tol)
            inplace = cupy.asarray(mine)
            assert cl.allreduce_(inplace, op=op, name=f"ar_.{shape}.{np.dtype(dtype)}") is inplace
            np.testing.assert_allclose(cupy.asnumpy(inplace).astype(np.float64), want, rtol=tol, atol=tol)
    x = cupy.asarray(data(rank, (8,), np.float32))
    handles = [cl.allreduce_async(x, op=cl.Sum, name=f"async.{i}") for i in range(3)]
    want = sum(data(r, (8,), np.float32) for r in range(size))
    for h in handles:
        np.testing.assert_allclose(cupy.asnumpy(cl.synchronize(h)), want, rtol=1e-6)
    grouped = cl.grouped_allreduce([cupy.asarray(data(rank, (n,), np.float32, n)) for n in (1, 4, 9)],
                                   op=cl.Sum, name="grouped")
    for n, got in zip((1, 4, 9), grouped):
        np.testing.assert_allclose(cupy.asnumpy(got), sum(data(r, (n,), np.float32, n) for r in range(size)),
                                   rtol=1e-6)
    fp16 = cl.allreduce(x, op=cl.Sum, name="fp16", compression=cl.Compression.fp16)
    np.testing.assert_allclose(cupy.asnumpy(fp16), want, rtol=4e-3)
    rows = cupy.asarray(np.full((rank + 1, 2), rank, np.int64))
    gathered = cl.allgather(rows, name="gather")
    assert isinstance(gathered, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(gathered),
                                  np.concatenate([np.full((r + 1, 2), r) for r in range(size)]))
    b = cupy.asarray(np.full(5, rank, np.float32))
    cl.broadcast_(b, size - 1, name="bcast")
    np.testing.assert_array_equal(cupy.asnumpy(b), np.full(5, size - 1))
    scattered = cl.reducescatter(cupy.asarray(np.ones((2 * size, 3), np.float32)), op=cl.Sum, name="rs")
    np.testing.assert_array_equal(cupy.asnumpy(scattered), np.full((2, 3), size))
    out, splits = cl.alltoall(cupy.asarray(np.full(size, rank, np.int32)), name="a2a")
    np.testing.assert_array_equal(cupy.asnumpy(out), np.arange(size))


def check_torch(rank, size):
    import torch
    import commlib.torch as hvd

    assert hvd.cuda_built()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        t = torch.full((4, 3), float(rank + 1), dtype=dtype, device="cuda")
        out = hvd.allreduce(t, name=f"t.{dtype}", op=hvd.Sum)
        assert out.is_cuda and out.dtype == dtype and out.shape == t.shape
        assert torch.all(out.float().cpu() == size * (size + 1) / 2)
        hvd.allreduce_(t, name=f"t_.{dtype}", op=hvd.Average)
        assert torch.allclose(t.float().cpu(), torch.full((4, 3), (size + 1) / 2), rtol=1e-2)
    g = hvd.allgather(torch.full((1, 2), rank, device="cuda"), name="tg")
    assert g.is_cuda and g[:, 0].cpu().tolist() == list(range(size))
    b = torch.full((3,), float(rank), device="cuda")
    hvd.broadcast_(b, 0, name="tb")
    assert b.cpu().tolist() == [0.0, 0.0, 0.0]


def check_cpu_gpu_error(rank, size):
    """Horovod's test_horovod_allreduce_cpu_gpu_error: rank 0 on the GPU, the others on the CPU."""
    x = cupy.zeros(4, np.float32) if rank == 0 else np.zeros(4, np.float32)
    listing = ", ".join(f"rank {r}: {'cuda' if r == 0 else 'cpu'}" for r in range(size))
    if size > 1:
        expect_error(lambda: cl.allreduce(x, name="cpu_gpu"), "'cpu_gpu'", f"mismatched device ({listing})")


@spmd.case
def init():
    cl.init()
    assert cl.cuda_built()
    cupy.cuda.Device(0).use()


@spmd.case
def collectives_on_cupy():
    check_cupy(cl.rank(), cl.size())


@spmd.case
def collectives_on_torch_cuda():
    check_torch(cl.rank(), cl.size())


@spmd.case
def cpu_on_one_rank_gpu_on_another_is_an_error():
    check_cpu_gpu_error(cl.rank(), cl.size())


@spmd.case
def shutdown():
    cl.shutdown()


if __name__ == "__main__":
    spmd.main()
