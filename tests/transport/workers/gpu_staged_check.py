"""Worker: the host-staged allreduce pipeline (commlib.transport.staged) with HostOps on a real Engine,
against numpy: several arrays fused, segments smaller than the buffer, sizes 0/1/fewer than ranks/not
divisible, Sum/Average/Min/Max, pre/postscale, float16 and bfloat16 wires. ``--ops cuda`` runs the same
checks on CuPy arrays with CudaOps (streams, events, kernels): tests/transport/test_gpu_device.py, on a GPU only.

    mpiexec -n P python gpu_staged_check.py [--ops host|cuda]
"""

from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

from commlib.config import Config
from commlib.dtypes import BFLOAT16, FLOAT16
from commlib.engine import Engine
from commlib.errors import CommlibError
from commlib.ops import ReduceOp
from commlib.topology import Topology
from commlib.transport.mpi import MPITransport
from commlib.transport.staged import CudaOps, HostOps, StagedAllreduce, segments
import spmd
from spmd import expect_error

SIZES = [0, 1, 2, 3, 5, 17, 300]
REDUCE = {ReduceOp.SUM: np.sum, ReduceOp.AVERAGE: np.mean, ReduceOp.MIN: np.min, ReduceOp.MAX: np.max}


def data(rank, count, dtype, salt):
    rng = np.random.default_rng([rank, salt, count])
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-4, 5, count).astype(dtype)
    return rng.uniform(0.5, 1.5, count).astype(dtype)


parser = argparse.ArgumentParser()
parser.add_argument("--ops", choices=("host", "cuda"), default="host")
args = parser.parse_args()
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
engine = Engine(MPITransport.duplicate(comm), Topology.detect(comm), Config.load())
if args.ops == "cuda":
    import cupy
    ops = CudaOps(cupy)
    to_device, to_host = cupy.asarray, cupy.asnumpy
else:
    ops = HostOps()
    to_device = to_host = lambda a: a  # noqa: E731


@spmd.case
def every_dtype_wire_op_and_size():
    for segment_bytes in (24, 1 << 20):
        staged = StagedAllreduce(ops, engine.allreduce_, size, segment_bytes)
        for dtype, wire, rel in [(np.float32, None, 1e-6), (np.float64, None, 1e-12), (np.float16, None, 2e-3),
                                 (np.int32, None, 0), (np.float32, FLOAT16, 4e-3), (np.float32, BFLOAT16, 3e-2)]:
            reductions = [ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX] if np.dtype(dtype).kind == "i" else list(REDUCE)
            for op in reductions:
                for salt, counts in enumerate([[c] for c in SIZES] + [[3, 0, 7, 1], [size - 1, 5]]):
                    floating = np.dtype(dtype).kind == "f"
                    pre, post = (0.5, 3.0) if floating and salt % 2 else (1.0, 1.0)
                    arrays = [to_device(data(rank, c, dtype, salt * 10 + i)) for i, c in enumerate(counts)]
                    everyone = [[data(r, c, dtype, salt * 10 + i) for i, c in enumerate(counts)] for r in range(size)]
                    staged.allreduce_(arrays, op, prescale=pre, postscale=post, wire=wire)
                    for i, got in enumerate(map(to_host, arrays)):
                        stack = np.stack([e[i].astype(np.float64) * pre for e in everyone])
                        want = REDUCE[op](stack, axis=0) * post if counts[i] else np.zeros(0)
                        what = f"{np.dtype(dtype)} wire={wire} op={op.name} counts={counts} seg={segment_bytes}"
                        assert got.dtype == np.dtype(dtype) and got.shape == (counts[i],), what
                        if rel:
                            np.testing.assert_allclose(got.astype(np.float64), want, rtol=rel, atol=rel, err_msg=what)
                        else:
                            np.testing.assert_array_equal(got, want.astype(dtype), err_msg=what)


@spmd.case
def errors_and_segments():
    staged = StagedAllreduce(ops, engine.allreduce_, size)
    zeros = lambda dtype: to_device(np.zeros(2, dtype))  # noqa: E731
    expect_error(CommlibError, "share a dtype", lambda: staged.allreduce_([zeros(np.float32), zeros(np.float64)]),
                 "mixed dtypes")
    expect_error(CommlibError, "needs float32", lambda: staged.allreduce_([zeros(np.float64)], wire=FLOAT16),
                 "f64 wire")
    expect_error(CommlibError, "floating dtype", lambda: staged.allreduce_([zeros(np.int32)]), "int average")
    assert segments(0, 4, 8) == [] and segments(5, 4, 8) == [(0, 2), (2, 4), (4, 5)]
    assert segments(3, 8, 1) == [(0, 1), (1, 2), (2, 3)]


@spmd.case
def close():
    engine.close()


if __name__ == "__main__":
    spmd.main()
