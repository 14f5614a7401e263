"""A plain Horovod training script: the workload ``scripts/bench_horovod.py`` times under Horovod, under
commlib (through a ``horovod.torch`` that re-exports ``commlib.torch``) and, with ``--ddp``, as the same
step under torch's DistributedDataParallel over gloo. It imports nothing of commlib.

    mpiexec -n 2 python scripts/horovod_train.py --model mlp-25M --steps 20 --warmup 5
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 mpiexec -n 2 python scripts/horovod_train.py --ddp

One step: ``zero_grad``, forward, backward (the DistributedOptimizer's hooks start the allreduces; DDP's
buckets do the same), ``optimizer.step()`` (which waits for them), SGD with momentum 0.9, one torch thread
per rank. Models:

- ``mlp-25M``: Linear 1024-4096-4096-1024 with ReLUs (25.2 M parameters, 6 tensors), batch 32;
- ``small-160``: 80 Linear 128-128 layers with ReLUs (160 tensors of 64 KiB and 512 B), batch 32.

``--ddp`` takes its rank and size from the MPI launcher's environment (``PMI_RANK``/``PMI_SIZE``, or Open
MPI's) and rank 0's address from ``MASTER_ADDR``/``MASTER_PORT``. Every timed step starts together (an
allreduce of one value, or a barrier). Rank 0 prints one JSON line: every timed step's time (the slowest
rank's, in seconds) and the library's name, for the caller to parse.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F


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


class Horovod:
    """The script's distributed part through ``horovod.torch``."""

    def __init__(self):
        import horovod.torch as hvd

        self.hvd = hvd
        hvd.init()

    def rank(self) -> int:
        return self.hvd.rank()

    def wrap(self, model, optimizer):
        hvd = self.hvd
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return model, optimizer

    def together(self) -> None:
        self.hvd.allreduce(torch.zeros(1), name="step.sync")

    def slowest(self, times: list[float]) -> list[float]:
        return self.hvd.allreduce(torch.tensor(times, dtype=torch.float64), name="step.times",
                                  op=self.hvd.Max).tolist()

    def close(self) -> None:
        self.hvd.shutdown()


class DDP:
    """The same step under torch's DistributedDataParallel over gloo."""

    def __init__(self):
        import torch.distributed as dist

        self.dist = dist
        rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
        size = int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
        dist.init_process_group("gloo", rank=rank, world_size=size)

    def rank(self) -> int:
        return self.dist.get_rank()

    def wrap(self, model, optimizer):
        return torch.nn.parallel.DistributedDataParallel(model), optimizer  # DDP broadcasts the parameters

    def together(self) -> None:
        self.dist.barrier()

    def slowest(self, times: list[float]) -> list[float]:
        values = torch.tensor(times, dtype=torch.float64)
        self.dist.all_reduce(values, op=self.dist.ReduceOp.MAX)
        return values.tolist()

    def close(self) -> None:
        self.dist.barrier()  # no rank leaves while another still talks to rank 0's store
        sys.stdout.flush()
        os._exit(0)  # gloo's teardown aborts the process on emulated hosts ("terminate called ...")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mlp-25M")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--ddp", action="store_true", help="torch DDP over gloo instead of horovod.torch")
    args = parser.parse_args()

    library = DDP() if args.ddp else Horovod()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, batch, width = make_model(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    model, optimizer = library.wrap(model, optimizer)
    g = torch.Generator().manual_seed(library.rank())
    x = torch.randn(*batch, generator=g)
    y = torch.randn(batch[0], width, generator=g)

    def step() -> float:
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        library.together()  # every rank starts the step together
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
    slowest = library.slowest(times)
    if library.rank() == 0:
        print(json.dumps({"library": os.environ.get("BENCH_LIBRARY", "?"), "model": args.model,
                          "step_s": slowest, "loss": loss}), flush=True)
    library.close()


if __name__ == "__main__":
    main()
