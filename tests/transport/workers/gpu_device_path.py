"""Worker (GPU only): the coordinator's device path on real CUDA, CuPy and torch, on 1-3 ranks sharing
one GPU (or a GPU each). tests/transport/test_gpu_device.py runs it; scripts/gpu_check.sh runs that.

- the batched pack/unpack kernels against the single-tensor kernels, bit for bit;
- fused CuPy allreduces (many tensors, sizes 0, 1, fewer than ranks, not divisible) against numpy;
- a torch tensor produced on a side stream, submitted and consumed there without any synchronize;
- prescale and postscale as Horovod's CUDA tests expect them (bit for bit on up to 3 ranks);
- fp16 and bf16 compression of float32 tensors;
- NCCL on one rank through the device path (``algorithm="nccl"``), where NCCL loads;
- a grouped call mixing CPU and CUDA tensors refused.
"""

from __future__ import annotations

import contextlib
import numpy as np

import commlib as cl
import spmd

rank, size = spmd.rank_and_size()
SIZES = [0, 1, 2, 3, 5, 17, 1000, 300_001]


@spmd.case
def init():
    import cupy
    import torch

    cl.init()
    device = cl.local_rank() % cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(device).use()
    torch.cuda.set_device(device)


@spmd.case
def batched_kernels_match_the_single_tensor_kernels():
    import cupy

    from commlib.transport.device_kernels import DeviceKernels

    kernels = DeviceKernels(cupy)
    rng = np.random.default_rng(rank)
    for source, target, factor in ((np.float32, np.float32, 0.37), (np.float32, np.float16, 0.25),
                                   (np.float32, np.uint16, 3.0), (np.float16, np.float16, 0.5),
                                   (np.float64, np.float64, 1.0 / 3), (np.int32, np.int32, 0.7),
                                   (np.uint16, np.float32, 2.0), (np.float32, np.float32, 1.0)):
        arrays = [cupy.asarray((rng.standard_normal(n) * 100).astype(source)) for n in (0, 7, 1, 300, 0, 33)]
        if source == np.uint16:
            arrays = [cupy.asarray(rng.integers(0x3f00, 0x4100, a.size).astype(np.uint16)) for a in arrays]
        total = sum(a.size for a in arrays)
        fused, single = cupy.empty(total, target), cupy.empty(total, target)
        kernels.pack(arrays, factor, fused)
        offset = 0
        for a in arrays:
            kernels.scale_cast(a, factor, single[offset:offset + a.size])
            offset += a.size
        assert cupy.asnumpy(fused).tobytes() == cupy.asnumpy(single).tobytes(), f"pack {source}->{target}"
        back = [cupy.empty(a.size, source) for a in arrays]
        kernels.unpack(fused, 1.0 / factor, back)
        offset = 0
        for a, b in zip(arrays, back):
            want = cupy.empty(a.size, source)
            kernels.scale_cast(fused[offset:offset + a.size], 1.0 / factor, want)
            assert cupy.asnumpy(b).tobytes() == cupy.asnumpy(want).tobytes(), f"unpack {target}->{source}"
            offset += a.size


@spmd.case
def fused_cupy_allreduces_match_numpy():
    import cupy

    for op in (cl.Sum, cl.Average, cl.Max):
        arrays = [cupy.asarray(np.arange(n, dtype=np.float32) + rank) for n in SIZES]
        handles = [cl.allreduce_async_(a, op=op, name=f"fused.{op.name}.{i}") for i, a in enumerate(arrays)]
        for n, a, h in zip(SIZES, arrays, handles):
            assert cl.synchronize(h) is a
            every = np.stack([np.arange(n, dtype=np.float64) + r for r in range(size)])
            want = {cl.Sum: every.sum(0), cl.Average: every.mean(0), cl.Max: every.max(0)}[op]
            np.testing.assert_allclose(cupy.asnumpy(a), want, rtol=1e-6)


@spmd.case
def torch_side_stream_without_synchronize():
    import torch

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        big = torch.randn(2048, 2048, device="cuda")
        for _ in range(20):  # keeps the side stream busy, so a read that does not wait for it reads garbage
            big = big @ big / 2048
        x = torch.full((1 << 20,), float(rank + 1), device="cuda") + big[0, 0] * 0
        out = cl.allreduce(x, op=cl.Sum, name="side")        # submitted and consumed on the side stream
        check = (out == size * (size + 1) / 2).all()
    assert bool(check.cpu()), "the result was read before it was there, or the input before it was written"


@spmd.case
def prescale_and_postscale_as_horovod_cuda():
    import torch

    dtypes = [torch.int32, torch.int64, torch.float32, torch.float64, torch.float16]
    for dtype in dtypes:
        for where in ("prescale_factor", "postscale_factor"):
            torch.manual_seed(1234)
            factor = float(np.random.default_rng(7).uniform())
            tensor = torch.FloatTensor(17, 17).random_(-100, 100).to(dtype).cuda()
            got = cl.allreduce(tensor, op=cl.Sum, name=f"{where}.{dtype}", **{where: factor})
            wide = torch.float64 if dtype in (torch.int32, torch.int64) else dtype
            f = torch.tensor(factor, dtype=torch.float64, device="cuda").to(wide)
            t = tensor.to(wide)
            want = ((f * t).to(dtype) * size) if where == "prescale_factor" else ((size * t) * f).to(dtype)
            assert torch.equal(got, want), f"{where} {dtype}: {got.flatten()[:4]} != {want.flatten()[:4]}"


@spmd.case
def compression_on_the_device():
    import torch

    for compression in (cl.Compression.fp16, cl.Compression.bf16):
        x = torch.full((10_000,), float(rank + 1), device="cuda")
        got = cl.allreduce(x, op=cl.Average, name=f"wire.{compression.name}", compression=compression)
        assert torch.allclose(got, torch.full_like(x, (size + 1) / 2), rtol=1e-2)


@spmd.case
def nccl_on_one_rank_through_the_device_path():
    import cupy

    if size != 1:
        spmd.skip("NCCL needs a GPU per rank; the lent machines have one")
    if not cl.nccl_built():
        spmd.skip("CuPy cannot load NCCL here (commlib.nccl_built() is 0)")
    from mpi4py import MPI

    from commlib.config import Config
    from commlib.coordinator.device_path import DevicePath
    from commlib.coordinator.requests import Entry, Handle, Kind, Meta, Response
    from commlib.device import DeviceTensor
    from commlib.engine import Engine
    from commlib.topology import Topology
    from commlib.transport.mpi import MPITransport
    from commlib.transport.streams import cuda_streams

    engine = Engine(MPITransport.duplicate(MPI.COMM_WORLD), Topology.detect(MPI.COMM_WORLD), Config.load())
    streams = cuda_streams(cupy.cuda.runtime.getDevice())
    path = DevicePath(engine, 4 << 20)
    path.bind(streams)
    assert path.decide_route()[0] == "nccl", path.route
    arrays = [cupy.arange(n, dtype=cupy.float32) for n in (5, 0, 1000)]
    tensors = [DeviceTensor.submitted(a, streams) for a in arrays]
    metas = [Meta(f"n{i}", Kind.ALLREDUCE, "float32", t.shape, int(cl.Sum), algorithm="nccl", device="cuda")
             for i, t in enumerate(tensors)]
    how = path.allreduce(Response(Kind.ALLREDUCE, metas), [Entry(m, t, t, Handle(m.name)) for m, t in
                                                           zip(metas, tensors)], lambda *a, **k: contextlib.nullcontext())
    assert how == "nccl"
    streams.synchronize(tensors[0].done)
    for a in arrays:
        assert np.array_equal(cupy.asnumpy(a), np.arange(a.size, dtype=np.float32))
    got = cl.allreduce(cupy.arange(7, dtype=cupy.float32), op=cl.Sum, name="nccl.api", algorithm="nccl")
    assert np.array_equal(cupy.asnumpy(got), np.arange(7, dtype=np.float32))
    path.close()
    engine.close()



@spmd.case
def grouped_cpu_and_cuda_refused():
    import torch

    import commlib.torch as hvd

    try:
        hvd.grouped_allreduce([torch.zeros(3), torch.zeros(3, device="cuda")])
    except RuntimeError as exc:
        assert "one kind of device" in str(exc), exc
    else:
        raise AssertionError("a grouped allreduce of a CPU and a CUDA tensor was not refused")


@spmd.case
def shutdown():
    cl.shutdown()


if __name__ == "__main__":
    spmd.main()
