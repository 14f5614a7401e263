"""load_model through commlib.keras and commlib.tensorflow.keras gives back the model as it was compiled:
the optimizer with its state, wrapped so that it still reduces over the ranks, the loss and the metrics.

    python keras_load_model.py ENTRY [ENTRY ...]    (ENTRY: commlib.keras or commlib.tensorflow.keras)

The Keras is the environment's: KERAS_BACKEND for Keras 3, TF_USE_LEGACY_KERAS=1 for tf-keras (then the
entry is commlib.tensorflow.keras). The checks are named cases per rank (tests/spmd.py): for each ENTRY,
``ENTRY.loss_and_metrics``, ``ENTRY.optimizer_state`` and ``ENTRY.optimizer_distributed``.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile

import numpy as np

import spmd

FEATURES, ROWS = 4, 8


def keras_of(entry: str):
    if entry == "commlib.tensorflow.keras":
        import tensorflow as tf

        return tf.keras
    import keras

    return keras


def values(variables) -> list[np.ndarray]:
    variables = variables() if callable(variables) else variables  # optimizer v2's variables() is a method
    return [np.array(v.numpy() if hasattr(v, "numpy") else v) for v in variables]


def train_save_load(hvd, keras, me: int) -> dict:
    """Train, save, load: the saved model, the loaded one and the data."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(3, activation="tanh"),
                              keras.layers.Dense(2)])
    rng = np.random.default_rng(me)  # each rank its own data: only a distributed step keeps them equal
    x = rng.standard_normal((ROWS, FEATURES)).astype(np.float32)
    y = rng.standard_normal((ROWS, 2)).astype(np.float32)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse",
                  metrics=["mae", keras.metrics.RootMeanSquaredError(name="rmse")])
    hvd.broadcast_variables(model.variables, root_rank=0)
    model.fit(x, y, batch_size=ROWS // 2, epochs=1, shuffle=False, verbose=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        loaded = hvd.load_model(path)
    return {"model": model, "loaded": loaded, "x": x, "y": y}


def entry_cases(entry: str) -> None:
    """Register the cases of one entry point (the first trains, saves and loads)."""
    hvd, keras, got = importlib.import_module(entry), keras_of(entry), {}

    def loss_and_metrics():
        got.update(train_save_load(hvd, keras, hvd.rank()))
        model, loaded, x, y = got["model"], got["loaded"], got["x"], got["y"]
        expected = model.evaluate(x, y, verbose=0, return_dict=True)
        back = loaded.evaluate(x, y, verbose=0, return_dict=True)
        assert sorted(back) == sorted(expected), f"loaded model evaluates {sorted(back)}, saved {sorted(expected)}"
        for key in expected:
            assert np.isclose(back[key], expected[key], rtol=1e-5), f"{key} {back[key]} != {expected[key]}"

    def optimizer_state():
        model, opt = got["model"], got["loaded"].optimizer
        assert isinstance(opt, keras.optimizers.Adam), f"loaded optimizer {type(opt)}"
        assert int(values([opt.iterations])[0]) == int(values([model.optimizer.iterations])[0]) == 2, \
            f"iterations {opt.iterations} after load, {model.optimizer.iterations} saved"
        saved_state, loaded_state = values(model.optimizer.variables), values(opt.variables)
        assert len(saved_state) == len(loaded_state), (len(saved_state), len(loaded_state))
        for a, b in zip(saved_state, loaded_state):
            assert np.array_equal(a, b), "an optimizer variable changed in save and load"

    def optimizer_distributed():
        model, loaded, x, y = got["model"], got["loaded"], got["x"], got["y"]
        loaded.fit(x, y, batch_size=ROWS // 2, epochs=1, shuffle=False, verbose=0)  # different data per rank
        weights = np.concatenate([w.reshape(-1) for w in loaded.get_weights()])
        for r, other in enumerate(hvd.allgather_object(weights)):
            assert np.allclose(other, weights, rtol=0, atol=1e-6), \
                f"rank {r}'s weights differ after training the loaded model: its optimizer did not reduce"
        assert not np.allclose(weights, np.concatenate([w.reshape(-1) for w in model.get_weights()]))

    for check in (loss_and_metrics, optimizer_state, optimizer_distributed):
        check.__name__ = f"{entry}.{check.__name__}"
        spmd.case(check)


if __name__ == "__main__":
    entries = sys.argv[1:]
    first = importlib.import_module(entries[0])
    spmd.case(first.init)
    for name in entries:
        entry_cases(name)
    spmd.case(first.shutdown)
    spmd.main()
