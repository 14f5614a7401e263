"""Elastic training with the numpy API (commlib.elastic.run, ObjectState) under commlib-run's driver
(tests/elastic/test_elastic.py): a linear least-squares model trained by SGD over 96 samples, each step's gradient
averaged with commlib.allreduce; the weights, the step and the position in the shuffled order are the
committed state. Rank 1 of the first launch kills itself (SIGKILL) at step ELASTIC_KILL_AT.

Logs as tests/elastic/workers/elastic_train.py: LOGDIR/<launch>.<rank>.log (a header, per step its samples before
the allreduce, and when it completed); rank 0 writes LOGDIR/final.json."""

import json
import os
import signal
import sys
import time

import numpy as np

import commlib
from commlib.elastic import ObjectState, run

LOGDIR = sys.argv[1]
SAMPLES, BATCH, LR, STEPS = 96, 4, 0.05, 30
rng = np.random.default_rng(7)
features = rng.standard_normal((SAMPLES, 4))
targets = features @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.25

commlib.init()
with open(os.path.join(LOGDIR, f"shm.{os.getpid()}.txt"), "w") as f:
    f.write("\n".join(sorted({line.split()[-1] for line in open("/proc/self/maps") if "/dev/shm/" in line})))
state = ObjectState(weights=np.zeros(5), step=0, position=0)


@run
def train(state):
    rank, size = commlib.rank(), commlib.size()
    launch = commlib.broadcast_object(f"{time.time():.6f}" if rank == 0 else None)
    log = open(os.path.join(LOGDIR, f"{launch}.{rank}.log"), "w", buffering=1)
    log.write(json.dumps({"launch": launch, "rank": rank, "size": size, "start_step": state.step,
                          "time": time.time()}) + "\n")
    order = np.concatenate([np.random.default_rng(3 + e).permutation(SAMPLES) for e in range(4)])
    while state.step < STEPS:
        if state.step == int(os.environ.get("ELASTIC_KILL_AT", "-1")) and rank == 1 \
                and not os.path.exists(os.path.join(LOGDIR, "killed")):
            with open(os.path.join(LOGDIR, "killed"), "w") as f:
                f.write(f"{time.time()}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        start = state.position + rank * BATCH
        indices = [int(i) for i in order[start:start + BATCH]]
        log.write(json.dumps({"epoch": 0, "step": state.step, "indices": indices, "time": time.time()}) + "\n")
        x, y = features[indices], targets[indices]
        residual = x @ state.weights[:4] + state.weights[4] - y
        gradient = np.concatenate([2 * x.T @ residual / BATCH, [2 * residual.mean()]])
        state.weights = state.weights - LR * commlib.allreduce(gradient, name="gradient")
        log.write(json.dumps({"done": state.step, "time": time.time()}) + "\n")
        state.position += BATCH * size
        state.step += 1
        time.sleep(0.05)
        state.commit()


train(state)
if commlib.rank() == 0:
    with open(os.path.join(LOGDIR, "final.json"), "w") as f:
        json.dump({"weights": state.weights.tolist(), "step": state.step, "size": commlib.size()}, f)
commlib.shutdown()
