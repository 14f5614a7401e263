"""Keras ``model.fit`` step time on 2 ranks of one host: commlib vs tf.distribute's
MultiWorkerMirroredStrategy vs no communication, at the same global batch.

    flock /tmp/commlib-timing.lock .venv/bin/python scripts/bench_keras.py [--rounds 3] [--steps 8]

The model is an MLP of about 25 M parameters (1024-4096-4096-1024-10, float32) on random data. Each mode
runs as its own 2-process job, per-rank batch ``--batch`` (global batch twice that):

- ``local``: two processes each fitting alone, no communication (the compute floor under the same CPU
  sharing);
- ``commlib``: ``mpiexec -n 2``, ``commlib.tensorflow.keras.DistributedOptimizer`` (gradients averaged in
  one grouped allreduce per step);
- ``mwms``: two processes with ``TF_CONFIG`` on 127.0.0.1, ``tf.distribute.MultiWorkerMirroredStrategy``
  (TensorFlow's own collective ops over gRPC), model built and compiled in the strategy's scope.

Every mode runs on tf-keras (``TF_USE_LEGACY_KERAS=1``): Keras 3's ``fit`` does not take the strategy's
distributed dataset. Modes are interleaved round by round. A job reports the median of its step times after one warm-up
epoch (a Keras callback times each ``train_batch``); the table gives the median over rounds of the slowest
rank. Run under the timing lock: only one measurement at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAYERS = [1024, 4096, 4096, 1024, 10]


def build(keras):
    model = keras.Sequential([keras.Input((LAYERS[0],))] +
                             [keras.layers.Dense(n, activation="relu") for n in LAYERS[1:-1]] +
                             [keras.layers.Dense(LAYERS[-1])])
    return model


def worker(mode: str, batch: int, steps: int) -> None:
    import numpy as np
    import tensorflow as tf

    keras = tf.keras  # tf-keras (TF_USE_LEGACY_KERAS=1): MultiWorkerMirroredStrategy needs Keras 2's fit

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self.start)

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(0)
    if mode == "mwms":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        rank = strategy.cluster_resolver.task_id
        with strategy.scope():
            model = build(keras)
            model.compile(optimizer=keras.optimizers.SGD(0.01), loss=loss)
        global_batch = batch * strategy.num_replicas_in_sync
        x = rng.standard_normal((global_batch * (steps + 1), LAYERS[0])).astype(np.float32)
        y = rng.integers(0, 10, len(x))
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch).repeat()
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        data = data.with_options(options)
        fit = dict(x=data, steps_per_epoch=steps)
    else:
        import commlib.tensorflow.keras as hvd

        hvd.init()
        rank = hvd.rank()
        model = build(keras)
        optimizer = keras.optimizers.SGD(0.01)
        if mode == "commlib":
            optimizer = hvd.DistributedOptimizer(optimizer)
        model.compile(optimizer=optimizer, loss=loss)
        x = rng.standard_normal((batch * steps, LAYERS[0])).astype(np.float32)
        y = rng.integers(0, 10, len(x))
        fit = dict(x=x, y=y, batch_size=batch)
    params = model.count_params()
    model.fit(**fit, epochs=1, verbose=0)  # warm-up: tracing, first allocations
    timer = Timer()
    model.fit(**fit, epochs=1, verbose=0, callbacks=[timer])
    print("RESULT " + json.dumps({"mode": mode, "rank": rank, "params": params,
                                  "step_s": statistics.median(timer.times)}), flush=True)


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def run_mode(mode: str, args) -> float:
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    me = [sys.executable, str(Path(__file__).resolve()), "--worker", mode, "--batch", str(args.batch),
          "--steps", str(args.steps)]
    if mode == "mwms":
        ports = free_ports(2)
        workers = [f"127.0.0.1:{p}" for p in ports]
        procs = [subprocess.Popen(me, env=dict(env, TF_CONFIG=json.dumps(
                     {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})),
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
        out = "".join(p.communicate(timeout=args.timeout)[0] for p in procs)
    else:
        mpiexec = str(Path(sys.executable).parent / "mpiexec")
        out = subprocess.run([mpiexec, "-n", "2", *me], env=env, capture_output=True, text=True,
                             timeout=args.timeout).stdout
    results = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
    if len(results) != 2:
        raise SystemExit(f"{mode}: expected 2 results\n{out[-3000:]}")
    return max(r["step_s"] for r in results), results[0]["params"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=64, help="per-rank batch (default 64)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per job (default 8)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="local,commlib,mwms")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--json", help="write the raw times here")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.batch, args.steps)
        return 0
    modes = args.modes.split(",")
    times = {m: [] for m in modes}
    params = None
    for r in range(args.rounds):
        for mode in modes[r % len(modes):] + modes[:r % len(modes)]:  # rotate who runs first
            t, params = run_mode(mode, args)
            times[mode].append(t)
            print(f"round {r} {mode:8s} {t * 1e3:8.1f} ms/step", flush=True)
    print(f"\n# {params / 1e6:.1f} M parameters, per-rank batch {args.batch}, global batch {2 * args.batch}, "
          f"2 ranks on one host, {args.rounds} rounds x {args.steps} steps")
    print("| mode | median step (ms) | vs local |\n|---|---|---|")
    base = statistics.median(times["local"]) if "local" in times else None
    for mode in modes:
        med = statistics.median(times[mode])
        print(f"| {mode} | {med * 1e3:.1f} | {med / base:.2f}x |" if base else f"| {mode} | {med * 1e3:.1f} | |")
    if args.json:
        Path(args.json).write_text(json.dumps({"times": times, "params": params, "batch": args.batch}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
