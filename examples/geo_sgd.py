"""Geo-SGD over numpy parameters: each worker trains on its own data, exchanging through the servers.

    mpiexec -n 2 python examples/geo_sgd.py : -n 1 python -m commlib.server

Every worker fits the same linear model ``y = x @ w + b`` to its own samples of one task (generated here,
nothing is downloaded) with plain SGD, and every ``k=4`` local steps pushes its parameters' change to the
summation servers, which merge the workers' changes as they arrive and answer with the merged
parameters (docs/servers.md, "Geo-SGD"). No worker waits for another. The script exits non-zero unless
each worker's loss on held-out samples falls below a tenth of where it started.
"""

from __future__ import annotations

import sys

import numpy as np

import commlib as cl
from commlib.geo import GeoSGD


def main() -> int:
    cl.init()
    rank = cl.rank()
    task = np.random.default_rng(7)  # the same task on every worker
    w_true, b_true = task.standard_normal((16, 1)).astype(np.float32), np.float32(0.5)
    mine = np.random.default_rng(100 + rank)  # each worker its own samples and starting point
    w = mine.standard_normal((16, 1)).astype(np.float32)
    b = np.zeros(1, np.float32)
    held_out = mine.standard_normal((256, 16)).astype(np.float32)

    def loss() -> float:
        return float(np.mean((held_out @ w + b - (held_out @ w_true + b_true)) ** 2))

    geo = GeoSGD({"w": w, "b": b}, k=4)  # worker 0's w and b become everyone's (and the servers') start
    first = loss()
    for step in range(200):
        x = mine.standard_normal((32, 16)).astype(np.float32)
        error = x @ w + b - (x @ w_true + b_true)
        w -= 0.05 * (x.T @ error) / len(x)  # updated in place: GeoSGD reads and writes these arrays
        b -= 0.05 * error.mean(0)
        geo.step()  # every 4th step: push this worker's change, take the merged parameters
    geo.close()  # pushes what is left and applies the last answer
    last = loss()
    print(f"geo_sgd: worker {rank}: held-out loss {first:.5f} -> {last:.5f} after {geo.rounds} exchanges", flush=True)
    cl.shutdown()
    return 0 if last < first / 10 else 1


if __name__ == "__main__":
    sys.exit(main())
