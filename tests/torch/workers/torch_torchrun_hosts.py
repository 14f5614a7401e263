"""Worker for tests/torch/test_torch_work.py::test_torchrun_across_emulated_hosts: one torchrun per emulated
host, no MPI launcher. The backend builds MPI's world from torch's store (its PMI bridge); commlib must see
one node per host, and a large all_reduce must cross the shaped link between them (taking at least most of
the time the link needs for the bytes every allreduce of two ranks sends), giving the sum.

    torchrun --nnodes HOSTS --nproc-per-node 1 ... torch_torchrun_hosts.py HOSTS LINK_MBIT
"""

import sys
import time

import torch
import torch.distributed as dist

import spmd

HOSTS = int(sys.argv[1])
LINK_MBIT = float(sys.argv[2])
ELEMENTS = 1 << 21  # 8 MiB of float32


@spmd.case
def init_process_group():
    dist.init_process_group("commlib")
    import commlib as cl

    assert (cl.size(), cl.cross_size()) == (HOSTS, HOSTS), (cl.size(), cl.cross_size(), cl.local_size())


@spmd.case
def all_reduce_crosses_the_link():
    rank, size = dist.get_rank(), dist.get_world_size()
    warm = torch.ones(16)
    dist.all_reduce(warm)
    t = torch.full((ELEMENTS,), float(rank + 1))
    begin = time.perf_counter()
    dist.all_reduce(t)
    took = time.perf_counter() - begin
    assert torch.all(t == size * (size + 1) / 2), t[:4]
    # every allreduce of two ranks sends each rank's half out of its host at least (reduce-scatter's
    # half and the allgather's half: the tensor's bytes); a tenth of that off the bound is shaping's burst
    bound_s = ELEMENTS * 4 * 8 / (LINK_MBIT * 1e6)
    assert took >= 0.9 * bound_s, f"{took:.3f} s for {ELEMENTS * 4} bytes: under the link's {bound_s:.3f} s"


@spmd.case
def destroy_process_group():
    dist.destroy_process_group()


if __name__ == "__main__":
    spmd.main()
