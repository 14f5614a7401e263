"""Train the digit classifier of train_digits.py elastically: ranks may be lost (or added) while it trains.

    commlib-run --min-np 1 --max-np 4 -H a:2,b:2 python examples/train_digits_elastic.py
    sbatch --no-kill examples/slurm/train_elastic.sbatch        # under Slurm (docs/launcher.md)

Horovod Elastic's pattern (docs/elastic.md): the model, the optimizer and an ``ElasticSampler`` live in a
``TorchState`` committed every ``--commit-every`` steps; ``hvd.elastic.run`` restores the last commit on
every rank and calls ``train`` again when a rank is lost, over the ranks that are left. The learning rate
follows the number of ranks (a reset callback). Each epoch prints the loss and accuracies; ``--progress``
prints every step's number, the ranks and the time (what the tests measure the time to resume with). The
script exits non-zero if the final test accuracy misses ``--target``. ``train(argv)`` is the same as a
function (what examples/ray_digits.py runs in Ray actors).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

import commlib.torch as hvd
from digits import make_digits
from train_digits import evaluate, make_model


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.02, help="per rank; scaled by the number of ranks")
    parser.add_argument("--train-size", type=int, default=8000)
    parser.add_argument("--test-size", type=int, default=2000)
    parser.add_argument("--target", type=float, default=0.95, help="test accuracy to reach")
    parser.add_argument("--commit-every", type=int, default=10, help="steps between commits")
    parser.add_argument("--progress", action="store_true", help="print each step (rank 0)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def train(argv: list[str] | None = None) -> float:
    """Train as the command line ``argv`` says; return the final test accuracy (every rank)."""
    args = parse(argv)
    hvd.init()
    torch.set_num_threads(1)  # one core per rank
    torch.manual_seed(args.seed)

    train_x, train_y = make_digits(args.train_size, seed=args.seed)
    test_x, test_y = make_digits(args.test_size, seed=args.seed + 1)
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(train_x), torch.from_numpy(train_y))

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=args.seed)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, step=0, accuracy=0.0)

    def scale_learning_rate():  # the ranks that are left share the work: the rate follows their number
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    state.register_reset_callbacks([scale_learning_rate])
    scale_learning_rate()

    @hvd.elastic.run
    def epochs(state):
        rank, size = hvd.rank(), hvd.size()
        if rank == 0:
            print(f"training on {size} rank(s) from epoch {state.epoch + 1} step {state.step}", flush=True)
        while state.epoch < args.epochs:
            model.train()
            for x, y in loader:
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                state.sampler.record_batch(0, args.batch_size)
                state.step += 1
                if args.progress and rank == 0:
                    print(f"step {state.step} ranks {size} time {time.time():.3f}", flush=True)
                if state.step % args.commit_every == 0:
                    state.commit()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            model.eval()
            shard = slice(hvd.rank(), None, hvd.size())
            _, state.accuracy = evaluate(model, torch.from_numpy(test_x[shard]), torch.from_numpy(test_y[shard]))
            if rank == 0:
                print(f"epoch {state.epoch:2d}  test accuracy {state.accuracy:.4f}  on {size} rank(s)", flush=True)
            state.commit()

    epochs(state)
    if hvd.rank() == 0:
        verdict = "reached" if state.accuracy >= args.target else "MISSED"
        print(f"{verdict} target accuracy {args.target:.2f}: test accuracy {state.accuracy:.4f} on {hvd.size()} "
              "rank(s)", flush=True)
    return state.accuracy


def main() -> int:
    args = parse()
    accuracy = train(sys.argv[1:])
    hvd.shutdown()
    return 0 if accuracy >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
