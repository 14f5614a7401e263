"""HierarchicalModelAverager on process sets: its averages against numpy, and a lost peer.

    python torch_averagers.py check
    python torch_averagers.py lose DIR RANKS

``check``: the averager with ``{2: g, 4: size()}`` (``g`` is ``local_size()`` where the ranks span several
hosts, else half the ranks, else 1) and one step of warm-up, over 9 steps of deterministic local updates,
against the same schedule computed in numpy for every rank; a group of ranks the user registered already
is a ProcessSetError on every rank, and once it is removed the averager works; ``close()`` removes the
averager's sets, so an averager of the same groups can follow. The checks are named cases
(tests/spmd.py): ``averages`` and ``duplicate_group_then_recovers`` (skipped where the small group is 1 or
all ranks).

``lose``: averages every step (``{1: local_size(), 2: size()}``) until a call fails (the test stops a rank or
cuts a host's link); each rank writes ``DIR/ready.RANK`` (its pid) once the loop runs, and
``DIR/result.RANK`` (JSON: the wall time, the exception's type, ``ranks``, its message) when a call fails.
It then waits (at most 30 s) until every rank of RANKS (comma-separated: the live ones) has written its
result, so that no rank's exit takes a slower one down before it has raised, and raises again, so the
process ends through commlib's exit path.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch

import commlib as cl
import commlib.torch as hvd
import spmd

SHAPES = [((3, 4), np.float32), ((5,), np.float64), ((1,), np.float32)]


def initial(rank: int) -> list[np.ndarray]:
    rng = np.random.default_rng([rank, 99])
    return [rng.standard_normal(shape).astype(dtype) for shape, dtype in SHAPES]


def update(rank: int, step: int) -> list[np.ndarray]:
    rng = np.random.default_rng([rank, step])
    return [rng.standard_normal(shape).astype(dtype) for shape, dtype in SHAPES]


def group_size_of(schedule: dict, step: int):
    for period in sorted(schedule, reverse=True):
        if step % period == 0:
            return schedule[period]
    return None


def expected(schedule: dict, warmup: int, steps: int, size: int, rank: int) -> list[np.ndarray]:
    """Every rank's parameters through the schedule, in float64: the averager's meaning, in numpy."""
    state = [[a.astype(np.float64) for a in initial(r)] for r in range(size)]
    for step in range(steps):
        for r in range(size):
            state[r] = [s + u for s, u in zip(state[r], update(r, step))]
        g = group_size_of(schedule, step) if step >= warmup else None
        if g and g > 1:
            for start in range(0, size, g):
                means = [np.mean([state[r][i] for r in range(start, start + g)], axis=0)
                         for i in range(len(SHAPES))]
                for r in range(start, start + g):
                    state[r] = [m.copy() for m in means]
    return state[rank]


def small_group(size: int) -> int:
    if hvd.local_size() < size:
        return hvd.local_size()
    return size // 2 if size % 2 == 0 else 1


@spmd.case
def init():
    cl.init()


@spmd.case
def averages():
    rank, size = cl.rank(), cl.size()
    g, warmup, steps = small_group(size), 1, 9
    schedule = {2: g, 4: size}
    params = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in initial(rank)]
    averager = hvd.HierarchicalModelAverager(schedule, warmup_steps=warmup)
    for step in range(steps):
        with torch.no_grad():
            for p, u in zip(params, update(rank, step)):
                p.add_(torch.from_numpy(u))
        averager.average_parameters(params)
    assert averager.step == steps
    for i, (p, want) in enumerate(zip(params, expected(schedule, warmup, steps, size, rank))):
        got = p.detach().numpy()
        assert got.dtype == SHAPES[i][1], (i, got.dtype)
        assert np.allclose(got, want, rtol=1e-5, atol=1e-6), \
            f"parameter {i} after {steps} steps of {schedule}: {got} != {want} (groups of {g})"
    averager.close()


@spmd.case
def duplicate_group_then_recovers():
    """A set of the same ranks exists already: a clear error on every rank, then it works."""
    rank, size = cl.rank(), cl.size()
    g = small_group(size)
    if not 1 < g < size:
        spmd.skip(f"the small group is {g} of {size} ranks")
    schedule = {2: g, 4: size}
    mine = cl.add_process_set(range(0, g))
    spmd.expect_error(cl.ProcessSetError, f"group of ranks {list(range(0, g))}",
                      lambda: hvd.HierarchicalModelAverager(schedule), "an averager over a registered group")
    cl.remove_process_set(mine)
    again = hvd.HierarchicalModelAverager(schedule)  # close() took back the sets: the same groups again
    params = [torch.full((2,), float(rank))]
    again.step = 2  # a step of the small groups
    again.average_parameters(params)
    first = rank // g * g
    assert torch.equal(params[0], torch.full((2,), float(np.mean(range(first, first + g))))), params
    again.close()


@spmd.case
def shutdown():
    cl.shutdown()


def lose(rank: int, size: int, folder: str, live: list[int]) -> None:
    def mark(name: str, data: str) -> None:
        path = os.path.join(folder, f"{name}.{rank}")
        with open(path + ".tmp", "w") as f:
            f.write(data)
        os.replace(path + ".tmp", path)

    averager = hvd.HierarchicalModelAverager({1: hvd.local_size(), 2: size})
    params = [torch.full((1 << 16,), float(rank)), torch.ones(7, dtype=torch.float64)]
    try:
        for _ in range(6):
            averager.average_parameters(params)
        mark("ready", str(os.getpid()))
        while True:
            averager.average_parameters(params)
    except cl.CollectiveError as exc:
        mark("result", json.dumps({"rank": rank, "time": time.time(), "type": type(exc).__name__,
                                   "ranks": list(getattr(exc, "ranks", ())), "message": str(exc),
                                   "step": averager.step}))
        print(f"rank {rank} failed at step {averager.step}: {type(exc).__name__}: {exc}", flush=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(os.path.exists(os.path.join(folder, f"result.{r}"))
                                                      for r in live):
            time.sleep(0.05)
        raise


if __name__ == "__main__":
    if sys.argv[1] == "lose":  # the failure must end this process through commlib's exit path
        cl.init()
        lose(cl.rank(), cl.size(), sys.argv[2], [int(r) for r in sys.argv[3].split(",")])
    else:
        spmd.main()
