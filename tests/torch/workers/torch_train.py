"""Worker for tests/torch/test_torch_training.py: unchanged DDP and FSDP2 training on one backend.

    python torch_train.py BACKEND OUT [VARIANT ...]     (under mpiexec or on an emulated cluster)

Each variant is a named case (tests/spmd.py) that trains a small model a few steps from a seeded start on
per-rank data; the case ``save`` writes every variant's final parameters to ``OUT.RANK.pt`` ({variant:
{name: tensor}}), and the test compares commlib's against gloo's.
Variants: ``ddp`` (default init_sync, several buckets), ``no_sync`` (gradient accumulation), ``unused``
(find_unused_parameters, a branch some steps skip), ``static_graph``, ``bucket_view``
(gradient_as_bucket_view), ``fsdp2`` (fully_shard per layer on a DeviceMesh), ``mesh2d`` (a 2-D
DeviceMesh on an even number of ranks: collectives along each dimension; skipped on an odd one).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn

import commlib.torch  # noqa: F401 - registers the backend and the MPI rendezvous (gloo too)
import spmd

backend, out, *variants = sys.argv[1:]
variants = variants or ["ddp", "no_sync", "unused", "static_graph", "bucket_view", "fsdp2"]
torch.set_num_threads(1)
RANK, SIZE = spmd.rank_and_size()
STEPS = 4
results = {}


@spmd.case
def init():
    dist.init_process_group(backend)
    assert (dist.get_rank(), dist.get_world_size()) == (RANK, SIZE)


class Net(nn.Module):
    """Three layers and a branch that ``forward(x, skip=True)`` leaves unused."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 32)
        self.branch = nn.Linear(32, 32)
        self.c = nn.Linear(32, 4)

    def forward(self, x, skip=False):
        h = torch.relu(self.a(x))
        h = torch.relu(self.b(h))
        if not skip:
            h = h + torch.tanh(self.branch(h))
        return self.c(h)


def batch(step: int, micro: int = 0):
    g = torch.Generator().manual_seed(1000 * RANK + 10 * step + micro)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def model(seed_by_rank: bool = True) -> Net:
    torch.manual_seed(RANK if seed_by_rank else 0)  # DDP's init_sync must make rank 0's start everyone's
    return Net()


def train_ddp(variant: str) -> dict:
    net = model()
    kwargs = dict(bucket_cap_mb=0.004)  # ~1000 floats a bucket: several buckets
    if variant == "unused":
        kwargs["find_unused_parameters"] = True
    if variant == "static_graph":
        kwargs["static_graph"] = True
    if variant == "bucket_view":
        kwargs["gradient_as_bucket_view"] = True
    ddp = nn.parallel.DistributedDataParallel(net, **kwargs)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        if variant == "no_sync":
            with ddp.no_sync():
                x, y = batch(step, 1)
                nn.functional.mse_loss(ddp(x), y).backward()
        x, y = batch(step)
        skip = variant == "unused" and step % 2 == 1
        nn.functional.mse_loss(ddp(x, skip=skip), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def train_fsdp2() -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (SIZE,))
    net = model(seed_by_rank=False)
    for layer in (net.a, net.b, net.branch, net.c):
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step)
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return {k: v.full_tensor().detach().clone() for k, v in net.state_dict().items()}


def mesh2d() -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    if SIZE % 2:
        spmd.skip("a 2-D mesh of two rows needs an even number of ranks")
    mesh = init_device_mesh("cpu", (2, SIZE // 2), mesh_dim_names=("rows", "cols"))
    found = {}
    for dim in ("rows", "cols"):
        t = torch.full((3,), float(RANK))
        group = mesh.get_group(dim)
        dist.all_reduce(t, group=group)
        members = dist.get_process_group_ranks(group)
        assert len(members) == (2 if dim == "rows" else SIZE // 2) and RANK in members, (dim, members)
        assert torch.all(t == sum(members)), (dim, members, t)
        found[dim] = t
    return found


def variant_case(name: str, train) -> None:
    def run():
        results[name] = train()
    run.__name__ = name
    spmd.case(run)


for _name in ("ddp", "no_sync", "unused", "static_graph", "bucket_view"):
    variant_case(_name, lambda name=_name: train_ddp(name))
variant_case("fsdp2", train_fsdp2)
variant_case("mesh2d", mesh2d)


@spmd.case
def save():
    torch.save(results, f"{out}.{RANK}.pt")


@spmd.case
def shutdown():
    dist.destroy_process_group()


if __name__ == "__main__":
    spmd.main(["init", *variants, "save", "shutdown"])
