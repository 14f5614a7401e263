"""GPU tests: run only where CuPy imports and a CUDA device is visible (``commlib.cuda_built()``); they
skip elsewhere, CI included. scripts/gpu_check.sh runs them on a lent GPU machine. Several ranks share
one GPU (the staged route); NCCL needs a GPU per rank, so only its one-rank case runs on a one-GPU machine."""

import numpy as np
import pytest

import commlib
from mpirun import run_mpi

NO_GPU = "needs CuPy and a visible CUDA GPU (commlib.cuda_built() is False here); run scripts/gpu_check.sh on a GPU machine"
pytestmark = pytest.mark.skipif(not commlib.cuda_built(), reason=NO_GPU)


def test_device_kernels_round_like_the_host():
    import cupy
    import ml_dtypes

    from commlib.transport.device_kernels import DeviceKernels

    kernels = DeviceKernels(cupy)
    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, 1.0, 65504.0, 65520.0, 1e-8, 3.0e38, np.inf, -np.inf, np.nan], np.float32)
    x = np.concatenate([special, rng.standard_normal(100_003).astype(np.float32) * 1000])
    for factor in (1.0, 0.25, 3.0):
        half = cupy.empty(x.size, np.float16)
        kernels.scale_cast(cupy.asarray(x), factor, half)
        np.testing.assert_array_equal(cupy.asnumpy(half), (x * np.float32(factor)).astype(np.float16))
        bits = cupy.empty(x.size, np.uint16)
        kernels.scale_cast(cupy.asarray(x), factor, bits)
        want = (x * np.float32(factor)).astype(ml_dtypes.bfloat16)
        got = cupy.asnumpy(bits).view(ml_dtypes.bfloat16)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])
        back = cupy.empty(x.size, np.float32)
        kernels.scale_cast(bits, factor, back)
        np.testing.assert_array_equal(cupy.asnumpy(back), got.astype(np.float32) * np.float32(factor))
        wide = cupy.empty(x.size, np.float64)
        kernels.scale_cast(cupy.asarray(x), factor, wide)
        np.testing.assert_array_equal(cupy.asnumpy(wide), x.astype(np.float64) * factor)


def test_placement_of_real_device_arrays():
    import cupy
    import torch

    from commlib import device

    assert device.placement(cupy.zeros(3)) == ("cuda", 0)
    assert device.placement(torch.zeros(3, device="cuda")) == ("cuda", 0)
    assert device.placement(torch.zeros(3, device="cuda", dtype=torch.bfloat16)) == ("cuda", 0)
    view = device.as_cupy(torch.arange(4.0, device="cuda"))
    assert int(view.data.ptr) != 0 and cupy.asnumpy(view).tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_device_path_on_cuda(nprocs):
    run_mpi(nprocs, "gpu_device_path.py", timeout=600)


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_collectives_on_cupy_and_torch_cuda(nprocs):
    run_mpi(nprocs, "gpu_collectives.py", timeout=600)


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2])
def test_torch_cuda_distributed_optimizer_trains_like_one_process(nprocs):
    run_mpi(nprocs, "gpu_torch_optimizer.py", timeout=600)
