"""What commlib.torch added for Horovod compatibility (tests/torch/workers/torch_horovod.py on 1-4 ranks), and
Adasum's combination rule checked by hand (no MPI)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mpirun import run_mpi  # noqa: E402

from commlib import adasum  # noqa: E402

WORKER_PATH = {"PYTHONWARNINGS": "ignore::DeprecationWarning"}


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, pytest.param(3, marks=pytest.mark.full), 4])
def test_grouped_adasum_sparse_sync_batch_norm_and_horovod_semantics(nprocs):
    run_mpi(nprocs, "torch_horovod.py", timeout=300, env=WORKER_PATH)


def test_adasum_pair_follows_horovods_formula():
    a, b = np.array([1.0, 2.0, 0.0]), np.array([3.0, -1.0, 2.0])
    dot = 1.0  # 3 - 2 + 0
    expected = (1 - dot / (2 * 5.0)) * a + (1 - dot / (2 * 14.0)) * b
    assert np.allclose(adasum.combine(a, b), expected)
    assert np.allclose(adasum.combine(a, np.zeros(3)), a)  # a zero vector keeps coefficient 1 and adds nothing
    assert np.allclose(adasum.combine(a, a), a)  # identical vectors average
    assert np.allclose(adasum.combine(np.array([1.0, 0]), np.array([0, 2.0])), [1.0, 2.0])  # orthogonal: sum


def test_adasum_order_powers_of_two_and_the_others():
    g = [np.random.default_rng(i).standard_normal(6) for i in range(7)]
    c = adasum.combine
    assert np.array_equal(adasum.reduce(g[:1]), g[0])
    assert np.allclose(adasum.reduce(g[:2]), c(g[0], g[1]))
    assert np.allclose(adasum.reduce(g[:3]), c(c(g[0], g[2]), g[1]))
    assert np.allclose(adasum.reduce(g[:4]), c(c(g[0], g[1]), c(g[2], g[3])))
    assert np.allclose(adasum.reduce(g[:7]),
                       c(c(c(g[0], g[4]), c(g[1], g[5])), c(c(g[2], g[6]), g[3])))
    assert adasum.reduce([x.astype(np.float32) for x in g[:3]]).dtype == np.float32


def test_horovod_import_paths_exist():
    """The modules a Horovod script imports directly (horovod.torch.mpi_ops, horovod.common.util)."""
    import os

    from commlib.torch import mpi_ops, util

    assert mpi_ops.synchronize is not None and mpi_ops.allreduce_async_ is not None
    assert util.mpi_built() and not util.gloo_built()
    assert util.split_list(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert util.split_list([], 2) == [[], []]
    assert util.num_rank_is_power_2(4) and not util.num_rank_is_power_2(6) and not util.num_rank_is_power_2(0)
    assert util.is_version_greater_equal_than("2.13.0+cpu", "2.13") and not util.is_version_greater_equal_than("1.4", "1.10")
    assert util.is_iterable([1]) and not util.is_iterable(3)
    os.environ.pop("COMMLIB_TEST_ENV_A", None)
    os.environ["COMMLIB_TEST_ENV_B"] = "before"
    try:
        with pytest.raises(RuntimeError):
            with util.env(COMMLIB_TEST_ENV_A="1", COMMLIB_TEST_ENV_B="2", COMMLIB_TEST_ENV_C=None):
                assert os.environ["COMMLIB_TEST_ENV_A"] == "1" and os.environ["COMMLIB_TEST_ENV_B"] == "2"
                assert "COMMLIB_TEST_ENV_C" not in os.environ
                raise RuntimeError
        assert "COMMLIB_TEST_ENV_A" not in os.environ and os.environ["COMMLIB_TEST_ENV_B"] == "before"
    finally:
        os.environ.pop("COMMLIB_TEST_ENV_B", None)
