"""Worker (GPU with NCCL only): the NCCL transport against numpy: group calls over several arrays, every
dtype NCCL takes, Sum/Average/Min/Max/Product, pre/postscale, a float16 wire, the hierarchical allreduce,
and two lanes (streams). NCCL needs one GPU per rank: with one GPU only 1 rank can run.

    mpiexec -n P python gpu_nccl_check.py
"""

from __future__ import annotations

import cupy
import numpy as np
from mpi4py import MPI

from commlib.ops import ReduceOp
from commlib.transport.nccl import NcclTransport
import spmd

REDUCE = {ReduceOp.SUM: np.sum, ReduceOp.AVERAGE: np.mean, ReduceOp.MIN: np.min, ReduceOp.MAX: np.max,
          ReduceOp.PRODUCT: np.prod}


def data(rank, n, dtype, salt):
    rng = np.random.default_rng([rank, salt, n])
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 4, n).astype(dtype)
    return rng.uniform(0.5, 1.5, n).astype(dtype)


comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
nccl = None


@spmd.case
def init():
    global nccl
    nccl = NcclTransport(comm, num_streams=2)


@spmd.case
def every_dtype_op_wire_and_lane():
    for dtype, wire, tol in [(np.float32, None, 1e-5), (np.float64, None, 1e-12), (np.float16, None, 3e-3),
                             (np.int32, None, 0), (np.int64, None, 0), (np.float32, np.float16, 4e-3)]:
        for op in REDUCE:
            if np.dtype(dtype).kind == "i" and op is ReduceOp.AVERAGE:
                continue
            for lane in (0, 1):
                counts = [0, 1, size + 1, 1000]
                arrays = [cupy.asarray(data(rank, n, dtype, i)) for i, n in enumerate(counts)]
                pre, post = (0.5, 2.0) if np.dtype(dtype).kind == "f" and op is not ReduceOp.PRODUCT else (1.0, 1.0)
                nccl.allreduce_(arrays, op, lane=lane, prescale=pre, postscale=post, wire=wire)
                cupy.cuda.get_current_stream().synchronize()
                for i, (n, got) in enumerate(zip(counts, arrays)):
                    stack = np.stack([data(r, n, dtype, i).astype(np.float64) * pre for r in range(size)])
                    want = REDUCE[op](stack, axis=0) * post
                    np.testing.assert_allclose(cupy.asnumpy(got).astype(np.float64), want, rtol=tol, atol=tol,
                                               err_msg=f"{np.dtype(dtype)} wire={wire} {op.name} n={n}")


@spmd.case
def hierarchical_allreduce():
    for n in (0, 1, 7, 1000):
        for op in (ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MAX):
            x = cupy.asarray(data(rank, n, np.float32, 99))
            nccl.hierarchical_allreduce_(x, op)
            want = REDUCE[op](np.stack([data(r, n, np.float32, 99).astype(np.float64) for r in range(size)]), axis=0)
            np.testing.assert_allclose(cupy.asnumpy(x), want, rtol=1e-5, err_msg=f"hierarchical {op.name} n={n}")


@spmd.case
def close():
    nccl.close()


if __name__ == "__main__":
    spmd.main()
