"""Keras 3 model.fit with commlib.keras.DistributedOptimizer on N ranks gives the weights of one process
training on the combined batch (the backend comes from KERAS_BACKEND: tensorflow or torch); the callbacks
broadcast the variables, average the metrics and set the learning rate."""

from __future__ import annotations

import os

import numpy as np

import keras
import commlib.keras as hvd
import spmd

STEPS, BATCH, FEATURES = 4, 6, 5


def model_and_data(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(1)])
    rng = np.random.default_rng(1)
    x = rng.standard_normal((STEPS * BATCH, FEATURES)).astype(np.float32)
    y = rng.standard_normal((STEPS * BATCH, 1)).astype(np.float32)
    return model, x, y


def check_accumulation(me, n, x, y):
    """backward_passes_per_step=2, average_aggregated_gradients=True: two passes of each rank, reduced once
    and applied every other step, give one process's step on the four batches combined."""
    if keras.backend.backend() == "jax":  # not built there: a clear error at construction, never a wrong step
        try:
            hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2)
        except NotImplementedError as exc:
            assert "JAX backend" in str(exc), exc
            return
        raise AssertionError("backward_passes_per_step=2 on the JAX backend was accepted")
    per_rank = BATCH // n
    model, _, _ = model_and_data(seed=0)
    reference, _, _ = model_and_data(seed=0)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2,
                                   average_aggregated_gradients=True)
    model.compile(optimizer=opt, loss="mse")
    order = np.concatenate([np.arange(s * BATCH, (s + 1) * BATCH)[me::n][:per_rank] for s in range(STEPS)])
    model.fit(x[order], y[order], batch_size=per_rank, epochs=1, shuffle=False, verbose=0)
    rows = [np.arange(s * BATCH, (s + 1) * BATCH)[r::n][:per_rank] for s in range(STEPS) for r in range(n)]
    combined = np.concatenate(rows)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    reference.fit(x[combined], y[combined], batch_size=2 * per_rank * n, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        assert np.allclose(a, b, atol=1e-5), f"backward_passes_per_step=2: weights differ: {np.abs(a - b).max()}"
    assert int(np.asarray(opt.iterations)) == STEPS // 2, f"{STEPS} passes made {opt.iterations} updates"


@spmd.case
def init():
    hvd.init()


@spmd.case
def runs_on_the_backend_asked_for():
    assert keras.backend.backend() == os.environ["KERAS_BACKEND"], (keras.backend.backend(),
                                                                   os.environ["KERAS_BACKEND"])


@spmd.case
def fit_matches_one_process_and_the_callbacks_work():
    me, n = hvd.rank(), hvd.size()
    backend = keras.backend.backend()
    # every rank starts from different weights: the callback must give them rank 0's
    model, x, y = model_and_data(seed=me)
    reference, _, _ = model_and_data(seed=0)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    assert isinstance(opt, keras.optimizers.SGD), type(opt)
    model.compile(optimizer=opt, loss="mse")
    # rank r trains on rows r, r+n, ... of each global batch of n*BATCH/n rows: the global batch is BATCH
    per_rank = BATCH // n
    order = np.concatenate([np.arange(s * BATCH, (s + 1) * BATCH)[me::n][:per_rank] for s in range(STEPS)])
    used = np.concatenate([np.arange(s * BATCH, (s + 1) * BATCH).reshape(-1)[:per_rank * n] for s in range(STEPS)])
    broadcast = hvd.BroadcastGlobalVariablesCallback(0)
    # the broadcast runs after the first batch: start everyone from rank 0's weights before it as well
    hvd.broadcast_variables(model.variables, root_rank=0)
    model.fit(x[order], y[order], batch_size=per_rank, epochs=1, shuffle=False, verbose=0,
              callbacks=[broadcast, hvd.MetricAverageCallback()])
    # one process, the combined batch of each step (the same rows, the mean loss over them)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    combined = np.concatenate([np.concatenate([x[s * BATCH:(s + 1) * BATCH][r::n][:per_rank] for r in range(n)])
                               for s in range(STEPS)])
    combined_y = np.concatenate([np.concatenate([y[s * BATCH:(s + 1) * BATCH][r::n][:per_rank] for r in range(n)])
                                 for s in range(STEPS)])
    del used
    reference.fit(combined, combined_y, batch_size=per_rank * n, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        assert np.allclose(a, b, atol=1e-5), f"{backend}: weights differ from one process: {np.abs(a - b).max()}"
    everyone = hvd.allgather_object if hasattr(hvd, "allgather_object") else None
    del everyone
    # warmup: the learning rate ends the warm-up at the initial rate
    warm = hvd.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=1, steps_per_epoch=STEPS)
    model.fit(x[order], y[order], batch_size=per_rank, epochs=1, shuffle=False, verbose=0, callbacks=[warm])
    lr = float(np.asarray(model.optimizer.learning_rate))
    assert abs(lr - 0.1) < 1e-6, f"after warm-up the learning rate is {lr}"
    check_accumulation(me, n, x, y)


@spmd.case
def shutdown():
    hvd.shutdown()


if __name__ == "__main__":
    spmd.main()
