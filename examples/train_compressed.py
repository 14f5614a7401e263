"""Train a 20.5M-parameter text classifier data-parallel with gradient compression or LocalSGD.

    mpiexec -n 2 python examples/train_compressed.py --compression dgc

The model is a bag-of-tokens classifier (fastText style): an ``EmbeddingBag`` of 160,000 tokens x 128
(20.48M parameters, dense gradients as DDP and Horovod send them by default) and a small MLP head. It
does little arithmetic per parameter, so over a 1 Gbit/s link its step is dominated by moving the 82 MB
gradient: the case compression is for. The data set is generated here (nothing is downloaded): each of
10 classes owns 400 topic tokens; a document is 64 tokens, each drawn from its class's topics with
probability ``--signal`` and uniformly from the vocabulary otherwise. Every rank generates the same data
and trains on its own shard.

``--compression``:
  none      DistributedOptimizer, SGD with momentum 0.9
  fp16      the same, gradients in float16 on the wire (float32 accumulation)
  topk      Compression.topk(--ratio) with error feedback, SGD with momentum 0.9
  dgc       Compression.dgc (momentum correction inside; SGD without momentum), warm-up of sparsities
  powersgd  Compression.powersgd(rank=--rank, start_step=10), SGD with momentum 0.9
  localsgd  LocalSGDOptimizer(SGD with momentum 0.9, PeriodicModelAverager(--period, warmup_steps=10))

Every ``--eval-every`` steps the test accuracy (mean over ranks' models) is measured outside the training
clock. Training stops at ``--target`` accuracy or after ``--max-steps``; rank 0 prints one line
``RESULT {...}`` (JSON: time per step, training time to the target, final accuracy) and writes it to
``--json``. Exits non-zero when the target was not reached.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import commlib.torch as hvd

VOCAB, DIM, CLASSES, LENGTH, TOPIC = 160_000, 128, 10, 64, 400


def make_documents(count: int, seed: int, signal: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` documents of token ids and their labels, the same on every rank."""
    topics = np.random.default_rng(99).choice(VOCAB, (CLASSES, TOPIC), replace=False)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, count)
    docs = rng.integers(0, VOCAB, (count, LENGTH))
    own = rng.random((count, LENGTH)) < signal
    docs[own] = topics[np.broadcast_to(labels[:, None], own.shape)[own], rng.integers(0, TOPIC, own.sum())]
    return torch.from_numpy(docs), torch.from_numpy(labels)


class BagOfTokens(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.EmbeddingBag(VOCAB, DIM, mode="sum")
        torch.nn.init.normal_(self.embedding.weight, 0.0, 0.05)
        self.head = torch.nn.Sequential(torch.nn.Linear(DIM, 256), torch.nn.ReLU(), torch.nn.Linear(256, CLASSES))

    def forward(self, docs):
        return self.head(self.embedding(docs))


def make_optimizer(args, model):
    """The optimizer for ``--compression`` (see the module docstring)."""
    C = hvd.Compression
    named = model.named_parameters()
    momentum = 0.0 if args.compression == "dgc" else 0.9
    sgd = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=momentum)
    if args.compression == "localsgd":
        return hvd.LocalSGDOptimizer(sgd, hvd.PeriodicModelAverager(period=args.period, warmup_steps=10))
    compression = {
        "none": C.none,
        "fp16": C.fp16,
        "topk": C.topk(args.ratio),
        "dgc": C.dgc(momentum=0.9, rampup_begin_step=0, rampup_step=args.rampup),
        "powersgd": C.powersgd(rank=args.rank, start_step=10),
    }[args.compression]
    return hvd.DistributedOptimizer(sgd, named_parameters=named, compression=compression)


def accuracy(model, docs, labels) -> float:
    """Test accuracy averaged over the ranks' models (they differ between LocalSGD's averaging steps)."""
    with torch.no_grad():
        mine = (model(docs).argmax(1) == labels).float().mean()
    return float(hvd.allreduce(mine.reshape(1), name="eval.accuracy")[0])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compression", choices=["none", "fp16", "topk", "dgc", "powersgd", "localsgd"],
                        default="none")
    parser.add_argument("--target", type=float, default=0.9, help="test accuracy to reach (default 0.9)")
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=32, help="documents per rank and step")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--signal", type=float, default=0.15, help="share of topic tokens per document")
    parser.add_argument("--ratio", type=float, default=0.001, help="topk: share of values sent")
    parser.add_argument("--rampup", type=int, default=20, help="dgc: steps of the sparsity warm-up")
    parser.add_argument("--rank", type=int, default=4, help="powersgd: rank of the approximation")
    parser.add_argument("--period", type=int, default=8, help="localsgd: steps between model averages")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--json", help="write rank 0's result here")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    train_docs, train_labels = make_documents(20_000, 1, args.signal)
    test_docs, test_labels = make_documents(2_000, 2, args.signal)
    train_docs, train_labels = train_docs[rank::size], train_labels[rank::size]
    torch.manual_seed(0)
    model = BagOfTokens()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = make_optimizer(args, model)
    parameters = sum(p.numel() for p in model.parameters())

    step_times, history = [], []
    trained = 0.0
    reached_at = None
    acc = accuracy(model, test_docs, test_labels)
    per_epoch = train_docs.shape[0] // args.batch
    for step in range(args.max_steps):
        i = (step % per_epoch) * args.batch
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=False)  # reuse the 82 MB gradient buffer
        F.cross_entropy(model(train_docs[i:i + args.batch]), train_labels[i:i + args.batch]).backward()
        optimizer.step()
        took = time.perf_counter() - start
        step_times.append(took)
        trained += took
        if (step + 1) % args.eval_every == 0:
            acc = accuracy(model, test_docs, test_labels)
            history.append((step + 1, round(trained, 3), round(acc, 4)))
            if rank == 0:
                print(f"step {step + 1:4d}  train time {trained:7.2f} s  test accuracy {acc:.4f}", flush=True)
            if acc >= args.target:
                reached_at = (step + 1, trained)
                break
    result = {
        "compression": args.compression, "ranks": size, "parameters": parameters, "batch_per_rank": args.batch,
        "target": args.target, "reached": reached_at is not None,
        "steps_to_target": reached_at[0] if reached_at else None,
        "time_to_target_s": round(reached_at[1], 3) if reached_at else None,
        "median_step_s": round(float(np.median(step_times)), 4), "final_accuracy": round(acc, 4),
        "steps": len(step_times), "history": history,
    }
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
        if args.json:
            with open(args.json, "w") as out:
                json.dump(result, out)
    hvd.shutdown()
    if reached_at is None:
        print(f"[rank {rank}] did not reach test accuracy {args.target} in {args.max_steps} steps", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
