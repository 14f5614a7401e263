"""load_model through commlib.keras and commlib.tensorflow.keras gives back the model as it was compiled:
the optimizer with its state, wrapped so that it still reduces over the ranks, the loss and the metrics.

    python keras_load_model.py ENTRY [ENTRY ...]    (ENTRY: commlib.keras or commlib.tensorflow.keras)

The Keras is the environment's: KERAS_BACKEND for Keras 3, TF_USE_LEGACY_KERAS=1 for tf-keras (then the
entry is commlib.tensorflow.keras). Each check is a named case; every rank prints ``case NAME ok rank R``.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile

import numpy as np

from worker import run

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


def check_entry(hvd, keras, me: int, n: int, tag: str) -> list[str]:
    """Train, save, load; the loaded model's compile state and its optimizer's behaviour."""
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
    expected = model.evaluate(x, y, verbose=0, return_dict=True)
    passed = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        loaded = hvd.load_model(path)

    got = loaded.evaluate(x, y, verbose=0, return_dict=True)
    assert sorted(got) == sorted(expected), f"{tag}: loaded model evaluates {sorted(got)}, saved {sorted(expected)}"
    for key in expected:
        assert np.isclose(got[key], expected[key], rtol=1e-5), f"{tag}: {key} {got[key]} != {expected[key]}"
    passed.append(f"{tag}.loss_and_metrics")

    opt = loaded.optimizer
    assert isinstance(opt, keras.optimizers.Adam), f"{tag}: loaded optimizer {type(opt)}"
    assert int(values([opt.iterations])[0]) == int(values([model.optimizer.iterations])[0]) == 2, \
        f"{tag}: iterations {opt.iterations} after load, {model.optimizer.iterations} saved"
    saved_state, loaded_state = values(model.optimizer.variables), values(opt.variables)
    assert len(saved_state) == len(loaded_state), (len(saved_state), len(loaded_state))
    for a, b in zip(saved_state, loaded_state):
        assert np.array_equal(a, b), f"{tag}: an optimizer variable changed in save and load"
    passed.append(f"{tag}.optimizer_state")

    loaded.fit(x, y, batch_size=ROWS // 2, epochs=1, shuffle=False, verbose=0)  # different data per rank
    weights = np.concatenate([w.reshape(-1) for w in loaded.get_weights()])
    every = hvd.allgather_object(weights)
    for r, other in enumerate(every):
        assert np.allclose(other, weights, rtol=0, atol=1e-6), \
            f"{tag}: rank {r}'s weights differ after training the loaded model: its optimizer did not reduce"
    assert not np.allclose(weights, np.concatenate([w.reshape(-1) for w in model.get_weights()])), tag
    passed.append(f"{tag}.optimizer_distributed")
    return passed


def main():
    entries = sys.argv[1:]
    first = importlib.import_module(entries[0])
    first.init()
    me, n = first.rank(), first.size()
    legacy = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
    flavour = "tf-keras" if legacy else os.environ.get("KERAS_BACKEND", "tensorflow")
    for entry in entries:
        hvd = importlib.import_module(entry)
        for case in check_entry(hvd, keras_of(entry), me, n, f"{entry}[{flavour}]"):
            print(f"case {case} ok rank {me}", flush=True)
    first.shutdown()


if __name__ == "__main__":
    run(main)
