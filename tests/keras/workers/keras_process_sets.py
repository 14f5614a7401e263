"""DistributedOptimizer(process_set=...) through commlib.keras and commlib.tensorflow.keras: a set's ranks
apply the set's mean gradient, a rank outside it its own (as Horovod's test_tensorflow2_keras_process_sets
expects), also with backward_passes_per_step=2 summing two passes.

    python keras_process_sets.py ENTRY [ENTRY ...]

The checks are named cases per rank (tests/spmd.py): ``ENTRY.passes1`` and ``ENTRY.passes2``.
"""

from __future__ import annotations

import importlib
import sys

import numpy as np

import spmd


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


def keras_of(entry: str):
    if entry == "commlib.tensorflow.keras":
        import tensorflow as tf

        return tf.keras
    import keras

    return keras


SETS = {}


@spmd.case
def init():
    first = importlib.import_module(sys.argv[1])
    size = spmd.rank_and_size()[1]
    SETS["evens"], odds = first.ProcessSet(range(0, size, 2)), first.ProcessSet(range(1, size, 2))
    first.init(process_sets=[SETS["evens"], odds])


def entry_cases(entry: str) -> None:
    for passes in (1, 2):
        def run_check(passes=passes):
            hvd = importlib.import_module(entry)
            check(hvd, keras_of(entry), SETS["evens"], hvd.rank(), passes)
        run_check.__name__ = f"{entry}.passes{passes}"
        spmd.case(run_check)


if __name__ == "__main__":
    for name in sys.argv[1:]:
        entry_cases(name)
    spmd.case(importlib.import_module(sys.argv[1]).shutdown)
    spmd.main()
