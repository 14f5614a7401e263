"""commlib across emulated hosts (commlib.testing.cluster): every allreduce algorithm, the other
collectives, the coordinator and the torch plug-in on 2 hosts x 2 ranks, 3 hosts x 1 rank and 2 + 1 ranks.

Links are unshaped here (correctness does not need a rate); the shaping itself is checked once, by timing
a transfer between hosts against the link rate. Each job first checks, in workers/on_cluster.py, that
commlib's node layout from MPI matches the hosts (COMMLIB_LOCAL_SIZE is never set).
"""

import os

import pytest

from mpirun import run_on_cluster

SHAPES = [pytest.param([2, 2], id="2x2"), pytest.param([1, 1, 1], id="3x1"), pytest.param([2, 1], id="2+1")]


@pytest.fixture(scope="module", params=SHAPES)
def cluster(request, make_cluster):
    made = make_cluster(request.param)
    yield made
    made.down()  # as soon as this shape's tests are done; make_cluster checks at the end that all is gone


@pytest.mark.cluster
def test_allreduce_algorithms(cluster):
    """native, ring, recursive_doubling, rabenseifner, hierarchical, torus2d and auto, with and without
    fp16 on the wire, against numpy; cma must refuse to run across hosts (workers/cluster_check.py)."""
    run_on_cluster(cluster, "cluster_check.py", "allreduce", timeout=300, cases=["every_algorithm_across_hosts"])


@pytest.mark.cluster
def test_coordinator_collectives(cluster):
    """allreduce, allgather, broadcast, reducescatter, alltoall through the coordinator, tensors submitted
    in a different order on every rank (tests/coordinator/workers/coord_collectives.py)."""
    run_on_cluster(cluster, "coord_collectives.py", timeout=300)


@pytest.mark.cluster
@pytest.mark.parametrize("case", ["shape"])
def test_mismatch_errors_name_the_tensor(cluster, case):
    run_on_cluster(cluster, "coord_errors.py", case, timeout=120, cases=[case, "still_usable"])


@pytest.mark.cluster
def test_init_after_shutdown_hears_nothing_of_the_previous_cycle(cluster):
    """Across hosts the last control messages of an init/shutdown cycle could still be in flight when its
    communicator is freed, and reach the next cycle (MPI reuses context ids): "rank 2 shut down" after a
    new init().
    The coordinator's goodbyes at shutdown prevent it (docs/coordinator.md)."""
    run_on_cluster(cluster, "cluster_check.py", "reinit", "15", timeout=180, cases=["init_after_shutdown_cycles"])


@pytest.mark.cluster
def test_compressors_across_hosts(cluster):
    """top-k, random-k, one-bit, DGC and PowerSGD with their invariants (error feedback, every rank decoding
    the same bits, dense equivalence) across hosts (tests/compression/workers/compression_check.py)."""
    run_on_cluster(cluster, "compression_check.py", timeout=300)


@pytest.mark.cluster
def test_torch_optimizer_matches_single_process(cluster):
    run_on_cluster(cluster, "cluster_check.py", "torch", timeout=300, cases=["torch_optimizer_matches_one_process"])


@pytest.mark.cluster
def test_shaped_link_limits_transfers(make_cluster):
    """64 MiB from host 0 to host 1 over 1 Gbit/s links: never faster than the link (the bytes crossed
    the shaped veths, not shared memory). How close to the link it comes depends on the machine's load and
    is not asserted (the rate is printed)."""
    cluster = make_cluster([1, 1], rate="1gbit")
    report = cluster.probe(nbytes=64 << 20)  # raises if faster than the link
    print(f"{report['mbit_s']:.0f} Mbit/s over a 1 Gbit/s link")


@pytest.mark.cluster
def test_per_host_rates_shape_each_host_alone(make_cluster):
    """rate as a list: host 0's link at 250 Mbit/s, host 1's unshaped; 16 MiB from host 0 to host 1 moves
    no faster than host 0's rate; a list of the wrong length is refused."""
    from commlib.testing.cluster import Cluster

    with pytest.raises(ValueError, match="one per host"):
        Cluster([1, 1], rate=["1gbit"])
    cluster = make_cluster([1, 1], rate=["250mbit", None])
    report = cluster.probe(nbytes=16 << 20)  # raises if faster than 250 Mbit/s
    print(f"{report['mbit_s']:.0f} Mbit/s over a 250 Mbit/s link")


@pytest.mark.cluster
def test_down_removes_the_shared_memory_of_a_killed_job(make_cluster):
    """2 ranks on one emulated host meet over MPICH's shared memory, then both are killed (SIGKILL): their
    segments stay under /dev/shm, which no process maps any more; taking the cluster down removes them."""
    import sys

    from commlib.testing.cluster import shm_files

    cluster = make_cluster([2])
    before = shm_files()
    killed = ("from mpi4py import MPI; import os, signal; MPI.COMM_WORLD.Barrier(); "
              "os.kill(os.getpid(), signal.SIGKILL)")
    cluster.mpiexec([sys.executable, "-c", killed], timeout=60, check=False)
    left = shm_files() - before
    assert left, "the killed job left no shared memory: nothing to check here"
    cluster.down()
    assert not (left & shm_files()), sorted(map(str, left & shm_files()))


def test_missing_prerequisites_are_named(monkeypatch, tmp_path):
    """Without root and without the tools, up() says what is missing (nothing is created)."""
    from commlib.testing.cluster import Cluster, ClusterUnavailable

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no ip, tc or unshare
    with pytest.raises(ClusterUnavailable) as error:
        Cluster([1, 1], rate="1gbit").up()
    for what in ("root", "`ip`", "`tc`", "`unshare`"):
        assert what in str(error.value), str(error.value)


def test_only_hydra_is_accepted(tmp_path):
    from commlib.testing.cluster import ClusterUnavailable, check_hydra

    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho 'mpiexec (OpenRTE) 4.1.4'\n")
    fake.chmod(0o755)
    with pytest.raises(ClusterUnavailable, match="not MPICH's hydra"):
        check_hydra(str(fake))
