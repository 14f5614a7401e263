"""Eager small allreduces (commlib/coordinator/eager.py) on ranks spread over several nodes.

Run with COMMLIB_LOCAL_SIZE set so that the set spans nodes. Checks against numpy: every op, integer and
float dtypes, scale factors, Average, sizes around the limit, tensors submitted in a different order on
every rank beside a large one in the same rounds, a process set, and a joined rank contributing zeros;
that every rank holds the same bits; and that the small ones did go eagerly and the large one did not.
"""

import numpy as np
from mpi4py import MPI

import commlib as cl
from commlib.api import _rt
from commlib.coordinator.eager import TENSOR_BYTES
import spmd

world = MPI.COMM_WORLD
rank = size = limit = 0
eager = None


def same_everywhere(name, arr):
    digests = world.allgather(np.ascontiguousarray(arr).tobytes())
    assert all(d == digests[0] for d in digests), f"{name}: ranks hold different bits"


def contribution(seed, count, dtype, r):
    rng = np.random.default_rng(seed * 100 + r)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 5, count).astype(dtype)
    return rng.uniform(-2, 2, count).astype(dtype)


@spmd.case
def init():
    global rank, size, eager, limit
    cl.init()
    rank, size = cl.rank(), cl.size()
    eager = _rt().coordinator._eager
    limit = min(_rt().config.eager_bytes // (size - 1), TENSOR_BYTES)  # the largest eager tensor, bytes


@spmd.case
def every_op_and_dtype_up_to_the_limit():
    # every op, integer and float dtypes, sizes up to the limit
    seed = 0
    for dtype in (np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8):
        for count in (0, 1, size - 1, 7, limit // np.dtype(dtype).itemsize):
            for op, ref in ((cl.Sum, np.add), (cl.Max, np.maximum), (cl.Min, np.minimum), (cl.Product, np.multiply)):
                seed += 1
                parts = [contribution(seed, count, dtype, r) for r in range(size)]
                want = parts[0].astype(np.float64)
                for p in parts[1:]:
                    want = ref(want, p.astype(np.float64))
                got = cl.allreduce(parts[rank], op=op, name=f"eager.{seed}")
                tol = 2e-2 * size if dtype == np.float16 else 1e-5
                assert np.allclose(got.astype(np.float64), want.astype(dtype).astype(np.float64), rtol=tol, atol=tol), \
                    (dtype, count, op, got[:4], want[:4])
                same_everywhere(f"eager.{seed}", got)


@spmd.case
def scale_factors_and_average():
    # scale factors and Average, floats and integers (Horovod's truncation), in place
    for dtype in (np.float32, np.int32):
        x = contribution(99, 33, dtype, rank)
        parts = [contribution(99, 33, dtype, r) for r in range(size)]
        got = x.copy()
        cl.allreduce_(got, op=cl.Average, name=f"eager.avg.{np.dtype(dtype).name}")
        total = np.sum([p.astype(np.float64) for p in parts], axis=0)
        want = np.trunc(total * (1.0 / size)) if np.dtype(dtype).kind == "i" else total / size
        assert np.allclose(got, want, atol=1e-5), (dtype, got[:4], want[:4])
        if np.dtype(dtype).kind == "f":
            got = cl.allreduce(x, op=cl.Sum, name="eager.scaled", prescale_factor=0.5, postscale_factor=3.0)
            assert np.allclose(got, 1.5 * total, atol=1e-4), (got[:4], 1.5 * total[:4])
            same_everywhere("eager.scaled", got)


@spmd.case
def several_at_once_in_any_order_beside_a_large_one():
    # several at once, in a different order on every rank, beside one too large to go eagerly
    before = eager.runs
    small = {f"eager.async.{i}": np.full(10 + i, float(rank + i), np.float32) for i in range(8)}
    large = np.full(limit // 4 + 1, float(rank), np.float32)
    names = list(small)
    order = names[rank % len(names):] + names[:rank % len(names)]
    handles = {n: cl.allreduce_async(small[n], op=cl.Sum, name=n) for n in order}
    big = cl.allreduce_async(large, op=cl.Sum, name="eager.too_large")
    for i, n in enumerate(names):
        got = cl.synchronize(handles[n])
        assert np.all(got == sum(r + i for r in range(size))), (n, got[:3])
    assert np.all(cl.synchronize(big) == sum(range(size)))
    assert eager.runs - before == len(small), f"rank {rank}: {eager.runs - before} eager runs, want {len(small)}"


@spmd.case
def a_process_set():
    # a process set of the even ranks (across nodes when each rank is a node)
    evens = cl.add_process_set(list(range(0, size, 2)))
    if rank % 2 == 0:
        got = cl.allreduce(np.full(5, float(rank), np.float32), op=cl.Sum, name="eager.set", process_set=evens)
        assert np.all(got == sum(range(0, size, 2))), got
    cl.remove_process_set(evens)


@spmd.case
def join_contributes_zeros():
    # join: the ranks that ran out contribute zeros
    for batch in range(rank + 1):
        got = cl.allreduce(np.ones(4, np.float32), op=cl.Sum, name=f"eager.join{batch}")
        assert np.all(got == size - batch), (batch, got)
    last = cl.join()
    assert last == size - 1, last


@spmd.case
def shutdown():
    assert eager.runs > 0
    print(f"rank {rank}: {eager.runs} eager allreduces", flush=True)
    cl.shutdown()


if __name__ == "__main__":
    spmd.main()
