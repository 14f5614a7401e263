"""commlib.tensorflow.keras has horovod.tensorflow.keras's names, and commlib.keras horovod.keras's process
and build queries, with Horovod's defaults; both entry points are one implementation.

The lists are read from Horovod 0.28.1's modules (github.com/horovod/horovod, tag v0.28.1):
``horovod/tensorflow/keras/__init__.py`` re-exports ``TF_REEXPORTS`` from horovod.tensorflow (its imports
from ``horovod.tensorflow``, ``horovod.tensorflow.mpi_ops`` and ``horovod.tensorflow.compression``) and
defines ``TF_KERAS_OWN``; ``horovod/keras/__init__.py`` imports ``KERAS_REEXPORTS`` the same way. The
defaults are those of their ``DistributedOptimizer`` and ``load_model``. Each check runs in a fresh Python
(TensorFlow and Keras are imported there, not in pytest), once with Keras 3 as tf.keras and once with
tf-keras (``TF_USE_LEGACY_KERAS=1``).
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from mpirun import REPO  # noqa: E402

TF_REEXPORTS = [
    "init", "shutdown", "is_initialized", "start_timeline", "stop_timeline", "size", "local_size", "cross_size",
    "rank", "local_rank", "cross_rank", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled",
    "gloo_built", "ProcessSet", "global_process_set", "add_process_set", "remove_process_set", "nccl_built",
    "ddl_built", "ccl_built", "cuda_built", "rocm_built", "Average", "Sum", "Compression",
]
TF_KERAS_OWN = ["DistributedOptimizer", "broadcast_global_variables", "allreduce", "allgather", "broadcast",
                "reducescatter", "load_model", "callbacks", "elastic"]
KERAS_REEXPORTS = [
    "init", "shutdown", "size", "local_size", "cross_size", "rank", "local_rank", "cross_rank", "is_initialized",
    "start_timeline", "stop_timeline", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled",
    "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "Average", "Sum", "Adasum",
    "Compression", "global_process_set",
]
#: horovod.tensorflow.keras.DistributedOptimizer's parameters, in order, with their defaults (by name)
OPTIMIZER_DEFAULTS = [
    ("optimizer", None), ("name", "None"), ("device_dense", "''"), ("device_sparse", "''"),
    ("compression", "Compression.none"), ("sparse_as_dense", "False"), ("gradient_predivide_factor", "1.0"),
    ("op", "Average"), ("backward_passes_per_step", "1"), ("average_aggregated_gradients", "False"),
    ("num_groups", "0"), ("groups", "None"), ("process_set", "global_process_set"),
    ("scale_local_gradients", "True"),
]
LOAD_MODEL_DEFAULTS = [("filepath", None), ("custom_optimizers", "None"), ("custom_objects", "None"),
                       ("compression", "Compression.none"), ("legacy_opts", "False")]

PROBE = r"""
import inspect, json, sys
import commlib, commlib.keras as k, commlib.tensorflow as t, commlib.tensorflow.keras as tk
tf_reexports, tf_keras_own, keras_reexports = json.loads(sys.argv[1])
named = {"Compression.none": tk.Compression.none, "Average": commlib.Average,
         "global_process_set": commlib.global_process_set}

def described(value):
    for label, known in named.items():
        if value is known:
            return label
    return repr(value)

def parameters(func):
    return [(p.name, None if p.default is p.empty else described(p.default))
            for p in inspect.signature(func).parameters.values()]

print(json.dumps({
    "tf_keras_missing": [n for n in tf_reexports + tf_keras_own if not hasattr(tk, n)],
    "not_commlib_tensorflows": [n for n in tf_reexports if hasattr(tk, n) and getattr(tk, n) is not getattr(t, n)],
    "keras_missing": [n for n in keras_reexports if not hasattr(k, n)],
    "optimizer": {"commlib.keras": parameters(k.DistributedOptimizer),
                  "commlib.tensorflow.keras": parameters(tk.DistributedOptimizer)},
    "load_model": {"commlib.keras": parameters(k.load_model),
                   "commlib.tensorflow.keras": parameters(tk.load_model)},
    "one_implementation": [name for name in ("DistributedOptimizer", "PartialDistributedOptimizer",
                                             "broadcast_variables")
                           if getattr(k, name) is not getattr(tk, name)],
}))
"""


@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf-keras"])
def test_horovod_keras_names_and_defaults(legacy):
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    if legacy:
        env["TF_USE_LEGACY_KERAS"] = "1"
    args = json.dumps([TF_REEXPORTS, TF_KERAS_OWN, KERAS_REEXPORTS])
    proc = subprocess.run([sys.executable, "-c", PROBE, args], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["tf_keras_missing"] == [], "horovod.tensorflow.keras names missing from commlib.tensorflow.keras"
    assert found["not_commlib_tensorflows"] == [], "re-exports that are not commlib.tensorflow's own objects"
    assert found["keras_missing"] == [], "horovod.keras's names missing from commlib.keras"
    for entry in ("commlib.keras", "commlib.tensorflow.keras"):
        assert [list(p) for p in OPTIMIZER_DEFAULTS] == found["optimizer"][entry], entry
        assert [list(p) for p in LOAD_MODEL_DEFAULTS] == found["load_model"][entry], entry
    assert found["one_implementation"] == [], "names that differ between commlib.keras and commlib.tensorflow.keras"
