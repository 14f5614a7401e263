"""A Ray driver (tests/elastic/test_ray_elastic.py): an elastic RayExecutor job that grows. Every worker
allreduces and commits once per step; at step PAUSE every worker waits for the file GO (the test starts a
Ray node meanwhile and writes GO once the driver has seen it), so that no collective is pending while the
hosts change. The job must go on from its last commit on 3 workers. Prints "step N ranks R" per step."""

import os
import sys
import time

import numpy as np
import ray

from commlib.ray import RayExecutor

STEPS, PAUSE, GO = 60, 20, sys.argv[1]


def work(go, steps, pause):
    import commlib
    import commlib.elastic as elastic

    commlib.init()
    state = elastic.ObjectState(step=0, total=0.0)

    @elastic.run
    def train(state):
        while state.step < steps:
            if state.step == pause:
                while not os.path.exists(go):
                    time.sleep(0.05)
            total = commlib.allreduce(np.ones(1), op=commlib.Sum, name="step")[0]
            state.total += float(total)
            state.step += 1
            if commlib.rank() == 0:
                print(f"step {state.step} ranks {commlib.size()}", flush=True)
            state.commit()

    train(state)
    return {"size": commlib.size(), "step": state.step, "total": state.total}


ray.init(address="auto", logging_level="WARNING")
executor = RayExecutor(RayExecutor.create_settings(timeout_s=120), min_workers=1, cpus_per_worker=2)
executor.start()
results = executor.run(work, args=[GO, STEPS, PAUSE])
executor.shutdown()
print("RESULTS", results, flush=True)
assert [r["size"] for r in results] == [3, 3, 3], results
assert all(r["step"] == STEPS for r in results), results
# the step after the pause ran on 2 workers too: its commit saved it, then saw the new host; the 3 workers
# resumed from that commit
assert all(r["total"] == 2 * (PAUSE + 1) + 3 * (STEPS - PAUSE - 1) for r in results), results
print("ALL OK", flush=True)
