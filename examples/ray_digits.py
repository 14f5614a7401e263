"""Train the digit classifier on a Ray cluster with ``commlib.ray.RayExecutor`` (Horovod on Ray's API).

    ray start --head                                             # or any Ray cluster; then on a node of it:
    python examples/ray_digits.py --num-workers 2                # 2 workers, placed by Ray
    python examples/ray_digits.py --num-hosts 2 --workers-per-host 1
    python examples/ray_digits.py --min-workers 1 --max-workers 3 -- --epochs 4 --progress   # elastic

Each worker is a Ray actor and a rank of one commlib job; every worker runs train_digits_elastic.train
(after ``--``: its own flags) and returns its final test accuracy, which this prints. Elastic: workers may
be lost (a killed actor, a lost node) and the others go on; nodes Ray adds join at the next commit.
"""

from __future__ import annotations

import argparse
import os
import sys

import ray

from commlib.ray import RayExecutor

EXAMPLES = os.path.dirname(os.path.abspath(__file__))


def work(examples: str, argv: list[str]) -> float:
    """What every worker runs (defined here, so Ray ships it by value)."""
    sys.path.insert(0, examples)
    import train_digits_elastic

    return train_digits_elastic.train(argv)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default="auto", help="the Ray cluster (default: RAY_ADDRESS or this node's)")
    parser.add_argument("--num-workers", type=int, default=None)
    parser.add_argument("--num-hosts", type=int, default=None)
    parser.add_argument("--workers-per-host", type=int, default=1)
    parser.add_argument("--min-workers", type=int, default=None, help="an elastic job of at least this many")
    parser.add_argument("--max-workers", type=int, default=None)
    parser.add_argument("--cpus-per-worker", type=int, default=1)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--target", type=float, default=0.95, help="test accuracy to reach")
    parser.add_argument("train", nargs=argparse.REMAINDER, help="-- then train_digits_elastic.py's flags")
    args = parser.parse_args()
    train_argv = args.train[1:] if args.train[:1] == ["--"] else args.train
    if "--target" not in train_argv:
        train_argv += ["--target", str(args.target)]

    ray.init(address=args.address)
    settings = RayExecutor.create_settings(timeout_s=120)
    if args.min_workers is not None:
        executor = RayExecutor(settings, min_workers=args.min_workers, max_workers=args.max_workers,
                               cpus_per_worker=args.cpus_per_worker, use_gpu=args.use_gpu)
    elif args.num_hosts is not None:
        executor = RayExecutor(settings, num_hosts=args.num_hosts, num_workers_per_host=args.workers_per_host,
                               cpus_per_worker=args.cpus_per_worker, use_gpu=args.use_gpu)
    else:
        executor = RayExecutor(settings, num_workers=args.num_workers or 2, cpus_per_worker=args.cpus_per_worker,
                               use_gpu=args.use_gpu)
    executor.start()
    try:
        accuracies = executor.run(work, args=[EXAMPLES, train_argv])
    finally:
        executor.shutdown()
    print(f"workers' test accuracy: {', '.join(f'{a:.4f}' for a in accuracies)}", flush=True)
    reached = bool(accuracies) and min(accuracies) >= args.target
    print(f"{'reached' if reached else 'MISSED'} target accuracy {args.target:.2f} on {len(accuracies)} worker(s)",
          flush=True)
    return 0 if reached else 1


if __name__ == "__main__":
    sys.exit(main())
