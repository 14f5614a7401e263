"""The GPU paths' parts that run without a GPU, on real MPI jobs and real torch: where a tensor lives,
device agreement between ranks and the missing-CuPy error (the device path itself, on host streams:
tests/coordinator/test_device_responses.py).
Nothing here runs CUDA code (see test_gpu_device.py for that)."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from commlib import device
from mpirun import run_mpi

HAVE_CUPY = importlib.util.find_spec("cupy") is not None


def test_import_commlib_loads_neither_cupy_nor_torch():
    code = "import sys, commlib; commlib.cuda_built(); print(sorted({'cupy', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    want = "['cupy']" if HAVE_CUPY else "[]"   # cuda_built() itself imports CuPy where it is installed
    assert out.strip() == want


class Declares:
    """An object offering only the protocols (nothing is allocated; placement never reads memory)."""

    def __init__(self, dlpack=None, cuda=None):
        if dlpack is not None:
            self.__dlpack_device__ = lambda: dlpack
        if cuda is not None:
            self.__cuda_array_interface__ = cuda


def test_placement_reads_the_protocols():
    assert device.placement(np.zeros(3)) == ("cpu", 0)
    assert device.placement([1.0, 2.0]) == ("cpu", 0)
    assert device.placement(Declares(dlpack=(2, 1))) == ("cuda", 1)
    assert device.placement(Declares(dlpack=(3, 0))) == ("cpu", 0)          # CUDA pinned host memory
    assert device.placement(Declares(cuda={"shape": (2,), "typestr": "<f4", "data": (0, False),
                                           "version": 3})) == ("cuda", -1)
    with pytest.raises(device.DeviceSupportError, match="DLPack device type 4"):
        device.placement(Declares(dlpack=(4, 0)))
    assert not device.on_device(np.zeros(2)) and device.on_device(Declares(dlpack=(2, 0)))


def test_placement_of_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    assert device.placement(torch.zeros(3)) == ("cpu", 0)
    assert device.placement(torch.zeros(3, dtype=torch.bfloat16)) == ("cpu", 0)
    assert device.declared_layout(torch.zeros((2, 3), dtype=torch.bfloat16)) == (np.dtype("bfloat16"), (2, 3))


@pytest.mark.skipif(HAVE_CUPY, reason="CuPy is installed here: the missing-CuPy path cannot be reached")
def test_without_cupy_the_gpu_queries_say_no_and_staging_says_what_to_install():
    import commlib

    assert commlib.cuda_built() is False and commlib.nccl_built() == 0
    with pytest.raises(device.DeviceSupportError, match=r"commlib\[cuda12\]"):
        device.cupy_module()
    staged = device.Staged(Declares(dlpack=(2, 0), cuda={"shape": (4,), "typestr": "<f2", "data": (0, False),
                                                          "version": 3}), "grad")
    assert "grad" in staged.error and "cuda:0" in staged.error and "commlib[cuda13]" in staged.error
    assert staged.host.dtype == np.float16 and staged.host.shape == (4,)


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_ranks_must_agree_on_the_device(nprocs):
    run_mpi(nprocs, "gpu_device_agreement.py", "metadata", timeout=120, cases=["metadata", "still_usable"])


@pytest.mark.mpi
@pytest.mark.skipif(HAVE_CUPY, reason="CuPy is installed here: the missing-CuPy path cannot be reached")
def test_a_gpu_tensor_without_cupy_fails_on_every_rank():
    run_mpi(2, "gpu_device_agreement.py", "no_cupy", timeout=120, cases=["no_cupy", "still_usable"])


@pytest.mark.mpi
def test_a_tensor_on_an_unsupported_device_fails_on_every_rank():
    run_mpi(2, "gpu_device_agreement.py", "unsupported_device", timeout=120,
            cases=["unsupported_device", "still_usable"])
