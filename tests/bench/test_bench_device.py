"""commlib-bench --device cuda where it cannot run (no CuPy or no GPU: CI and this machine): every rank
refuses with exit status 2, and rank 0 says which ranks lack what and what to install. Its table runs on
a GPU only (scripts/gpu_check.sh)."""

import importlib.util

import pytest

from commlib.bench.options import parse_options
from mpirun import run_mpi

HAVE_CUPY = importlib.util.find_spec("cupy") is not None


@pytest.mark.mpi
@pytest.mark.skipif(HAVE_CUPY, reason="CuPy is installed here: the refusal needs a machine without it")
def test_device_cuda_refuses_clearly_without_a_gpu():
    out = run_mpi(2, "bench_cli.py", "--device", "cuda", "-b", "1K", "-e", "1K", expect_fail=True, timeout=120)
    assert "commlib-bench: error: --device cuda needs CuPy and a visible CUDA GPU on every rank" in out, out
    assert "rank(s) [0, 1] cannot: CuPy is not installed" in out and "commlib[cuda12]" in out, out
    assert out.count("commlib-bench: error") == 1, "only rank 0 prints the refusal"


def test_device_cuda_options():
    assert parse_options(["--device", "cuda", "-b", "1M"]).device == "cuda"
    assert parse_options([]).device == "cpu"
    for wrong in (["--device", "cuda", "--algo", "ring"], ["-C", "allgather", "--device", "cuda"]):
        with pytest.raises(SystemExit):
            parse_options(wrong)
