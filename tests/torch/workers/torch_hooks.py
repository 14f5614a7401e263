"""Worker for tests/torch/test_torch_hooks.py: commlib's DDP hooks on one backend, against PyTorch's own hooks
and against numpy.

    mpiexec -n N python torch_hooks.py BACKEND       (gloo or commlib)

Cases (each on every rank; a failure names the case and the rank and aborts the job):
- fp16: DDP training with ``fp16_wrapper(allreduce_hook)`` ends within float16 rounding of PyTorch's
  ``fp16_compress_hook``; one bucket through it equals numpy's rule (each rank's values divided by the ranks,
  rounded to float16, summed) within a float16 rounding per addition.
- bf16: the same bucket with ``bf16_wrapper`` against numpy and ml_dtypes (PyTorch's bf16 hook refuses CPU).
- powersgd: ``compress_wrapper(allreduce_hook, Compression.powersgd(rank=1, start_step=2))`` against
  PyTorch's ``powerSGD_hook`` (rank 1, start_powerSGD_iter=2) on gradients that are rank one with a shared
  left factor (which both approximate exactly): both give the dense average, step after step.
- topk: three steps of top-k with error feedback on a bucket against numpy's top-k and residuals.
- dgc, onebit, topk under fp16: DDP trains with each, every rank keeps the same parameters, and the loss falls.
Prints ``torch_hooks OK`` on rank 0.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

import commlib as cl
from commlib.torch import hooks

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workers"))
from worker import run  # noqa: E402 - tests/workers/worker.py: a failing rank aborts the job

backend = sys.argv[1]
torch.set_num_threads(1)
dist.init_process_group(backend)
RANK, SIZE = dist.get_rank(), dist.get_world_size()


def check(name: str, condition: bool, detail="") -> None:
    if not condition:
        raise AssertionError(f"case {name} on rank {RANK} ({backend}): {detail}")


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


def wire_cases():
    ours, _ = train(lambda d: d.register_comm_hook(hooks.State(), hooks.fp16_wrapper(hooks.allreduce_hook)))
    theirs, _ = train(lambda d: d.register_comm_hook(None, default_hooks.fp16_compress_hook))
    check("fp16 vs torch", torch.allclose(ours, theirs, rtol=1e-3, atol=1e-4), (ours - theirs).abs().max())
    n = 1000
    for name, wrapper, wire_type in (("fp16", hooks.fp16_wrapper, np.float16), ("bf16", hooks.bf16_wrapper,
                                                                               ml_dtypes.bfloat16)):
        mine = torch.from_numpy(grads(RANK, n))
        got = wrapper(hooks.allreduce_hook)(hooks.State(), Bucket(mine)).wait()
        rounded = [(grads(r, n) / np.float32(SIZE)).astype(wire_type).astype(np.float32) for r in range(SIZE)]
        want = np.sum(rounded, axis=0, dtype=np.float32)
        # the sum travels in half precision too: a rounding per addition at most (gloo adds in float16)
        unit = 2.0 ** -10 if wire_type is np.float16 else 2.0 ** -7
        bound = SIZE * unit * np.sum(np.abs(rounded), axis=0) + 1e-6
        check(name, np.all(np.abs(got.numpy() - want) <= bound), np.abs(got.numpy() - want).max())


def powersgd_case():
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


def topk_case():
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


def training_cases():
    for name, make in (("dgc", lambda: hooks.compress_wrapper(hooks.allreduce_hook, cl.Compression.dgc())),
                       ("onebit", lambda: hooks.compress_wrapper(hooks.allreduce_hook, cl.Compression.onebit())),
                       ("topk fp16", lambda: hooks.compress_wrapper(hooks.fp16_wrapper(hooks.allreduce_hook),
                                                                   cl.Compression.topk(0.2)))):
        params, losses = train(lambda d, make=make: d.register_comm_hook(hooks.State(), make()), steps=8)
        same_everywhere(name, params)
        check(name, losses[-1] < losses[0], losses)


def main():
    wire_cases()
    powersgd_case()
    topk_case()
    training_cases()
    dist.barrier()
    if RANK == 0:
        print("torch_hooks OK", flush=True)
    dist.destroy_process_group()


run(main)
