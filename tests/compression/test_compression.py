"""Lossy compression: the C kernels against numpy in this process, then every compressor, the Horovod
compressor interface and LocalSGD on real MPI jobs of 1-4 ranks (tests/compression/workers/compression_check.py and
torch_compression.py assert the invariants on every rank)."""

import numpy as np
import pytest

from commlib.compression import Compression, ErrorFeedback, TopK, kernels
from commlib.compression.base import Exchange
from mpirun import run_mpi


def reference_topk(x, k):
    magnitude = np.where(np.isnan(x), np.inf, np.abs(x))
    return np.sort(np.argsort(-magnitude, kind="stable")[:k]).astype(np.int32)


@pytest.mark.parametrize("n", [0, 1, 7, 1000, 70000, 300001])
def test_topk_kernel_matches_numpy(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    for k in sorted({0, 1, n // 1000, n // 100, n // 3, n} - {-1}):
        if 0 <= k <= n:
            assert np.array_equal(kernels.topk(x, k), reference_topk(x, k)), (n, k)


@pytest.mark.parametrize("shape", ["sorted", "sparse", "periodic"])
def test_topk_kernel_when_the_sample_misleads(shape):
    """Inputs where a strided sample guesses the threshold badly (the kernel must fall back, still exact)."""
    n = 200000
    x = {"sorted": np.linspace(-1, 1, n), "sparse": np.where(np.arange(n) % 997 == 5, 1.0, 0.0),
         "periodic": np.where(np.arange(n) % 64 == 0, 0.0, np.arange(n) % 13)}[shape].astype(np.float32)
    for k in (100, 2000, 10000):
        assert np.array_equal(kernels.topk(x, k), reference_topk(x, k)), (shape, k)


def test_topk_kernel_ties_nan_and_errors():
    x = np.array([1, -3, 3, 0, np.nan, -3, 2], np.float32)
    assert kernels.topk(x, 2).tolist() == [1, 4]          # NaN first, then the lower of the tied 3s
    assert kernels.topk(x, 4).tolist() == [1, 2, 4, 5]
    ties = np.ones(100000, np.float32)
    assert np.array_equal(kernels.topk(ties, 50), np.arange(50))
    with pytest.raises(ValueError, match="outside"):
        kernels.topk(x, 8)
    with pytest.raises(TypeError, match="float32"):
        kernels.topk(x.astype(np.float64), 1)


def test_scatter_add_kernel_matches_numpy():
    rng = np.random.default_rng(1)
    dst = rng.standard_normal(5000).astype(np.float32)
    idx = rng.integers(0, 5000, 20000).astype(np.int32)  # duplicates add up, in order
    val = rng.standard_normal(20000).astype(np.float32)
    ref = dst.copy()
    np.add.at(ref, idx, val)
    kernels.scatter_add(dst, idx, val)
    assert np.array_equal(dst, ref)
    with pytest.raises(IndexError, match="outside"):
        kernels.scatter_add(dst, np.array([5000], np.int32), np.ones(1, np.float32))
    with pytest.raises(ValueError, match="indices"):
        kernels.scatter_add(dst, np.array([1, 2], np.int32), np.ones(1, np.float32))


def test_momentum_accumulate_kernel_matches_numpy():
    rng = np.random.default_rng(3)
    u, v, g = (rng.standard_normal(10001).astype(np.float32) for _ in range(3))
    ref_u = np.float32(0.9) * u + g
    ref_v = v + ref_u
    kernels.momentum_accumulate(u, v, g, 0.9)
    assert np.array_equal(u, ref_u) and np.array_equal(v, ref_v)
    with pytest.raises(ValueError, match="sizes differ"):
        kernels.momentum_accumulate(u, v[:5], g, 0.9)


class _Local(Exchange):
    """One rank's exchange without MPI: the sum over one rank is the value itself."""

    def __init__(self):
        super().__init__(1, 0)

    def allreduce(self, array, name):
        return array

    def allgather(self, array, name):
        return array

    @staticmethod
    def wait(handle):
        return handle


def test_error_feedback_keeps_what_was_not_sent():
    comp = ErrorFeedback(TopK(0.1, min_elements=0))
    rng = np.random.default_rng(2)
    fed, sent = np.zeros(500), np.zeros(500)
    for _ in range(10):
        g = rng.standard_normal(500).astype(np.float32)
        fed += g
        buf = g.copy()
        comp.start("w", buf, _Local())()
        sent += buf
    assert np.allclose(sent + comp.state["w"]["residual"], fed, atol=1e-5)
    comp.reset()
    assert comp.state == {} and comp.inner.state == {}


def test_constructor_errors_are_clear():
    with pytest.raises(ValueError, match="ratio"):
        Compression.topk(0)
    with pytest.raises(ValueError, match="sparsity"):
        Compression.dgc(sparsity=(1.5,))
    with pytest.raises(ValueError, match="rank"):
        Compression.powersgd(rank=0)
    with pytest.raises(TypeError, match="encoder"):
        Compression.error_feedback(Compression.powersgd())


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_compressors_on_ranks(nprocs):
    run_mpi(nprocs, "compression_check.py", timeout=300)


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_torch_compression_and_localsgd(nprocs):
    pytest.importorskip("torch")
    env = {"PYTHONWARNINGS": "ignore::DeprecationWarning,ignore::UserWarning"}
    run_mpi(nprocs, "torch_compression.py", timeout=300, env=env,
            cases=["hierarchical_averager_groups"] if nprocs % 2 == 0 else ())
