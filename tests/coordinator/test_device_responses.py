"""The coordinator's device path on the CPU: device responses through real negotiation, fusion, lanes and
MPI, with the stream interface's host implementation (lazy streams: a missing wait is a wrong result).
What CUDA itself does is checked on a GPU only (tests/transport/test_gpu_device.py)."""

import pytest

from commlib.coordinator.fusion import fuse
from commlib.coordinator.requests import Kind, Meta, Response
from mpirun import run_mpi


def _allreduce(name, device, nbytes=64):
    return Response(Kind.ALLREDUCE, [Meta(name, Kind.ALLREDUCE, "float32", (nbytes // 4,), device=device)])


def test_device_tensors_fuse_only_with_device_tensors():
    responses = [_allreduce("h0", "cpu"), _allreduce("d0", "cuda"), _allreduce("h1", "cpu"),
                 _allreduce("d1", "cuda"), _allreduce("d2", "cuda")]
    fused = fuse(responses, threshold_bytes=1 << 20, inplace_bytes=1 << 10)
    groups = [[m.name for m in r.metas] for r in fused]
    assert groups == [["h0", "h1"], ["d0", "d1", "d2"]]


def test_the_threshold_bounds_every_byte_of_a_device_group():
    # a host tensor at or above the in-place limit takes no fusion-buffer bytes; a device one is packed whole
    responses = [_allreduce(f"d{i}", "cuda", nbytes=4096) for i in range(4)]
    fused = fuse(responses, threshold_bytes=8192, inplace_bytes=1024)
    assert [[m.name for m in r.metas] for r in fused] == [["d0", "d1"], ["d2", "d3"]]
    host = [_allreduce(f"h{i}", "cpu", nbytes=4096) for i in range(4)]
    assert len(fuse(host, threshold_bytes=8192, inplace_bytes=1024)) == 1


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_device_responses_through_the_coordinator(nprocs):
    run_mpi(nprocs, "device_responses.py", timeout=300)


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs,env", [(2, {"COMMLIB_DEVICE_SEGMENT": "24"}),
                                        (3, {"COMMLIB_DEVICE_SEGMENT": "64", "COMMLIB_NUM_STREAMS": "2"})])
def test_device_segments_and_lanes(nprocs, env):
    run_mpi(nprocs, "device_responses.py", timeout=300, env=env)
