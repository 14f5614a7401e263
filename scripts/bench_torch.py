"""Training step time: commlib's DistributedOptimizer vs torch DDP over gloo vs a synchronous allreduce loop.

    mpiexec -n 2 python scripts/bench_torch.py [--steps 10] [--rounds 3] [--json out.json]

For each model (the example's digits CNN and a >= 20 M parameter MLP) and each way of averaging
gradients, one step is ``zero_grad, forward, backward, average gradients, optimizer step``:

- ``commlib``: ``commlib.torch.DistributedOptimizer`` (allreduces start from gradient hooks during backward);
- ``commlib-fp16``: the same with ``compression=Compression.fp16`` (half precision on the wire);
- ``ddp-gloo``: ``torch.nn.parallel.DistributedDataParallel`` on a gloo process group (127.0.0.1);
- ``sync-loop``: after backward, a synchronous ``commlib.torch.allreduce_`` per parameter;
- ``local``: no communication at all (the compute floor, for context).

Modes are interleaved round by round (each round runs every mode for ``--steps`` steps after one warm-up
step), so load changes on the machine hit all of them alike. The reported time is the median over all
timed steps of the slowest rank's step time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import commlib.torch as hvd  # noqa: E402
from train_digits import make_model as make_digits_model  # noqa: E402

MODES = ("commlib", "commlib-fp16", "ddp-gloo", "sync-loop", "local")


def make_large_mlp(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(1024, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, 1024))


MODELS = {
    "digits-cnn": dict(make=make_digits_model, batch=(64, 144), loss="classify"),
    "mlp-25M": dict(make=lambda: make_large_mlp(4096), batch=(32, 1024), loss="regress"),
}


def huge_pages() -> str:
    """Whether torch's large CPU tensors are backed by transparent huge pages: the kernel's mode and torch's
    THP_MEM_ALLOC_ENABLE (cross-memory copies between ranks pin pages one at a time, so 2 MiB pages matter)."""
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        mode = "unknown"
    return f"THP {mode}, THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', 'unset')}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Runner:
    """One model under one mode: owns its copy of the model, its optimizer and its batch."""

    def __init__(self, model_name: str, mode: str):
        spec = MODELS[model_name]
        torch.manual_seed(0)
        self.model = spec["make"]()
        self.mode = mode
        params = self.model.parameters()
        if mode == "ddp-gloo":
            self.model = torch.nn.parallel.DistributedDataParallel(self.model)
            params = self.model.parameters()
        self.optimizer = torch.optim.SGD(params, lr=1e-4, momentum=0.9)
        if mode.startswith("commlib"):
            compression = hvd.Compression.fp16 if mode == "commlib-fp16" else hvd.Compression.none
            self.optimizer = hvd.DistributedOptimizer(self.optimizer, compression=compression,
                                                      named_parameters=self.model.named_parameters())
        g = torch.Generator().manual_seed(hvd.rank())
        self.x = torch.randn(*spec["batch"], generator=g)
        if spec["loss"] == "classify":
            self.y = torch.randint(0, 10, (spec["batch"][0],), generator=g)
            self.loss = lambda out: F.cross_entropy(out, self.y)
        else:
            self.y = torch.randn(spec["batch"][0], 1024, generator=g)
            self.loss = lambda out: F.mse_loss(out, self.y)
        self.params = [p for p in self.model.parameters() if p.requires_grad]

    def step(self) -> None:
        self.optimizer.zero_grad()
        self.loss(self.model(self.x)).backward()
        if self.mode == "sync-loop":
            for p in self.params:
                hvd.allreduce_(p.grad)
        self.optimizer.step()

    def timed(self, steps: int) -> list[float]:
        self.step()  # warm-up: first-touch of gradient buffers, negotiation caches
        hvd.barrier()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            self.step()
            times.append(time.perf_counter() - start)
        # a step is as slow as its slowest rank
        return [max(ts) for ts in zip(*hvd.allgather_object(times))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per mode per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--threads", type=int, default=1, help="torch compute threads per rank")
    parser.add_argument("--mlp-batch", type=int, default=32,
                        help="batch per rank of the large MLP (less compute per step -> communication weighs more)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(args.threads)
    rank, size = hvd.rank(), hvd.size()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(hvd.broadcast_object(free_port() if rank == 0 else None, root_rank=0))
    dist.init_process_group("gloo", rank=rank, world_size=size)

    MODELS["mlp-25M"]["batch"] = (args.mlp_batch, 1024)
    models = args.models.split(",")
    runners = {(m, mode): Runner(m, mode) for m in models for mode in MODES}
    times = {key: [] for key in runners}
    for _ in range(args.rounds):
        for key, runner in runners.items():
            times[key] += runner.timed(args.steps)

    results = []
    if rank == 0:
        print(f"# {size} ranks, {args.threads} torch thread(s) per rank, {args.rounds} rounds x {args.steps} steps, "
              f"mlp batch {args.mlp_batch} per rank, {huge_pages()}, "
              f"torch {torch.__version__}, {os.cpu_count()} cores, load average at the end "
              f"{os.getloadavg()[0]:.2f} (other jobs on the machine distort the timings)")
        print(f"{'model':<12} {'params':>10} {'mode':<12} {'median ms':>10} {'min ms':>8} {'vs ddp-gloo':>12} "
              f"{'vs sync-loop':>13}")
        for m in models:
            n_params = sum(p.numel() for p in runners[m, "local"].params)
            median = {mode: statistics.median(times[m, mode]) for mode in MODES}
            for mode in MODES:
                row = dict(model=m, params=n_params, mode=mode, median_ms=1e3 * median[mode],
                           min_ms=1e3 * min(times[m, mode]),
                           vs_ddp_gloo=median[mode] / median["ddp-gloo"],
                           vs_sync_loop=median[mode] / median["sync-loop"])
                results.append(row)
                print(f"{m:<12} {n_params:>10,} {mode:<12} {row['median_ms']:>10.2f} {row['min_ms']:>8.2f} "
                      f"{row['vs_ddp_gloo']:>11.2f}x {row['vs_sync_loop']:>12.2f}x")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
    dist.destroy_process_group()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
