"""Worker for tests/torch/test_torch_hooks.py: commlib's DDP hooks on one backend, against PyTorch's own hooks
and against numpy.

    mpiexec -n N python torch_hooks.py BACKEND       (gloo or commlib)

Named cases on every rank (tests/spmd.py):
- fp16_training_vs_torch: DDP training with ``fp16_wrapper(allreduce_hook)`` ends within float16 rounding of
  PyTorch's ``fp16_compress_hook``;
- fp16_bucket_vs_numpy, bf16_bucket_vs_numpy: one bucket through ``fp16_wrapper``/``bf16_wrapper`` equals
  numpy's rule (each rank's values divided by the ranks, rounded to the wire type, summed) within a rounding
  per addition (PyTorch's bf16 hook refuses CPU tensors, so bf16 is checked against numpy and ml_dtypes);
- powersgd_vs_torch: ``compress_wrapper(allreduce_hook, Compression.powersgd(rank=1, start_step=2))`` against
  PyTorch's ``powerSGD_hook`` (rank 1, start_powerSGD_iter=2) on gradients that are rank one with a shared
  left factor (which both approximate exactly): both give the dense average, step after step;
- topk_vs_numpy: three steps of top-k with error feedback on a bucket against numpy's top-k and residuals;
- dgc_trains, onebit_trains, topk_fp16_trains: DDP trains with each, every rank keeps the same parameters,
  and the loss falls.
"""

from __future__ import annotations

import gc
import math
import sys

import ml_dtypes
import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

import commlib as cl
import spmd
from commlib.torch import hooks

backend = sys.argv[1]
torch.set_num_threads(1)
RANK, SIZE = spmd.rank_and_size()


def check(name: str, condition: bool, detail="") -> None:
    if not condition:
        raise AssertionError(f"{name} ({backend}): {detail}")


@spmd.case
def init():
    dist.init_process_group(backend)
    assert (dist.get_rank(), dist.get_world_size()) == (RANK, SIZE)


class Bucket:
    """What a hook reads of DDP's GradBucket (which Python cannot construct), around one tensor."""

    def __init__(self, tensor, index=0, last=True):
        self._tensor, self._index, self._last = tensor, index, last

    def buffer(self):
        return self._tensor

    def set_buffer(self, tensor):
        self._tensor = tensor

    def index(self):
        return self._index

    def is_last(self):
        return self._last

    def gradients(self):
        return [self._tensor]


def grads(rank: int, n: int, step: int = 0) -> np.ndarray:
    return np.random.default_rng([rank, step, n]).standard_normal(n).astype(np.float32) * (1 + rank)


def train(register, steps: int = 5, seed_data: int = 0):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))
    ddp = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.02)
    register(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1000 * RANK + seed_data)
    x, y = torch.randn(32, 64, generator=g), torch.randn(32, 8, generator=g)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.cat([p.detach().flatten() for p in net.parameters()]), losses


def same_everywhere(name: str, params: torch.Tensor) -> None:
    every = [torch.empty_like(params) for _ in range(SIZE)]
    dist.all_gather(every, params)
    check(name, all(torch.equal(e, every[0]) for e in every), "ranks' parameters differ")


@spmd.case
def fp16_training_vs_torch():
    ours, _ = train(lambda d: d.register_comm_hook(hooks.State(), hooks.fp16_wrapper(hooks.allreduce_hook)))
    theirs, _ = train(lambda d: d.register_comm_hook(None, default_hooks.fp16_compress_hook))
    check("fp16 vs torch", torch.allclose(ours, theirs, rtol=1e-3, atol=1e-4), (ours - theirs).abs().max())


def check_wire_bucket(name: str, wrapper, wire_type) -> None:
    n = 1000
    mine = torch.from_numpy(grads(RANK, n))
    got = wrapper(hooks.allreduce_hook)(hooks.State(), Bucket(mine)).wait()
    rounded = [(grads(r, n) / np.float32(SIZE)).astype(wire_type).astype(np.float32) for r in range(SIZE)]
    want = np.sum(rounded, axis=0, dtype=np.float32)
    # the sum travels in half precision too: a rounding per addition at most (gloo adds in float16)
    unit = 2.0 ** -10 if wire_type is np.float16 else 2.0 ** -7
    bound = SIZE * unit * np.sum(np.abs(rounded), axis=0) + 1e-6
    check(name, np.all(np.abs(got.numpy() - want) <= bound), np.abs(got.numpy() - want).max())


@spmd.case
def fp16_bucket_vs_numpy():
    check_wire_bucket("fp16", hooks.fp16_wrapper, np.float16)


@spmd.case
def bf16_bucket_vs_numpy():
    check_wire_bucket("bf16", hooks.bf16_wrapper, ml_dtypes.bfloat16)


@spmd.case
def powersgd_vs_torch():
    """One Linear without bias, loss = (W x) . a: its gradient a x^T has rank one with a shared left factor."""
    direction = torch.linspace(-1.0, 1.0, 16)

    def run_with(register):
        torch.manual_seed(0)
        layer = nn.Linear(32, 16, bias=False)
        ddp = nn.parallel.DistributedDataParallel(layer)
        register(ddp)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(5):
            opt.zero_grad()
            x = torch.from_numpy(grads(RANK, 32, step))
            (ddp(x) * direction).sum().backward()
            opt.step()
        return layer.weight.detach().clone()

    plain = run_with(lambda d: None)
    torch_state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                              min_compression_rate=0.5)
    theirs = run_with(lambda d: d.register_comm_hook(torch_state, powerSGD_hook.powerSGD_hook))
    ours = run_with(lambda d: d.register_comm_hook(hooks.State(), hooks.compress_wrapper(
        hooks.allreduce_hook, cl.Compression.powersgd(rank=1, start_step=2, min_compression_rate=0.5))))
    check("powersgd vs torch", torch.allclose(ours, theirs, rtol=1e-4, atol=1e-5), (ours - theirs).abs().max())
    check("powersgd vs dense", torch.allclose(ours, plain, rtol=1e-4, atol=1e-5), (ours - plain).abs().max())


@spmd.case
def topk_vs_numpy():
    n, ratio = 2048, 0.1
    k = min(n, max(1, math.ceil(ratio * n)))
    compressor = cl.Compression.topk(ratio)
    hook = hooks.compress_wrapper(hooks.allreduce_hook, compressor)
    state = hooks.State()
    residual = [np.zeros(n, np.float32) for _ in range(SIZE)]
    for step in range(3):
        mine = torch.from_numpy(grads(RANK, n, step))
        got = hook(state, Bucket(mine)).wait()
        total = np.zeros(n, np.float32)
        for r in range(SIZE):  # numpy: every rank's top-k of gradient + residual, summed in rank order
            acc = grads(r, n, step) + residual[r]
            keep = np.argsort(-np.abs(acc), kind="stable")[:k]
            sent = np.zeros(n, np.float32)
            sent[keep] = acc[keep]
            residual[r] = acc - sent
            total += sent
        want = total / np.float32(SIZE)
        check("topk vs numpy", np.allclose(got.numpy(), want, rtol=1e-6, atol=1e-6), (step, np.abs(got.numpy() - want).max()))


def check_trains(name: str, make) -> None:
    params, losses = train(lambda d: d.register_comm_hook(hooks.State(), make()), steps=8)
    same_everywhere(name, params)
    check(name, losses[-1] < losses[0], losses)


@spmd.case
def dgc_trains():
    check_trains("dgc", lambda: hooks.compress_wrapper(hooks.allreduce_hook, cl.Compression.dgc()))


@spmd.case
def onebit_trains():
    check_trains("onebit", lambda: hooks.compress_wrapper(hooks.allreduce_hook, cl.Compression.onebit()))


@spmd.case
def topk_fp16_trains():
    check_trains("topk fp16", lambda: hooks.compress_wrapper(hooks.fp16_wrapper(hooks.allreduce_hook),
                                                             cl.Compression.topk(0.2)))


@spmd.case
def shutdown():
    # DDP's modules live in reference cycles: collected now, while the interpreter runs, and not by the
    # collection at exit, where a gloo thread that drops a Python callback is killed as it takes the GIL
    # (std::terminate: "terminate called without an active exception")
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    spmd.main()
