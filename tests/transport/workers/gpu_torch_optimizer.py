"""Worker (GPU only): DistributedOptimizer on CUDA trains like one process on the combined batch (the
reference, also on CUDA, computed inside each rank). Several ranks may share one GPU.

    mpiexec -n P python gpu_torch_optimizer.py
"""

from __future__ import annotations

import torch

import commlib.torch as hvd
from torch_common import assert_same_on_all_ranks, close
import spmd
from spmd import import_worker

_cpu = import_worker("torch_optimizer")  # the CPU worker's model, data and optimizers
OPTIMIZERS, STEPS, batches, loss_fn, make_model, shard = (_cpu.OPTIMIZERS, _cpu.STEPS, _cpu.batches, _cpu.loss_fn,
                                                          _cpu.make_model, _cpu.shard)


def train_pair(r, n, opt_name, passes=1, **dist_kwargs):
    model, reference = make_model().cuda(), make_model().cuda()
    optimizer = hvd.DistributedOptimizer(OPTIMIZERS[opt_name](model.parameters()),
                                         named_parameters=model.named_parameters(),
                                         backward_passes_per_step=passes, **dist_kwargs)
    ref_optimizer = OPTIMIZERS[opt_name](reference.parameters())
    for step in range(STEPS):
        data = [(x.cuda(), y.cuda()) for x, y in batches(step, passes)]
        ref_optimizer.zero_grad()
        for x, y in data:
            loss_fn(reference, x, y).backward()
        ref_optimizer.step()
        optimizer.zero_grad()
        for x, y in data:
            loss_fn(model, shard(x, r, n), shard(y, r, n)).backward()
        optimizer.step()
    return model, reference


@spmd.case
def init():
    hvd.init()
    assert hvd.cuda_built()
    torch.backends.cuda.matmul.allow_tf32 = False   # the comparison needs float32 matmuls on both sides


@spmd.case
def trains_like_one_process_on_cuda():
    r, n = hvd.rank(), hvd.size()
    for opt_name, kwargs, rtol, atol in [("sgd", {}, 1e-5, 2e-6), ("sgd", dict(passes=2), 1e-5, 2e-6),
                                         ("adam", {}, 1e-5, 2e-6),
                                         ("adam", dict(compression=hvd.Compression.fp16), 3e-2, 3e-3)]:
        model, reference = train_pair(r, n, opt_name, **kwargs)
        label = f"cuda {opt_name} {kwargs}"
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            assert p.is_cuda, f"{label}: {name} left the GPU"
            close(p.cpu(), q.cpu(), f"{label}: {name}", rtol=rtol, atol=atol)
        assert_same_on_all_ranks(hvd, list(model.parameters()), label)


@spmd.case
def shutdown():
    hvd.shutdown()


if __name__ == "__main__":
    spmd.main()
