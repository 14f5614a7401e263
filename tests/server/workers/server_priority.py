"""push_pull's priority (tests/server/test_server.py): the order in which a worker posts partitions.

Every worker submits, without waiting, a large tensor of priority 0, two small ones of priority 1 and
one of priority 5, and records when each submission returned; the client's trace gives the order of the
posts. Checked on every worker:
- no partition of a lower priority is posted after a higher-priority tensor was submitted while that
  tensor still has partitions waiting; the two tensors of equal priority go in submission order;
- the priority-5 tensor overtook the large one (some of its partitions went after the priority-5 ones:
  otherwise the test would show nothing);
- the same submissions without priorities go in submission order (the control);
- every result equals numpy's, and every worker holds the same bits;
- a priority that is not an int is refused naming the call; commlib.torch's BytePS names take it.
"""

import hashlib
import os
import time

import numpy as np

import commlib as cl
import spmd
from commlib.server import protocol

rank, size = spmd.rank_and_size()[0], 0  # the job's workers, once commlib runs
client = None
partition = int(os.environ["COMMLIB_SERVER_PARTITION"])
rng = np.random.default_rng(7 + rank)
# name -> (elements, priority), in submission order
TENSORS = [("low", 96 * partition, 0), ("mid.a", 3 * partition, 1), ("mid.b", 3 * partition, 1),
           ("high", 4 * partition, 5)]


def run(tag: str, prioritised: bool):
    inputs = {name: rng.standard_normal(n // 4).astype(np.float32) for name, n, _ in TENSORS}
    cl.barrier()
    client.trace = []
    handles, submitted = {}, {}
    for name, _, priority in TENSORS:
        handles[name] = cl.push_pull_async(inputs[name], op=cl.Average, name=f"{tag}.{name}",
                                           priority=priority if prioritised else 0)
        submitted[name] = time.monotonic()
    results = {name: cl.synchronize(h) for name, h in handles.items()}
    trace, client.trace = client.trace, None
    # results: numpy's, the same bits everywhere
    for name, _, _ in TENSORS:
        every = cl.allgather(inputs[name][None, :], name=f"{tag}.{name}.in")
        expect = every.astype(np.float64).mean(axis=0)
        assert np.allclose(results[name], expect, rtol=1e-5, atol=1e-6), (tag, name)
    digests = cl.allgather_object({n: hashlib.sha256(r.tobytes()).hexdigest() for n, r in results.items()})
    assert all(d == digests[0] for d in digests), f"{tag}: workers hold different bits"
    # the posts, by tensor: slots are taken in submission order, one per partition
    posts = [(t, slot) for t, event, _, slot in trace if event == "post"]
    first = min(slot for _, slot in posts)
    owner, at = {}, first
    for name, n, _ in TENSORS:
        count = len(protocol.bounds(n // 4, 4, partition, client.num_servers)) - 1
        owner.update({at + i: name for i in range(count)})
        at += count
    assert len(posts) == len(owner), (len(posts), len(owner))
    order = [(t, owner[slot]) for t, slot in posts]
    return order, submitted


def check_priorities(order, submitted):
    priority = {name: p for name, _, p in TENSORS}
    last_post = {}
    for t, name in order:
        last_post[name] = t
    for t, name in order:
        for other, p in priority.items():
            if p > priority[name] and submitted[other] < t < last_post[other]:
                raise AssertionError(f"a partition of {name} (priority {priority[name]}) went at {t:.6f} while "
                                     f"{other} (priority {p}, submitted at {submitted[other]:.6f}) still waited")
    names = [name for _, name in order]
    a_last = max(i for i, n in enumerate(names) if n == "mid.a")
    b_first = min(i for i, n in enumerate(names) if n == "mid.b")
    assert a_last < b_first, f"equal priorities out of submission order: {names}"
    high_last = max(i for i, n in enumerate(names) if n == "high")
    assert "low" in names[high_last:], f"the priority-5 tensor did not overtake the large one: {names}"
    return names


@spmd.case
def init():
    global client, size
    cl.init()
    client, size = cl.api._rt().servers, cl.size()


@spmd.case
def higher_priorities_are_posted_first():
    names = check_priorities(*run("prio", True))
    plain, _ = run("plain", False)
    plain_names = [name for _, name in plain]
    grouped = [name for i, name in enumerate(plain_names) if i == 0 or plain_names[i - 1] != name]
    assert grouped == ["low", "mid.a", "mid.b", "high"], f"without priorities, not submission order: {grouped}"
    # low first, then the urgent ones in one run, then the rest of low: the runs of the posting order
    runs = [name for i, name in enumerate(names) if i == 0 or names[i - 1] != name]
    print(f"priority order on worker {rank}: {' '.join(runs)}", flush=True)


@spmd.case
def a_float_priority_is_refused():
    try:
        cl.push_pull(np.ones(3, np.float32), name="bad", priority=1.5)
    except TypeError as exc:
        assert "bad" in str(exc) and "priority must be an int" in str(exc), str(exc)
    else:
        raise AssertionError("a float priority was accepted")


@spmd.case
def the_torch_plugins_priority():
    try:
        import torch

        import commlib.torch as bps

        t = torch.full((5,), float(rank + 1))
        h = bps.push_pull_async_inplace(t, average=False, name="torch.prio", version=0, priority=3)
        assert bps.synchronize(h) is t and torch.equal(t, torch.full((5,), size * (size + 1) / 2)), t
    except ImportError:
        spmd.skip("torch is not installed")


@spmd.case
def shutdown():
    cl.shutdown()


if __name__ == "__main__":
    spmd.main()
