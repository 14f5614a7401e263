"""Train a Keras 3 digit classifier with ``model.fit`` on several ranks with commlib.keras.

    mpiexec -n 2 python examples/keras_digits.py                       # KERAS_BACKEND=tensorflow (default)
    KERAS_BACKEND=torch mpiexec -n 2 python examples/keras_digits.py

The data are scikit-learn's 8x8 handwritten digits (shipped with scikit-learn: nothing is downloaded).
Every rank loads them, shuffles them with the same seed and trains on its own shard; ``DistributedOptimizer``
averages the gradients, ``BroadcastGlobalVariablesCallback`` starts every rank from rank 0's weights,
``MetricAverageCallback`` averages the logged metrics, and the learning rate (scaled by the number of ranks)
warms up over the first epoch. Rank 0 prints the test accuracy; the script exits non-zero if it misses
``--target``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from sklearn.datasets import load_digits

import keras
import commlib.keras as hvd


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch", type=int, default=32, help="per-rank batch size")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate for one rank")
    parser.add_argument("--target", type=float, default=0.95, help="test accuracy the run must reach")
    args = parser.parse_args()

    hvd.init()
    keras.utils.set_random_seed(1234 + hvd.rank())  # different initial weights: the broadcast aligns them
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    x_train, y_train, x_test, y_test = x[:split], y[:split], x[split:], y[split:]
    x_train, y_train = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    lr = args.lr * hvd.size()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    steps = int(np.ceil(len(x_train) / args.batch))
    callbacks = [hvd.BroadcastGlobalVariablesCallback(0), hvd.MetricAverageCallback(),
                 hvd.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=1, steps_per_epoch=steps)]
    model.fit(x_train, y_train, batch_size=args.batch, epochs=args.epochs, callbacks=callbacks,
              verbose=2 if hvd.rank() == 0 else 0)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    weights = hvd.allgather_object([w.tobytes() for w in model.get_weights()])
    assert all(w == weights[0] for w in weights), "ranks ended with different weights"
    if hvd.rank() == 0:
        print(f"{keras.backend.backend()} backend, {hvd.size()} ranks: test accuracy {accuracy:.4f}", flush=True)
        if accuracy >= args.target:
            print(f"reached target accuracy {args.target}", flush=True)
    hvd.shutdown()
    return 0 if accuracy >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
