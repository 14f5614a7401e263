"""NCCL's set-up and route, and the NCCL route of the device path, over real MPI with a stand-in NCCL
library and the stream interface's host implementation (no GPU here): tests/transport/workers/
device_nccl_setup.py. The rule itself, in process, is in test_device_streams.py."""

import pytest

from mpirun import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_nccl_setup_and_route_on_one_node(nprocs):
    run_mpi(nprocs, "device_nccl_setup.py", timeout=180)


def test_hierarchical_nccl_on_two_emulated_nodes():
    run_mpi(4, "device_nccl_setup.py", timeout=240, env={"COMMLIB_LOCAL_SIZE": "2"},
            cases=["route_with_a_gpu_per_rank_is_nccl_and_reduces", "a_shared_gpu_means_staged_and_says_why",
                   "no_library_on_one_rank_means_staged_everywhere"])
