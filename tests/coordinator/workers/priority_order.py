"""Priority scheduling on real ranks: what is ready at once runs most urgent first (observed in the
timeline), a large low-priority tensor runs in partitions behind the urgent ones, the order is the same
on every rank, and the results equal numpy's.

Usage: priority_order.py TRACE_DIR [--results-only]. Run with COMMLIB_PRIORITY_PARTITION=256K, COMMLIB_PRIORITY_CREDIT=1
(one partition per round) and COMMLIB_TIMELINE=TRACE_DIR/trace.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

import commlib as cl
import spmd

SMALL = 30_000      # floats: above the eager limit (64K bytes), below one partition (256K bytes)
LARGE = 2_000_000   # floats: 8 MB, 31 partitions of 256K bytes... and a remainder
PRIORITIES = [3, 6, 2, 5, 4]  # submission order differs from priority order


r = n = 0
data: dict = {}


@spmd.case
def init():
    global r, n
    cl.init()
    r, n = cl.rank(), cl.size()


@spmd.case
def results_equal_numpy():
    rng = np.random.default_rng(r)
    data.update({f"small{p}": rng.standard_normal(SMALL).astype(np.float32) for p in PRIORITIES})
    data["large"] = rng.standard_normal(LARGE).astype(np.float32)
    handles = {"large": cl.allreduce_async(data["large"], name="large", op=cl.Sum, priority=1)}
    for p in PRIORITIES:
        handles[f"small{p}"] = cl.allreduce_async(data[f"small{p}"], name=f"small{p}", op=cl.Sum, priority=p)
    results = {k: cl.synchronize(h) for k, h in handles.items()}
    everyone = cl.allgather_object({k: v for k, v in data.items()})
    for k, result in results.items():
        expected = sum(d[k] for d in everyone)  # on 2 ranks a + b: the same bits in any order
        assert np.allclose(result, expected, rtol=1e-5, atol=1e-5), k
        if n == 2:
            assert np.array_equal(result, expected), k
    cl.stop_timeline()
    cl.barrier()


@spmd.case
def the_most_urgent_runs_first_in_the_same_order_everywhere():
    trace_dir = Path(sys.argv[1])
    order = [_order(trace_dir / ("trace.json" if q == 0 else f"trace.rank{q}.json")) for q in range(n)]
    assert all(o == order[0] for o in order), f"ranks ran different orders: {order}"
    runs, decided = _events(trace_dir / ("trace.json" if r == 0 else f"trace.rank{r}.json"))
    names = [name for _, name in runs]
    parts = [name for name in names if name.startswith("large.part")]
    count = -(-LARGE * 4 // (256 << 10))
    assert parts == [f"large.part{i}of{count}" for i in range(count)], parts
    assert sorted(names) == sorted(parts + list(data)[:-1]), names
    # Whatever was waiting when a tensor started had a lower priority: for every pair, if the more urgent
    # one was decided before the other started, it started first (the credit is one item per round).
    start = {name: ts for ts, name in runs}
    priority = {name: (1 if name.startswith("large") else int(name[5:])) for name in names}
    for a in names:
        for b in names:
            if priority[a] > priority[b] and decided[a.split(".")[0]] < start[b]:
                assert start[a] < start[b], f"{a} (priority {priority[a]}) waited behind {b}: {names}"
    # and the small urgent ones did go between the partitions of the large one
    assert any(start[f"small{p}"] < start[parts[-1]] for p in PRIORITIES), names


@spmd.case
def ranks_that_disagree_on_a_priority_get_an_error():
    """An error naming it, not different orders."""
    try:
        cl.synchronize(cl.allreduce_async(np.ones(4, np.float32), name="disagree", priority=1 + r))
    except cl.CollectiveError as exc:
        assert "mismatched priority" in str(exc), exc
    else:
        raise AssertionError("different priorities on different ranks were accepted")


@spmd.case
def shutdown():
    cl.shutdown()


def _load(path: Path) -> list[dict]:
    text = path.read_text().rstrip()
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"
    return json.loads(text)


def _rows(events) -> dict:
    return {e["pid"]: e["args"]["name"].removeprefix("allreduce.") for e in events
            if e.get("name") == "process_name" and e["pid"]}


def _order(path: Path) -> list[str]:
    """Tensor names of the timeline's ALLREDUCE events, by start time."""
    return [name for _, name in _events(path)[0]]


def _events(path: Path):
    """(start, name) of each ALLREDUCE event by start time, and when each tensor was decided (the end of
    its NEGOTIATE_ALLREDUCE span: every tensor of one round shares it)."""
    events = _load(path)
    rows = _rows(events)
    runs = sorted((e["ts"], rows[e["pid"]]) for e in events if e.get("name") == "ALLREDUCE" and e.get("ph") == "X")
    decided = {rows[e["pid"]]: e["ts"] + e["dur"] for e in events if e.get("name") == "NEGOTIATE_ALLREDUCE"}
    return runs, decided


if __name__ == "__main__":
    if "--results-only" in sys.argv:  # several lanes: releases run side by side, their starts may swap
        spmd.main(["init", "results_equal_numpy", "shutdown"])
    else:
        spmd.main()
