"""Train a digit classifier data-parallel with commlib.jax and optax (a plain JAX model, a jitted step).

    mpiexec -n 2 python examples/train_digits_jax.py

The data are the examples' generated digits (examples/digits.py). Every rank generates the same images
and trains on its own shard; ``cj.DistributedOptimizer`` averages the gradient pytree over the ranks
inside the jitted step, as one grouped allreduce. Each epoch prints the loss, the train and test accuracy
and the samples per second over all ranks. The script exits non-zero if the final test accuracy misses
``--target``.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp
import optax

import commlib.jax as cj
from digits import SIDE, make_digits


def init_params(key):
    """A small CNN: two 3x3 convolutions with 2x2 max pooling, then a dense layer (NHWC, HWIO)."""
    k1, k2, k3 = jax.random.split(key, 3)

    def he(k, shape, fan_in):
        return jax.random.normal(k, shape, jnp.float32) * jnp.sqrt(2.0 / fan_in)

    return {"conv1": {"w": he(k1, (3, 3, 1, 16), 9), "b": jnp.zeros(16)},
            "conv2": {"w": he(k2, (3, 3, 16, 32), 9 * 16), "b": jnp.zeros(32)},
            "dense": {"w": he(k3, (32 * (SIDE // 4) ** 2, 10), 32 * (SIDE // 4) ** 2), "b": jnp.zeros(10)}}


def apply(params, images):
    x = images.reshape(-1, SIDE, SIDE, 1)
    for layer in ("conv1", "conv2"):
        x = jax.lax.conv_general_dilated(x, params[layer]["w"], (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC")) + params[layer]["b"]
        x = jax.lax.reduce_window(jax.nn.relu(x), -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    return x.reshape(x.shape[0], -1) @ params["dense"]["w"] + params["dense"]["b"]


def loss_fn(params, images, labels):
    return optax.softmax_cross_entropy_with_integer_labels(apply(params, images), labels).mean()


def evaluate(params, images, labels) -> tuple[float, float]:
    """Mean loss and accuracy over every rank's shard of the given set."""
    logits = apply(params, images)
    totals = jnp.stack([optax.softmax_cross_entropy_with_integer_labels(logits, labels).sum(),
                        (logits.argmax(1) == labels).sum(), len(labels)]).astype(jnp.float32)
    loss_sum, correct, count = np.asarray(cj.allreduce(totals, op=cj.Sum, name="evaluate"), np.float64)
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

    cj.init()
    rank, size = cj.rank(), cj.size()
    train_x, train_y = make_digits(args.train_size, seed=args.seed)
    test_x, test_y = make_digits(args.test_size, seed=args.seed + 1)
    test_x, test_y = jnp.asarray(test_x[rank::size]), jnp.asarray(test_y[rank::size])

    # different on purpose on every rank: broadcast_parameters gives every rank rank 0's
    params = cj.broadcast_parameters(init_params(jax.random.PRNGKey(args.seed + rank)), root_rank=0)
    tx = cj.DistributedOptimizer(optax.sgd(args.lr * size, momentum=0.9),
                                 compression=getattr(cj.Compression, args.compression))
    opt_state = tx.init(params)

    @jax.jit
    def train_step(params, opt_state, images, labels):
        grads = jax.grad(loss_fn)(params, images, labels)
        updates, opt_state = tx.update(grads, opt_state, params)  # the allreduce runs here, inside jit
        return optax.apply_updates(params, updates), opt_state

    # every rank takes the same number of steps per epoch (no rank may wait for an allreduce in vain)
    steps = args.train_size // (size * args.batch_size)
    if rank == 0:
        print(f"training on {size} rank(s): {args.train_size} images, {steps} steps of "
              f"{args.batch_size} per rank per epoch, target test accuracy {args.target:.2f}", flush=True)
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        order = np.random.default_rng(args.seed + epoch).permutation(args.train_size)[rank::size]
        xs, ys = jnp.asarray(train_x[order]), jnp.asarray(train_y[order])
        start = time.perf_counter()
        for step in range(steps):
            batch = slice(step * args.batch_size, (step + 1) * args.batch_size)
            params, opt_state = train_step(params, opt_state, xs[batch], ys[batch])
        jax.block_until_ready(params)
        elapsed = float(cj.allreduce(jnp.asarray([time.perf_counter() - start]), op=cj.Max, name="epoch.time")[0])
        used = steps * args.batch_size
        train_loss, train_accuracy = evaluate(params, xs[:used], ys[:used])
        _, accuracy = evaluate(params, test_x, test_y)
        if rank == 0:
            print(f"epoch {epoch:2d}  loss {train_loss:.4f}  train accuracy {train_accuracy:.4f}  "
                  f"test accuracy {accuracy:.4f}  {used * size / elapsed:,.0f} samples/s", flush=True)
    reached = accuracy >= args.target
    if rank == 0:
        verdict = "reached" if reached else "MISSED"
        print(f"{verdict} target accuracy {args.target:.2f}: test accuracy {accuracy:.4f}", flush=True)
    cj.shutdown()
    return 0 if reached else 1


if __name__ == "__main__":
    sys.exit(main())
