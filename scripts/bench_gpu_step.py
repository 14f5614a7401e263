"""One torch CUDA training step on every rank, four ways, interleaved: the figure docs/gpu.md reports.

    mpiexec -n 2 python scripts/bench_gpu_step.py [--steps 20] [--rounds 5] [--json FILE]

A 25.2M-parameter MLP (1024 -> 4096 -> 4096 -> 1024, ReLU, MSE), batch 256, SGD, on each rank's GPU
(local rank modulo the GPUs: the lent machines have one, which the ranks share). Each step is forward,
backward, the gradients' averaging and the optimizer step, timed to ``torch.cuda.synchronize()``:

- ``none``: ``commlib.torch.DistributedOptimizer`` (the coordinator's device path);
- ``fp16``: the same with ``Compression.fp16`` (halves on the wire, cast on the device);
- ``ddp_gloo``: torch's DistributedDataParallel over its gloo backend (the peer);
- ``local``: no communication at all (the compute alone: the bound).

Modes take turns within each round, each round starting with the next; the table gives each mode's
median step (the slowest rank's) and its ratio to ``local``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time


def build(torch, device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096),
                               torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per mode per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument("--modes", default="none,fp16,ddp_gloo,local")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import commlib.torch as hvd

    hvd.init()
    comm = MPI.COMM_WORLD
    rank, size = hvd.rank(), hvd.size()
    device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(device)
    modes = args.modes.split(",")
    steps = {}
    if "ddp_gloo" in modes:
        port = None
        if rank == 0:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
        port = comm.bcast(port, root=0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    x = torch.randn(256, 1024, device=device)
    y = torch.randn(256, 1024, device=device)
    for mode in modes:
        model = build(torch, device)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        if mode in ("none", "fp16"):
            compression = hvd.Compression.fp16 if mode == "fp16" else hvd.Compression.none
            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                                 compression=compression)
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        elif mode == "ddp_gloo":
            model = torch.nn.parallel.DistributedDataParallel(model)

        def step(model=model, optimizer=optimizer):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        steps[mode] = step
    parameters = sum(p.numel() for p in build(torch, device).parameters())
    for mode in modes:
        for _ in range(args.warmup):
            steps[mode]()
    torch.cuda.synchronize()
    times = {mode: [] for mode in modes}
    for index in range(args.rounds):
        for mode in modes[index % len(modes):] + modes[:index % len(modes)]:
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(args.steps):
                steps[mode]()
            torch.cuda.synchronize()
            elapsed = (time.perf_counter() - start) / args.steps
            times[mode].append(comm.allreduce(elapsed, op=MPI.MAX))
    if rank == 0:
        medians = {mode: statistics.median(t) * 1e3 for mode, t in times.items()}
        print(f"# {size} ranks, {torch.cuda.get_device_name(device)} x{torch.cuda.device_count()}, MLP of "
              f"{parameters / 1e6:.1f}M parameters, batch 256, {args.rounds} rounds x {args.steps} steps, "
              f"torch {torch.__version__}, commlib algorithm {os.environ.get('COMMLIB_ALGORITHM', 'auto')}")
        local = medians.get("local")
        print(f"# {'mode':<10} {'ms/step':>9} {'x local':>8}")
        for mode, ms in medians.items():
            print(f"  {mode:<10} {ms:9.2f} {ms / local if local else float('nan'):8.2f}", flush=True)
        if args.json:
            with open(args.json, "w") as out:
                json.dump({"ranks": size, "parameters": parameters, "ms_per_step": medians,
                           "rounds": {m: [t * 1e3 for t in v] for m, v in times.items()}}, out, indent=1)
    if "ddp_gloo" in modes:
        dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
