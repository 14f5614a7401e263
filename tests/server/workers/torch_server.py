"""commlib.torch through summation servers: BytePS's names against torch, and DistributedOptimizer with
algorithm="ps" (COMMLIB_ALGORITHM=ps in the job) training exactly like one process on the whole batch."""

from __future__ import annotations

import torch

import commlib.torch as bps
from torch_common import assert_same_on_all_ranks, close
import spmd
from spmd import import_worker

train_pair = import_worker("torch_optimizer").train_pair


def check_byteps_names(r, n):
    x = torch.arange(10, dtype=torch.float32) + r
    total = sum(torch.arange(10, dtype=torch.float32) + k for k in range(n))
    close(bps.push_pull(x, average=False, name="pp.sum"), total, "push_pull sum")
    close(bps.push_pull(x, name="pp.avg"), total / n, "push_pull average")
    assert torch.equal(x, torch.arange(10, dtype=torch.float32) + r), "push_pull modified its input"
    bps.declare("pp.inplace")
    tensors = [torch.full((k * 1000 + 1,), float(r + k)) for k in range(6)]
    handles = [bps.push_pull_async_inplace(t, average=False, name=f"pp.inplace.{k}")
               for k, t in reversed(list(enumerate(tensors)))]
    for h in handles:
        while not bps.poll(h):
            pass
        bps.synchronize(h)
    for k, t in enumerate(tensors):
        close(t, torch.full_like(t, sum(q + k for q in range(n))), f"push_pull_async_inplace {k}")
    half = torch.full((3000,), 0.5 + r, dtype=torch.bfloat16)
    got = bps.push_pull(half, average=False, name="pp.bf16")
    assert got.dtype == torch.bfloat16
    close(got.float(), torch.full((3000,), sum(0.5 + k for k in range(n))), "bfloat16 push_pull", rtol=1e-2)
    assert_same_on_all_ranks(bps, [got.view(torch.int16)], "bfloat16 push_pull")


def check_optimizer(r, n):
    for opt_name, kwargs in (("sgd", dict(passes=1)), ("sgd", dict(passes=2)), ("adam", dict(passes=1)),
                             ("sgd", dict(passes=1, op=bps.Sum))):
        model, reference = train_pair(r, n, opt_name, **kwargs)
        label = f"ps {opt_name} {kwargs}"
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            close(p, q, f"{label}: {name}", rtol=1e-5, atol=2e-6)
        assert_same_on_all_ranks(bps, list(model.parameters()), label)
    model, reference = train_pair(r, n, "sgd", compression=bps.Compression.fp16)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        close(p, q, f"ps fp16: {name}", rtol=3e-2, atol=3e-3)
    assert_same_on_all_ranks(bps, list(model.parameters()), "ps fp16")
    # a lossy encoder: the gradients' partitions are pushed encoded (counted here) and the servers answer
    # the dense sum; every rank ends with the same bits
    from commlib import api

    client = api._rt().servers
    original, encoded = client.push_pull_async, []

    def counting(*args, **kwargs):
        encoded.append(kwargs.get("lossy") is not None)
        return original(*args, **kwargs)

    client.push_pull_async = counting
    try:
        model, _ = train_pair(r, n, "sgd", compression=bps.Compression.topk(0.3, min_elements=1))
    finally:
        client.push_pull_async = original
    assert encoded and all(encoded), encoded
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert_same_on_all_ranks(bps, list(model.parameters()), "ps topk")


@spmd.case
def init():
    bps.init()


spmd.rank_cases(lambda: (bps.rank(), bps.size()), check_byteps_names, check_optimizer)


@spmd.case
def shutdown():
    bps.shutdown()


if __name__ == "__main__":
    spmd.main()
