"""Run a fixed mix of fused, in-place, compressed and mixed-dtype allreduces and save every result
(argv[1]/rank{r}.npz), so runs under different settings (lanes, fusion) can be compared."""

import sys

import ml_dtypes
import numpy as np

import commlib as cl
import spmd


@spmd.case
def init():
    cl.init()


@spmd.case
def the_mix_completes_and_is_saved():
    rank = cl.rank()
    rng = np.random.default_rng(rank)
    tensors = []
    for i in range(120):
        dtype = [np.float32, np.float64, ml_dtypes.bfloat16, np.float16, np.int32][i % 5]
        count = [1, 17, 1000, 70000, 300000][i % 5 if i % 7 else 4]
        tensors.append((rng.uniform(-1, 1, count) * 100).astype(dtype))
    handles = []
    for i, t in enumerate(tensors):
        op = cl.Sum if t.dtype.kind == "i" else cl.Average
        comp = cl.Compression.fp16 if (t.dtype == np.float32 and i % 3 == 0) else None
        handles.append(cl.allreduce_async_(t, op=op, name=f"t{i}", compression=comp))
    for h in handles:
        cl.synchronize(h)
    np.savez(f"{sys.argv[1]}/rank{rank}.npz", *[t.view(np.uint16) if t.dtype == ml_dtypes.bfloat16 else t
                                                for t in tensors])


@spmd.case
def shutdown():
    cl.shutdown()


if __name__ == "__main__":
    spmd.main()
