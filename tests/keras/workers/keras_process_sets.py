"""DistributedOptimizer(process_set=...) through commlib.keras and commlib.tensorflow.keras: a set's ranks
apply the set's mean gradient, a rank outside it its own (as Horovod's test_tensorflow2_keras_process_sets
expects), also with backward_passes_per_step=2 summing two passes.

    python keras_process_sets.py ENTRY [ENTRY ...]

Every rank prints ``case NAME ok rank R`` for each check that passed.
"""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np

from worker import run


def check(hvd, keras, evens, rank: int, passes: int) -> None:
    variable = keras.Variable([0.0]) if hasattr(keras, "Variable") else None
    if variable is None:  # tf-keras
        import tensorflow as tf

        variable = tf.Variable([0.0])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), process_set=evens,
                                   backward_passes_per_step=passes)
    for _ in range(passes):
        opt.apply_gradients([(np.array([float(rank + 1)], np.float32), variable)])
    got = float(np.asarray(variable.numpy() if hasattr(variable, "numpy") else variable)[0])
    if evens.included():
        want = -passes * np.mean([r + 1.0 for r in evens.ranks])
    else:
        want = -passes * (rank + 1.0)
    assert np.isclose(got, want), f"rank {rank} (evens {evens.ranks}), {passes} pass(es): {got} != {want}"


def main():
    entries = sys.argv[1:]
    first = importlib.import_module(entries[0])
    size = int(os.environ.get("PMI_SIZE") or os.environ["OMPI_COMM_WORLD_SIZE"])
    evens, odds = first.ProcessSet(range(0, size, 2)), first.ProcessSet(range(1, size, 2))
    first.init(process_sets=[evens, odds])
    rank = first.rank()
    flavour = "tf-keras" if os.environ.get("TF_USE_LEGACY_KERAS") == "1" else "keras3"
    for entry in entries:
        hvd = importlib.import_module(entry)
        if entry == "commlib.tensorflow.keras":
            import tensorflow as tf

            keras = tf.keras
        else:
            import keras
        for passes in (1, 2):
            check(hvd, keras, evens, rank, passes)
            print(f"case {entry}[{flavour}].passes{passes} ok rank {rank}", flush=True)
    first.shutdown()


if __name__ == "__main__":
    run(main)
