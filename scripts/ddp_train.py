"""A plain torch.distributed training script: the workload ``scripts/bench_ddp.py`` times on each backend.

    mpiexec -n 2 python scripts/ddp_train.py --backend commlib [--hook torch-fp16|commlib-fp16] [--fsdp]
        [--steps 40]

The issue's training step: an MLP 1024-4096-4096-1024 with ReLUs (25.2 M parameters), batch 32, MSE loss,
SGD with momentum 0.9, one torch thread per rank, wrapped in ``DistributedDataParallel`` with its defaults
(or FSDP2's ``fully_shard`` per layer with ``--fsdp``). ``--hook``: PyTorch's ``fp16_compress_hook``, or
commlib's ``fp16_wrapper(allreduce_hook)`` (commlib.torch.hooks). Nothing else is set; the backend's own
settings come from its environment (the benchmark sets ``COMMLIB_TORCH_COMPRESSION=fp16`` for the commlib
backend's fp16 option). ``init_process_group`` takes its ranks from the launcher (torchrun's variables, or
MPI's world through commlib's env:// fallback).

Every step starts together (a barrier), and its time is the slowest rank's. Rank 0 prints one JSON line:
every step's time in seconds, from the first.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class Trace:
    """Times within a step (``--trace``): phases, gradients ready, buckets' allreduce spans; ms from its start."""

    def __init__(self, on: bool):
        self.on = on  # off: mark() notes nothing, so an untraced step times nothing of it
        self.start = 0.0
        self.events: list[str] = []

    def begin(self) -> float:
        self.events = []
        self.start = time.perf_counter()
        return self.start

    def _ms(self) -> float:
        return (time.perf_counter() - self.start) * 1e3

    def mark(self, what: str) -> None:
        if self.on:
            self.events.append(f"{what} {self._ms():.0f}")

    def watch(self, model: nn.Module) -> None:
        """Note when each parameter's gradient is ready."""
        for name, parameter in model.named_parameters():
            parameter.register_post_accumulate_grad_hook(
                lambda _, name=name: self.events.append(f"grad {name} {self._ms():.0f}"))

    def timed(self, hook):
        """``hook``, noting each bucket's span: handed over by DDP, and its future complete."""
        def timed_hook(state, bucket):
            began = self._ms()
            size = bucket.buffer().numel()

            def done(future):
                self.events.append(f"bucket {bucket.index()} ({size / 1e6:.1f} M values) {began:.0f}-{self._ms():.0f}")
                return future.value()

            return hook(state, bucket).then(done)
        return timed_hook

    def report(self, step: int) -> str:
        return f"step {step + 1}: " + "; ".join(self.events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="commlib")
    parser.add_argument("--hook", choices=["none", "torch-fp16", "commlib-fp16"], default="none")
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--steps", type=int, default=40, help="steps, all timed (the first ones included)")
    parser.add_argument("--trace", action="store_true", help="print where rank 0's steps after the 10th go")
    args = parser.parse_args()

    import commlib.torch  # noqa: F401 - torch finds the backend by itself; this also serves `--hook commlib-fp16`

    dist.init_process_group(args.backend)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 1024))
    trace = Trace(args.trace)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        trained = model
    else:
        trained = nn.parallel.DistributedDataParallel(model)
        state, hook = None, None
        if args.hook == "torch-fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = default_hooks.fp16_compress_hook
        elif args.hook == "commlib-fp16":
            from commlib.torch import hooks

            state, hook = hooks.State(), hooks.fp16_wrapper(hooks.allreduce_hook)
        if trace.on:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = trace.timed(hook or default_hooks.allreduce_hook)
            trace.watch(model)
        if hook is not None:
            trained.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(trained.parameters(), lr=1e-3, momentum=0.9)
    g = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(32, 1024, generator=g), torch.randn(32, 1024, generator=g)
    times = []
    for step in range(args.steps):
        dist.barrier()  # every rank starts the step together
        start = trace.begin()
        optimizer.zero_grad()
        loss = F.mse_loss(trained(x), y)
        trace.mark("forward")
        loss.backward()
        trace.mark("backward")
        optimizer.step()
        times.append(time.perf_counter() - start)
        trace.mark("optimizer")
        if trace.on and step >= 10 and dist.get_rank() == 0:
            print(trace.report(step), flush=True)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        print(json.dumps({"backend": args.backend, "hook": args.hook, "fsdp": args.fsdp,
                          "ranks": dist.get_world_size(), "step_s": slowest.tolist(), "loss": loss.item()}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
