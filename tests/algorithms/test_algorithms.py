"""Allreduce algorithms on real MPI jobs: every algorithm x op x dtype x size against numpy, plus codecs,
explicit torus shapes and error cases. One launch per rank count / node shape (see workers/algo_check.py);
run_mpi fails unless every rank passed every case the worker names."""

import pytest

from mpirun import run_mpi

SHAPES = [
    pytest.param(1, None, id="1rank"),
    pytest.param(4, "rr2", id="round-robin-2nodes", marks=pytest.mark.slow),
    pytest.param(2, None, id="2ranks"),
    pytest.param(3, None, id="3ranks"),
    pytest.param(4, None, id="4ranks", marks=pytest.mark.slow),
    pytest.param(4, 2, id="2x2nodes", marks=pytest.mark.slow),
    pytest.param(2, 1, id="2x1nodes"),
    pytest.param(3, 2, id="uneven-2+1"),
    pytest.param(4, 3, id="uneven-3+1", marks=pytest.mark.slow),
]


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs, local_size", SHAPES)
def test_allreduce_algorithms(nprocs, local_size):
    if local_size is None:
        args = []
    elif local_size == "rr2":
        args = ["--round-robin", "2"]  # rank r on node r % 2
    else:
        args = ["--local-size", str(local_size)]
    run_mpi(nprocs, "algo_check.py", *args, timeout=300)  # every case passed on every rank


def test_partition_covers_every_size():
    from commlib.algorithms.partition import offsets, segments

    for count in range(0, 40):
        for parts in range(1, 9):
            offs = offsets(count, parts)
            sizes = [b - a for a, b in zip(offs, offs[1:])]
            assert offs[0] == 0 and offs[-1] == count and len(sizes) == parts
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert segments(5, 5, 4) == [(5, 5)]
    assert segments(0, 10, 4) == [(0, 4), (4, 8), (8, 10)]


def test_topology_blocks_and_uneven_nodes():
    from commlib.topology import Topology

    topo = Topology.blocks(rank=4, size=5, local_size=2)
    assert topo.node_sizes == (2, 2, 1) and not topo.uniform
    assert (topo.cross_rank, topo.cross_size, topo.local_rank, topo.local_size) == (2, 3, 0, 1)
    interleaved = Topology.from_node_ids(3, ["b", "a", "b", "a"])  # round-robin placement
    assert interleaved.node_sizes == (2, 2) and interleaved.cross_rank == 1 and interleaved.local_rank == 1


def test_scratch_pool_reuses_memory():
    import numpy as np

    from commlib.buffers import ScratchPool

    pool = ScratchPool()
    first = pool.get("a", 1000, np.float32)
    held = pool.nbytes
    again = pool.get("a", 500, np.float64)  # same bytes: no growth
    assert pool.nbytes == held and again.ctypes.data == first.ctypes.data
    assert again.ctypes.data % 64 == 0 and again.dtype == np.float64 and again.size == 500
    pool.get("a", 1001, np.float32)
    assert pool.nbytes >= 2 * held - 128  # grown geometrically
    assert pool.get("b", 0, np.int8).size == 0


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_cma_failure_on_one_rank_raises_on_every_rank(nprocs):
    run_mpi(nprocs, "cma_failure.py", timeout=60)


def test_bounded_cache_is_bounded():
    from commlib.cache import BoundedCache

    cache = BoundedCache(3)
    for i in range(10):
        assert cache.put(("t", i), i) == i
        assert cache.get(("t", i)) == i
    assert len(cache) <= 3
    full = BoundedCache(2)
    full.put("a", 1), full.put("b", 2), full.put("b", 3)  # a key it holds: replaced, nothing forgotten
    assert dict(full.items()) == {"a": 1, "b": 3}
