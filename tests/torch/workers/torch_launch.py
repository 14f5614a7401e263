"""Worker for tests/torch/test_torch_work.py: ``init_process_group("commlib")`` as a plain script would call
it, under whatever launched it (mpiexec, torchrun; with summation servers as further ranks of the job: give
their number), and one collective of each kind, as named cases.

    python torch_launch.py [SERVERS]
"""

import sys

import torch
import torch.distributed as dist

import spmd


@spmd.case
def init_process_group():
    dist.init_process_group("commlib")  # known without importing commlib: torch's backend entry point
    assert dist.get_backend() == "commlib", dist.get_backend()
    rank, size = spmd.rank_and_size()
    servers = int(sys.argv[1]) if len(sys.argv) > 1 else 0  # the job's last ranks: not torch ranks
    assert (dist.get_rank(), dist.get_world_size()) == (rank, size - servers)


@spmd.case
def all_reduce():
    rank, size = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.all(t == size * (size + 1) / 2), t


@spmd.case
def all_gather():
    outs = [torch.empty(2) for _ in range(dist.get_world_size())]
    dist.all_gather(outs, torch.full((2,), float(dist.get_rank())))
    assert [o[0].item() for o in outs] == list(range(dist.get_world_size())), outs


@spmd.case
def broadcast_object_list():
    box = [{"from": 0} if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    assert box[0] == {"from": 0}


@spmd.case
def destroy_process_group():
    dist.destroy_process_group()


if __name__ == "__main__":
    spmd.main()
