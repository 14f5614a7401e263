"""Train a digit classifier data-parallel with commlib.torch (the horovod.torch API).

    mpiexec -n 2 python examples/train_digits.py

The data set is generated here, so nothing is downloaded: the ten digits drawn from a 5x7 pixel font,
placed at a random position in a 12x12 image, with random stroke strength, randomly dropped pixels and
Gaussian noise. Every rank generates the same images and trains on its own shard; gradients are averaged
by ``hvd.DistributedOptimizer``. Each epoch prints the loss, the train and test accuracy and the samples per
second over all ranks. The script exits non-zero if the final test accuracy misses ``--target``.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import commlib.torch as hvd
from digits import SIDE, make_digits


def make_model() -> torch.nn.Module:
    """A small CNN (the digits move around the image, which convolutions handle and an MLP does not)."""
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, SIDE, SIDE)),
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * (SIDE // 4) ** 2, 10),
    )


def evaluate(model, images, labels) -> tuple[float, float]:
    """Mean loss and accuracy over every rank's shard of the given set."""
    with torch.no_grad():
        logits = model(images)
        totals = torch.tensor([F.cross_entropy(logits, labels, reduction="sum").item(),
                               (logits.argmax(1) == labels).sum().item(), len(labels)], dtype=torch.float64)
    loss_sum, correct, count = hvd.allreduce(totals, op=hvd.Sum, name="evaluate").tolist()
    return loss_sum / count, correct / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.02, help="per rank; scaled by the number of ranks")
    parser.add_argument("--train-size", type=int, default=8000)
    parser.add_argument("--test-size", type=int, default=2000)
    parser.add_argument("--target", type=float, default=0.95, help="test accuracy to reach")
    parser.add_argument("--compression", choices=["none", "fp16", "bf16"], default="none")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)  # one core per rank
    torch.manual_seed(args.seed + rank)  # different on purpose: broadcast_parameters makes them equal

    train_x, train_y = make_digits(args.train_size, seed=args.seed)
    test_x, test_y = make_digits(args.test_size, seed=args.seed + 1)
    test_x, test_y = torch.from_numpy(test_x[rank::size]), torch.from_numpy(test_y[rank::size])

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=getattr(hvd.Compression, args.compression))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # every rank takes the same number of steps per epoch (no rank may wait for an allreduce in vain)
    steps = args.train_size // (size * args.batch_size)
    if rank == 0:
        print(f"training on {size} rank(s): {args.train_size} images, {steps} steps of "
              f"{args.batch_size} per rank per epoch, target test accuracy {args.target:.2f}", flush=True)
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        order = np.random.default_rng(args.seed + epoch).permutation(args.train_size)[rank::size]
        xs, ys = torch.from_numpy(train_x[order]), torch.from_numpy(train_y[order])
        model.train()
        start = time.perf_counter()
        for step in range(steps):
            batch = slice(step * args.batch_size, (step + 1) * args.batch_size)
            optimizer.zero_grad()
            F.cross_entropy(model(xs[batch]), ys[batch]).backward()
            optimizer.step()
        elapsed = hvd.allreduce(torch.tensor([time.perf_counter() - start]), op=hvd.Max, name="epoch.time").item()
        model.eval()
        train_loss, train_accuracy = evaluate(model, xs[:steps * args.batch_size], ys[:steps * args.batch_size])
        _, accuracy = evaluate(model, test_x, test_y)
        if rank == 0:
            print(f"epoch {epoch:2d}  loss {train_loss:.4f}  train accuracy {train_accuracy:.4f}  "
                  f"test accuracy {accuracy:.4f}  {steps * args.batch_size * size / elapsed:,.0f} samples/s",
                  flush=True)
    reached = accuracy >= args.target
    if rank == 0:
        verdict = "reached" if reached else "MISSED"
        print(f"{verdict} target accuracy {args.target:.2f}: test accuracy {accuracy:.4f}", flush=True)
    hvd.shutdown()
    return 0 if reached else 1


if __name__ == "__main__":
    sys.exit(main())
