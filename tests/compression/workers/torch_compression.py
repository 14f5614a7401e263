"""commlib.torch with compressors and LocalSGD on N ranks: Horovod's compressor interface, lossy
compressors in DistributedOptimizer (state per name, surviving a new optimizer), LocalSGD with period 1
equal to synchronous training, and the hierarchical averager's groups. Named cases on every rank."""

from __future__ import annotations

import numpy as np
import torch

import commlib as cl
import commlib.torch as hvd
from torch_common import close
import spmd


class TorchHalf:
    """A user-written Horovod compressor: two static methods on torch tensors."""

    @staticmethod
    def compress(tensor):
        return (tensor.to(torch.float16), tensor.dtype) if tensor.is_floating_point() else (tensor, None)

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))


def data(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 40, generator=g), torch.randn(8, 4, generator=g)


def train(model, optimizer, steps, rank, start=0):
    for step in range(start, start + steps):
        x, y = data(step, rank)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


C = hvd.Compression
rank, size = spmd.rank_and_size()  # the job's, which commlib's are once init() ran


@spmd.case
def init():
    # the bit-for-bit comparisons below need both calls on one algorithm: no exploring auto
    hvd.init(auto_learn=False)


@spmd.case
def horovods_interface_on_the_builtin_objects():
    # Horovod's interface on the built-in objects, with torch tensors.
    t = torch.randn(10)
    half, ctx = C.fp16.compress(t)
    assert half.dtype is torch.float16 and C.fp16.decompress(half, ctx).dtype is torch.float32
    assert C.none.compress(t)[0] is t and C.bf16.compress(t)[0].dtype is torch.bfloat16


@spmd.case
def a_user_written_compressor():
    # A user-written compressor on allreduce (async, in place, grouped) and in DistributedOptimizer.
    x = torch.randn(100, generator=torch.Generator().manual_seed(rank))
    expected = hvd.allreduce(x.to(torch.float16), op=hvd.Sum, name="user.ref").to(torch.float32)
    got = hvd.allreduce(x, op=hvd.Sum, name="user", compression=TorchHalf)
    assert got.dtype is torch.float32 and torch.equal(got, expected)
    y = x.clone()
    assert hvd.synchronize(hvd.allreduce_async_(y, op=hvd.Sum, name="user.inplace", compression=TorchHalf)) is y
    assert torch.equal(y, expected)
    pair = hvd.grouped_allreduce([x, x * 2], op=hvd.Sum, name="user.group", compression=TorchHalf)
    assert torch.equal(pair[0], expected)

    model, reference = make_model(), make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=TorchHalf)
    ref_opt = hvd.DistributedOptimizer(torch.optim.SGD(reference.parameters(), lr=0.1),
                                       named_parameters=reference.named_parameters(), compression=C.fp16)
    train(model, opt, 3, rank)
    train(reference, ref_opt, 3, rank)
    close(flat(model), flat(reference), "user compressor vs fp16 in DistributedOptimizer", rtol=1e-2, atol=1e-3)


@spmd.case
def lossy_state_is_per_name_and_survives_a_new_optimizer():
    # A lossy compressor's state is per parameter name and survives a new DistributedOptimizer: training
    # 2 + 2 steps with a re-created optimizer equals 4 steps with one (same compressor object).
    results = []
    for recreate in (False, True):
        comp = C.topk(0.05, min_elements=0)
        model = make_model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), compression=comp)
        train(model, opt, 2, rank)
        if recreate:
            del opt
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           named_parameters=model.named_parameters(), compression=comp)
        train(model, opt, 2, rank, start=2)
        assert sorted(comp.state) == sorted(name for name, _ in model.named_parameters()), sorted(comp.state)
        results.append(flat(model))
    assert torch.equal(results[0], results[1])
    every = hvd.allgather(results[1].reshape(1, -1), name="topk.same")
    assert all(torch.equal(every[0], row) for row in every), "ranks diverged under topk"


@spmd.case
def every_lossy_compressor_trains_alike_on_every_rank():
    # Every lossy compressor trains in DistributedOptimizer, identically on every rank.
    for label, comp in (("dgc", C.dgc(rampup_begin_step=1, rampup_step=3, min_elements=0)),
                        ("powersgd", C.powersgd(rank=2, start_step=1)), ("onebit", C.onebit()),
                        ("randomk", C.randomk(0.1, seed=1, min_elements=0))):
        model = make_model()
        sgd = torch.optim.SGD(model.parameters(), lr=0.05)
        opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), compression=comp)
        train(model, opt, 4, rank)
        every = hvd.allgather(flat(model).reshape(1, -1), name=f"{label}.same")
        assert all(torch.equal(every[0], row) for row in every), f"ranks diverged under {label}"
        assert torch.isfinite(every).all(), label


@spmd.case
def localsgd_period_1_is_synchronous_training():
    # LocalSGD with period 1 is synchronous training (plain SGD, equal start).
    model, reference = make_model(), make_model()
    local = hvd.LocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  hvd.PeriodicModelAverager(period=1, warmup_steps=0))
    sync = hvd.DistributedOptimizer(torch.optim.SGD(reference.parameters(), lr=0.1),
                                    named_parameters=reference.named_parameters())
    train(model, local, 4, rank)
    train(reference, sync, 4, rank)
    close(flat(model), flat(reference), "LocalSGD period 1 vs synchronous", rtol=1e-5, atol=1e-6)


@spmd.case
def localsgd_warmup_then_period_3():
    # Warm-up then period 3: identical on every rank right after an averaging step, and the step count.
    model = make_model()
    averager = hvd.PeriodicModelAverager(period=3, warmup_steps=2)
    local = hvd.LocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), averager)
    train(model, local, 6, rank)  # steps 0-1 warm-up (gradients averaged), averages at steps 2 and 5
    every = hvd.allgather(flat(model).reshape(1, -1), name="localsgd.same")
    close(every[0], every[-1], "LocalSGD after an averaging step", rtol=1e-6, atol=1e-7)
    assert averager.step == 6 and local.state_dict()["step"] == 6


@spmd.case
def hierarchical_averager_groups():
    # Hierarchical: with {1: groups of half the ranks, 2: all}, odd steps average within halves.
    if size % 2:
        spmd.skip("needs an even number of ranks")
    half_size = size // 2
    averager = hvd.HierarchicalModelAverager({1: half_size, 2: size})
    params = [torch.full((3,), float(rank))]
    averager.step = 1
    averager.average_parameters(params)
    group = rank // half_size
    mean = np.mean(range(group * half_size, (group + 1) * half_size))
    assert torch.allclose(params[0], torch.full((3,), mean, dtype=torch.float32)), (params, mean)
    averager.average_parameters(params)  # step 2: all ranks
    assert torch.allclose(params[0], torch.full((3,), (size - 1) / 2, dtype=torch.float32))
    averager.close()


@spmd.case
def shutdown():
    cl.shutdown()


if __name__ == "__main__":
    spmd.main()
