"""Worker for tests/torch/test_torch_work.py: c10d's Work rules on the ``commlib`` backend, errors, options.

    mpiexec -n N python torch_work.py

Each check is a named case on every rank (tests/spmd.py); every case ends with a barrier, so the next
starts together.
"""

from __future__ import annotations

import datetime
import functools
import gc
import os
import time

import numpy as np
import torch
import torch.distributed as dist

import commlib as cl
from commlib.errors import ConfigError
from commlib.torch.distributed import Options
import spmd

RANK, SIZE = spmd.rank_and_size()
total = SIZE * (SIZE + 1) / 2  # the sum of rank + 1 over the ranks


def check(name: str, condition: bool, detail="") -> None:
    if not condition:
        raise AssertionError(f"{name}: {detail}")


def case(func):
    """A named case that ends with a barrier of the world."""
    @functools.wraps(func)
    def run():
        func()
        dist.barrier()

    return spmd.case(run)


@spmd.case
def init():
    dist.init_process_group("commlib", timeout=datetime.timedelta(seconds=60))
    assert (dist.get_rank(), dist.get_world_size()) == (RANK, SIZE)


@case
def async_wait():
    t = torch.full((5,), RANK + 1.0)
    work = dist.all_reduce(t, async_op=True)
    check("async_wait", work.wait() is True)
    check("async_wait", work.is_completed() and work.is_success() and work.exception() is None)
    check("async_wait", work.result()[0] is t and torch.all(t == total), t)


@case
def synchronous_all_reduce_takes_the_short_path_where_it_applies():
    """A synchronous all_reduce of one plain CPU tensor runs by the short path (``_allreduce_now``); what it
    does not take (bfloat16, a tensor that requires grad, PREMUL_SUM, a bitwise op, an asynchronous call, a
    group whose timeout bounds each call) goes the general way; the results are the same either way."""
    from commlib.torch.distributed.process_group import ProcessGroupCommlib

    taken = []
    short_path = ProcessGroupCommlib._allreduce_now

    def spy(self, tensor, reduce_op):
        work = short_path(self, tensor, reduce_op)
        taken.append(work is not None)
        return work

    ProcessGroupCommlib._allreduce_now = spy
    try:
        unbounded = dist.new_group(list(range(SIZE)))  # torch's default timeout: commlib's deadline bounds calls
        bounded = dist.new_group(list(range(SIZE)), timeout=datetime.timedelta(seconds=20))  # shorter: it does
        calls = [
            ("float32 SUM", True, lambda: torch.full((5,), RANK + 1.0), {}, total),
            ("int64 MAX", True, lambda: torch.full((3,), RANK + 1, dtype=torch.int64), {"op": dist.ReduceOp.MAX}, SIZE),
            ("float64 AVG", True, lambda: torch.full((2,), RANK + 1.0, dtype=torch.float64),
             {"op": dist.ReduceOp.AVG}, total / SIZE),
            ("empty", True, lambda: torch.ones(0), {}, None),
            ("bfloat16", False, lambda: torch.full((4,), RANK + 1.0, dtype=torch.bfloat16), {}, total),
            ("requires grad", False, lambda: torch.full((4,), RANK + 1.0, requires_grad=True), {}, total),
            ("PREMUL_SUM", False, lambda: torch.full((4,), RANK + 1.0), {"op": dist._make_nccl_premul_sum(2.0)},
             2 * total),
            ("BOR", False, lambda: torch.full((4,), 1 << RANK, dtype=torch.int32), {"op": dist.ReduceOp.BOR},
             (1 << SIZE) - 1),
        ]
        for label, short, make, kwargs, want in calls:
            taken.clear()
            t = make()
            with torch.no_grad():
                dist.all_reduce(t, group=unbounded, **kwargs)
            check(label, taken == [short], taken)
            check(label, want is None or torch.all(t.float() == want), t)
        taken.clear()
        t = torch.full((5,), RANK + 1.0)
        dist.all_reduce(t, group=unbounded, async_op=True).wait()
        dist.all_reduce(t, group=bounded)
        check("asynchronous and bounded calls", taken == [] and torch.all(t == total * SIZE), (taken, t))
    finally:
        ProcessGroupCommlib._allreduce_now = short_path


@case
def future_chain():
    t = torch.full((3,), RANK + 1.0)
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    check("future_chain", torch.all(doubled.wait() == 2 * total), doubled.value())


@case
def future_before_completion():
    """Rank 0 calls only after the others saw their futures pending: they complete by themselves, without
    a wait on the Work (rank 0 waits for a barrier on a second group, which the others enter after their
    check)."""
    later = dist.new_group(list(range(SIZE)))
    t = torch.ones(4)
    if RANK == 0:
        dist.barrier(group=later)
        fut = dist.all_reduce(t, async_op=True).get_future()
    else:
        fut = dist.all_reduce(t, async_op=True).get_future()
        check("future_before_completion", not fut.done(), "done before rank 0 called")
        dist.barrier(group=later)
    check("future_before_completion", torch.all(fut.wait()[0] == SIZE))


@case
def nested_collective_in_callback():
    """A callback that runs a collective and waits for it (PyTorch's PowerSGD hook does) must not deadlock."""
    first = torch.ones(2)

    def then(f):
        second = f.value()[0].clone()
        dist.all_reduce(second, async_op=True).get_future().wait()
        return second

    result = dist.all_reduce(first, async_op=True).get_future().then(then).wait()
    check("nested_collective_in_callback", torch.all(result == SIZE * SIZE), result)


@case
def poll_until_done():
    work = dist.all_reduce(torch.ones(1000), async_op=True)
    deadline = time.monotonic() + 120  # a backstop for "never completes", far above any load, not a speed
    while not work.is_completed():
        check("poll_until_done", time.monotonic() < deadline, "never completed without wait()")
        time.sleep(0.001)
    check("poll_until_done", work.is_success())


@case
def many_in_flight():
    tensors = [torch.full((17,), float(k)) for k in range(40)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    for k, (t, w) in enumerate(zip(tensors, works)):
        w.wait()
        check("many_in_flight", torch.all(t == k * SIZE), (k, t))


@case
def finished_calls_release_their_tensors():
    """A DDP hook reduces a fresh tensor each step: once its call is done and the caller lets go of it, the
    group must not keep its memory (for the 64 calls until its name comes back). Four 64 MiB tensors,
    each freed after its call (memory the allocator gives back to the system at once)."""
    def resident() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    gc.collect()
    before = resident()
    for k in range(4):
        t = torch.full((16 << 20,), float(k))
        dist.all_reduce(t, async_op=True).wait()
        del t
    dist.all_reduce(torch.ones(1), async_op=True).wait()  # a later call: the group lets the earlier go
    gc.collect()
    grown = resident() - before
    check("finished_calls_release_their_tensors", grown < 96 << 20, f"{grown >> 20} MiB more resident")


@case
def mismatch_is_an_error_everywhere():
    t = torch.ones(3 + RANK)
    try:
        dist.all_reduce(t)
    except RuntimeError as exc:
        check("mismatch", "mismatched shape" in str(exc), exc)
    else:
        check("mismatch", SIZE == 1, "no error")
    after = torch.ones(2)
    dist.all_reduce(after)  # the group still works
    check("mismatch", torch.all(after == SIZE))


@case
def error_on_the_work():
    t = torch.ones(2, dtype=torch.float32 if RANK == 0 else torch.float64)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    try:
        work.wait()
    except RuntimeError as exc:
        check("error_on_the_work", "mismatched dtype" in str(exc), exc)
        check("error_on_the_work", not work.is_success() and work.exception() is not None)
        try:
            fut.wait()
        except RuntimeError:
            pass
        else:
            check("error_on_the_work", False, "the future did not raise")
    else:
        check("error_on_the_work", SIZE == 1, "no error")


@case
def options():
    values = torch.full((1000,), 1.0 + RANK / 7)
    fp16 = dist.new_group(list(range(SIZE)), pg_options=Options(compression="fp16"))
    t = values.clone()
    dist.all_reduce(t, group=fp16)
    exact = sum(1.0 + r / 7 for r in range(SIZE))
    check("options fp16", torch.allclose(t, torch.full_like(t, exact), rtol=2e-3), t[:3])
    ring = dist.new_group(list(range(SIZE)), pg_options=Options(algorithm="ring"))
    t = values.clone()
    dist.all_reduce(t, group=ring)
    check("options ring", torch.allclose(t, torch.full_like(t, exact)), t[:3])
    # a lossy compressor through the options, against the same compressor through commlib's own API
    through_group = dist.new_group(list(range(SIZE)), pg_options=Options(compression=cl.Compression.topk(0.1)))
    mine = cl.Compression.topk(0.1)
    rng = np.random.default_rng(RANK)
    for step in range(3):
        grad = rng.standard_normal(2048).astype(np.float32)
        t = torch.from_numpy(grad.copy())
        dist.all_reduce(t, op=dist.ReduceOp.AVG, group=through_group)
        want = cl.allreduce(grad, op=cl.Average, name="reference", compression=mine)
        check("options topk", np.array_equal(t.numpy(), want), (step, t[:4], want[:4]))
    for bad in (dict(compression="zip"), dict(algorithm="nope")):
        try:
            Options(**bad)
        except ConfigError:
            pass
        else:
            check("options errors", False, f"Options({bad}) accepted")


@case
def send_recv_future():
    if SIZE == 1:
        return
    peer = 1 - RANK if RANK < 2 else None
    if peer is None:
        return
    if RANK == 0:
        fut = dist.isend(torch.arange(4.0), 1).get_future()
        fut.wait()
    else:
        got = torch.empty(4)
        dist.irecv(got, 0).get_future().wait()
        check("send_recv_future", torch.equal(got, torch.arange(4.0)), got)


@case
def sparse_all_reduce():
    """Sparse COO tensors sum as their dense forms do (as on gloo): rows on some ranks only, a rank with no
    entries, duplicate indices, dense trailing dimensions; another op is refused on every rank."""
    def rows(r):
        index = [[r % 5, (r + 2) % 5, r % 5], [0, 1, 1]]  # (r % 5, 0) and (r % 5, 1): r % 5 twice
        values = torch.arange(3 * 2, dtype=torch.float64).view(3, 2) + r
        if r == 1:  # nothing on this rank
            index, values = [[], []], torch.zeros((0, 2), dtype=torch.float64)
        return torch.sparse_coo_tensor(torch.tensor(index, dtype=torch.int64).view(2, -1), values, (5, 2, 2))

    t = rows(RANK)
    dist.all_reduce(t)
    want = sum(rows(r).to_dense() for r in range(SIZE))
    check("sparse_all_reduce", t.is_sparse and torch.equal(t.to_dense(), want), (t.to_dense(), want))
    try:
        dist.all_reduce(rows(RANK), op=dist.ReduceOp.MAX)
    except ValueError as exc:
        check("sparse_all_reduce MAX", "SUM only" in str(exc), exc)
    else:
        check("sparse_all_reduce MAX", False, "accepted")


@case
def ddp_with_sparse_gradients():
    """DDP over an ``nn.Embedding(sparse=True)``: the sparse gradient is the ranks' mean, as on gloo."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 3, sparse=True)
    reference = torch.nn.Embedding(10, 3)
    reference.load_state_dict(emb.state_dict())
    model = torch.nn.parallel.DistributedDataParallel(emb)
    ids = [torch.tensor([r % 10, (3 * r + 1) % 10]) for r in range(SIZE)]
    model(ids[RANK]).sum().backward()
    sum(reference(i).sum() for i in ids).backward()
    check("ddp sparse", emb.weight.grad.is_sparse, emb.weight.grad.layout)
    check("ddp sparse", torch.allclose(emb.weight.grad.to_dense(), reference.weight.grad / SIZE),
          (emb.weight.grad.to_dense(), reference.weight.grad / SIZE))


@case
def group_timeout_bounds_a_synchronous_call():
    """A group's timeout shorter than commlib's own deadline bounds a call the caller waits for at once:
    rank 0's barrier, which no other rank joins in time, raises torch's error after that timeout; the
    others then join it, and the group goes on."""
    if SIZE == 1:
        return
    group = dist.new_group(list(range(SIZE)), timeout=datetime.timedelta(seconds=1))
    if RANK == 0:
        start = time.monotonic()
        try:
            dist.barrier(group=group)
        except dist.DistBackendError as exc:
            waited = time.monotonic() - start
            check("group timeout", "timeout of 1 s" in str(exc) and 1.0 <= waited < 30, (waited, exc))
        else:
            check("group timeout", False, "no error")
    dist.barrier()  # the world's: rank 0 after its error
    if RANK != 0:
        dist.barrier(group=group)  # completes rank 0's request, still under way there
    t = torch.ones(3)
    dist.all_reduce(t, group=group)  # rank 0's second call, the others' second: the group goes on
    check("group timeout", torch.all(t == SIZE), t)


def _sum_broadcast_gather(group, members: list[int]) -> None:
    """all_reduce, broadcast and all_gather on ``group`` give what gloo gives: the members' sum, the root's
    tensor, every member's tensor in order (each member's input is a function of its rank)."""
    t = torch.tensor([RANK + 1.0, 10.0 * RANK])
    dist.all_reduce(t, group=group)
    check("member-made group", t.tolist() == [sum(r + 1.0 for r in members), sum(10.0 * r for r in members)], t)
    b = torch.full((3,), float(RANK))
    dist.broadcast(b, src=members[-1], group=group)
    check("member-made group", torch.all(b == members[-1]), b)
    outs = [torch.empty(2) for _ in members]
    dist.all_gather(outs, torch.tensor([RANK, -RANK], dtype=torch.float32), group=group)
    check("member-made group", [o.tolist() for o in outs] == [[r, -r] for r in members], outs)
    check("member-made group", group._set is None or group._set.members_only, group._set)  # commlib's own set


@case
def subgroups_of_a_group_made_by_its_ranks():
    """new_subgroups(group=...) is called by the group's ranks only (ranks 0 and 2 split [0, 2] while rank 1
    splits [1], as PyTorch's test_new_subgroups_with_group_param): each subgroup is a commlib set made by its
    members, whose collectives give gloo's results; the default group still works after."""
    if SIZE != 3:
        return
    current, _ = dist.new_subgroups_by_enumeration([[0, 2], [1]])
    mine = [0, 2] if RANK != 1 else [1]
    sub, subs = dist.new_subgroups(group_size=1, group=current)
    check("new_subgroups(group=...)", len(subs) == len(mine) and sub.size() == 1, (subs, sub.size()))
    check("new_subgroups(group=...)", dist.get_process_group_ranks(sub) == [RANK], dist.get_process_group_ranks(sub))
    _sum_broadcast_gather(sub, [RANK])
    if RANK != 1:
        pair, pairs = dist.new_subgroups(group_size=2, group=current)  # rank 1 is not there: it goes on below
        check("new_subgroups(group=...)", len(pairs) == 1 and dist.get_process_group_ranks(pair) == [0, 2], pairs)
        _sum_broadcast_gather(pair, [0, 2])
    t = torch.ones(2)
    dist.all_reduce(t)
    check("member-made subgroups", torch.all(t == SIZE), t)


@case
def new_group_with_local_synchronization_is_made_by_its_members():
    """new_group(ranks, use_local_synchronization=True) is called by the members only, here while rank 0
    makes a group of its own: each runs its collectives on commlib with gloo's results; a second group of
    the same ranks shares their set."""
    if SIZE != 3:
        return
    members = [1, 2] if RANK else [0]
    group = dist.new_group(members, use_local_synchronization=True)
    _sum_broadcast_gather(group, members)
    again = dist.new_group(members, use_local_synchronization=True)
    _sum_broadcast_gather(again, members)
    check("use_local_synchronization", again._set is group._set, (again._set, group._set))
    everyone = dist.new_group(list(range(SIZE)), use_local_synchronization=True)
    _sum_broadcast_gather(everyone, list(range(SIZE)))


@spmd.case
def shutdown():
    dist.destroy_process_group()


if __name__ == "__main__":
    spmd.main()
