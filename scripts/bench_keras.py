"""Keras ``model.fit`` step time on 2 ranks: commlib vs tf.distribute's MultiWorkerMirroredStrategy vs
no communication, at the same global batch, on one host or on 2 emulated hosts with a shaped link.

    .venv/bin/python scripts/bench_keras.py [--rounds 3] [--steps 8]                    # one host
    .venv/bin/python scripts/bench_keras.py --rate 1gbit \\
        --modes local,commlib,commlib-2h,mwms-2h                                        # 2 hosts x 1 rank

The model is an MLP of about 25 M parameters (1024-4096-4096-1024-10, float32) on random data. Each mode
runs as its own 2-process job, per-rank batch ``--batch`` (global batch twice that):

- ``local``: two processes each fitting alone, no communication (the compute floor under the same CPU
  sharing);
- ``commlib``: ``mpiexec -n 2``, ``commlib.tensorflow.keras.DistributedOptimizer`` (gradients averaged in
  one grouped allreduce per step);
- ``mwms``: two processes with ``TF_CONFIG`` on 127.0.0.1, ``tf.distribute.MultiWorkerMirroredStrategy``
  (TensorFlow's own collective ops over gRPC), model built and compiled in the strategy's scope;
- ``commlib-2h`` and ``mwms-2h``: the same on 2 emulated hosts x 1 rank (``commlib.testing.cluster``,
  network namespaces, each host's link capped at ``--rate``): commlib through the cluster's ``mpiexec``
  (UCX over TCP on the hosts' ``eth0``), MultiWorkerMirroredStrategy as one plain process started inside
  each host's namespace with ``TF_CONFIG`` naming the hosts' addresses (no MPI). The cluster is made once
  for the whole run and always torn down; ``commlib-2h-fp16`` sends the gradients as float16
  (``Compression.fp16``), which MultiWorkerMirroredStrategy has no counterpart of.

Every mode runs on tf-keras (``TF_USE_LEGACY_KERAS=1``): Keras 3's ``fit`` does not take the strategy's
distributed dataset. Modes are interleaved round by round. A job reports the median of its step times after one warm-up
epoch of ``--warmup`` steps (a Keras callback times each ``train_batch``); the table gives the median over
rounds of the slowest rank. Run it alone on the machine: the modes share its cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
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


def worker(mode: str, batch: int, steps: int, warmup: int) -> None:
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
    if mode.startswith("mwms"):
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
        warm = dict(x=data, steps_per_epoch=warmup)
    else:
        import commlib.tensorflow.keras as hvd

        hvd.init()
        rank = hvd.rank()
        model = build(keras)
        optimizer = keras.optimizers.SGD(0.01)
        if mode.startswith("commlib"):  # -fp16: gradients travel as float16 (Horovod's Compression.fp16)
            compression = hvd.Compression.fp16 if mode.endswith("-fp16") else hvd.Compression.none
            optimizer = hvd.DistributedOptimizer(optimizer, compression=compression)
        model.compile(optimizer=optimizer, loss=loss)
        x = rng.standard_normal((batch * steps, LAYERS[0])).astype(np.float32)
        y = rng.integers(0, 10, len(x))
        fit = dict(x=x, y=y, batch_size=batch)
        warm = dict(x=x[:batch * warmup], y=y[:batch * warmup], batch_size=batch)
    params = model.count_params()
    model.fit(**warm, epochs=1, verbose=0)  # warm-up: tracing, first allocations
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


def run_mode(mode: str, args, cluster=None) -> tuple[float, int]:
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    me = [sys.executable, str(Path(__file__).resolve()), "--worker", mode, "--batch", str(args.batch),
          "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if mode == "mwms-2h":
        out = run_in_namespaces(cluster, me, env, args.timeout)
    elif mode.startswith("commlib-2h"):
        out = cluster.mpiexec(me, timeout=args.timeout, env=env).stdout
    elif mode == "mwms":
        ports = free_ports(2)
        workers = [f"127.0.0.1:{p}" for p in ports]
        procs = [subprocess.Popen(me, env=dict(env, TF_CONFIG=json.dumps(
                     {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})),
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
        out = "".join(p.communicate(timeout=args.timeout)[0] for p in procs)
    else:
        mpiexec = str(Path(sys.executable).parent / "mpiexec")
        out = subprocess.run([mpiexec, "-n", "2", *me], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=args.timeout).stdout
    results = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
    if len(results) != 2:
        raise SystemExit(f"{mode}: expected 2 results\n{out[-3000:]}")
    return max(r["step_s"] for r in results), results[0]["params"]


def run_in_namespaces(cluster, command: list[str], env: dict, timeout: float) -> str:
    """One MultiWorkerMirroredStrategy worker per emulated host, started inside the host's namespace with
    ``TF_CONFIG`` naming every host's ``eth0`` address (its traffic crosses the shaped links); on a timeout
    or an error every worker is killed on every host."""
    from commlib.testing import netns

    port = 20000 + secrets.randbelow(20000)  # a fresh namespace has every port free
    workers = [f"{cluster.host_address(i)}:{port}" for i in range(len(cluster.hosts))]
    procs = []
    try:
        for i, host in enumerate(cluster.hosts):
            tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
            procs.append(subprocess.Popen(["ip", "netns", "exec", host, *command], env=dict(env, TF_CONFIG=tf_config),
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          start_new_session=True))
        deadline = time.monotonic() + timeout
        return "".join(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0] for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if any(p.returncode for p in procs):
            for host in cluster.hosts:
                netns.kill_processes(host)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=64, help="per-rank batch (default 64)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per job (default 8)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before them (default 3)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="local,commlib,mwms",
                        help="of local, commlib, mwms (one host), commlib-2h, mwms-2h, commlib-2h-fp16 "
                             "(2 emulated hosts; -fp16: float16 on the wire)")
    parser.add_argument("--rate", default="1gbit", help="the emulated hosts' link rate (default 1gbit)")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--json", help="write the raw times here")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.batch, args.steps, args.warmup)
        return 0
    modes = args.modes.split(",")
    unknown = set(modes) - {"local", "commlib", "mwms", "commlib-2h", "mwms-2h", "commlib-2h-fp16"}
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}")
    times = {m: [] for m in modes}
    params = None
    with contextlib.ExitStack() as stack:
        cluster = None
        if any(m.endswith("-2h") for m in modes):
            from commlib.testing.cluster import Cluster

            cluster = stack.enter_context(Cluster(hosts=[1, 1], rate=args.rate))
            print(f"# cluster {cluster.name}: hosts {cluster.hosts} at {args.rate}, "
                  f"addresses {[cluster.host_address(i) for i in range(2)]}", flush=True)
        for r in range(args.rounds):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:  # rotate who runs first
                t, params = run_mode(mode, args, cluster)
                times[mode].append(t)
                print(f"round {r} {mode:10s} {t * 1e3:8.1f} ms/step", flush=True)
    print(f"\n# {params / 1e6:.1f} M parameters, per-rank batch {args.batch}, global batch {2 * args.batch}, "
          f"2 ranks, {args.rounds} rounds x {args.steps} steps; -2h: 2 emulated hosts x 1 rank at {args.rate}")
    print(f"# load: {os.getloadavg()}")
    base = statistics.median(times["local"]) if "local" in times else None
    print("| mode | median step (ms) | vs local |\n|---|---|---|")
    for mode in modes:
        med = statistics.median(times[mode])
        print(f"| {mode} | {med * 1e3:.1f} | {med / base:.2f}x |" if base else f"| {mode} | {med * 1e3:.1f} | |")
    for ours, theirs in (("commlib", "mwms"), ("commlib-2h", "mwms-2h")):
        if ours in times and theirs in times:
            ratios = [b / a for a, b in zip(times[ours], times[theirs])]
            print(f"# {theirs} / {ours} per round: {', '.join(f'{x:.2f}' for x in ratios)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"times": times, "params": params, "batch": args.batch,
                                               "rate": args.rate, "steps": args.steps}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
