"""A plain Horovod training script: the workload ``scripts/bench_horovod.py`` times under Horovod and under
commlib (through a ``horovod.torch`` that re-exports ``commlib.torch``). It imports nothing of commlib.

    mpiexec -n 2 python scripts/horovod_train.py --model mlp-25M --steps 20 --warmup 5

One step: ``zero_grad``, forward, backward (the DistributedOptimizer's hooks start the allreduces),
``optimizer.step()`` (which waits for them), SGD with momentum 0.9, one torch thread per rank. Models:

- ``mlp-25M``: Linear 1024-4096-4096-1024 with ReLUs (25.2 M parameters, 6 tensors), batch 32;
- ``small-160``: 80 Linear 128-128 layers with ReLUs (160 tensors of 64 KiB and 512 B), batch 32.

Rank 0 prints one JSON line: every timed step's time (the slowest rank's, in seconds) and the library's
name, for the caller to parse.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

import horovod.torch as hvd


def make_model(name: str) -> tuple[torch.nn.Module, tuple[int, int], int]:
    """(model, input shape, output width) of ``name``."""
    if name == "mlp-25M":
        layers = [torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                  torch.nn.Linear(4096, 1024)]
        return torch.nn.Sequential(*layers), (32, 1024), 1024
    if name == "small-160":
        layers = []
        for _ in range(80):
            layers += [torch.nn.Linear(128, 128), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers), (32, 128), 128
    raise SystemExit(f"unknown model {name!r}; use mlp-25M or small-160")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mlp-25M")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, batch, width = make_model(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    g = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn(*batch, generator=g)
    y = torch.randn(batch[0], width, generator=g)

    def step() -> float:
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return float(loss)

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        hvd.allreduce(torch.zeros(1), name="step.sync")  # every rank starts the step together
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
    slowest = hvd.allreduce(torch.tensor(times, dtype=torch.float64), name="step.times", op=hvd.Max)
    if hvd.rank() == 0:
        print(json.dumps({"library": os.environ.get("BENCH_LIBRARY", "?"), "model": args.model,
                          "ranks": hvd.size(), "step_s": slowest.tolist(), "loss": loss}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
