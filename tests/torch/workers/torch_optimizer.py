"""DistributedOptimizer on N ranks trains exactly like one process on the combined batch; misuse is a clear
error on every rank and nothing hangs.

The reference is computed inside each rank with plain torch on the full batch (every rank can generate
all of the data), so no communication is involved in it.
"""

from __future__ import annotations

import torch

import commlib.torch as hvd
from torch_common import assert_same_on_all_ranks, close, expect_error
import spmd

BATCH = 12  # per micro-batch, over all ranks; divisible by 1, 2, 3, 4 ranks
STEPS = 5


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def batches(step, passes):
    g = torch.Generator().manual_seed(1000 + step)
    return [(torch.randn(BATCH, 6, generator=g), torch.randn(BATCH, 3, generator=g)) for _ in range(passes)]


def shard(t, r, n):
    per = BATCH // n
    return t[r * per:(r + 1) * per]


def loss_fn(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
}


def train_pair(r, n, opt_name, passes=1, clip=False, closure=False, scheduler=False, **dist_kwargs):
    """Train the distributed model and the single-process reference side by side; return both."""
    model, reference = make_model(), make_model()
    if isinstance(dist_kwargs.get("groups"), str):  # an explicit list of groups; the rest reduced alone
        dist_kwargs["groups"] = [[model[0].weight, model[2].bias]]
    optimizer = hvd.DistributedOptimizer(OPTIMIZERS[opt_name](model.parameters()),
                                         named_parameters=model.named_parameters(),
                                         backward_passes_per_step=passes, **dist_kwargs)
    ref_optimizer = OPTIMIZERS[opt_name](reference.parameters())
    schedulers = ([torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in (optimizer, ref_optimizer)]
                  if scheduler else [])
    # op=Sum adds the ranks' gradients: scale the loss so the update matches the average
    scale = 1.0 / n if dist_kwargs.get("op") is hvd.Sum else 1.0
    for step in range(STEPS):
        data = batches(step, passes)
        ref_optimizer.zero_grad()
        for x, y in data:
            loss_fn(reference, x, y).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        ref_optimizer.step()

        if closure:
            def run_closure():
                optimizer.zero_grad()
                loss = loss_fn(model, shard(data[0][0], r, n), shard(data[0][1], r, n)) * scale
                loss.backward()
                return loss
            optimizer.step(run_closure)
        else:
            optimizer.zero_grad()
            for x, y in data:
                (loss_fn(model, shard(x, r, n), shard(y, r, n)) * scale).backward()
            if clip:
                optimizer.synchronize()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                with optimizer.skip_synchronize():
                    optimizer.step()
            else:
                optimizer.step()
        for s in schedulers:
            s.step()
    return model, reference


def check_equivalence(r, n):
    cases = [
        ("sgd", dict(passes=1)),
        ("sgd", dict(passes=2)),
        ("adam", dict(passes=1)),
        ("adam", dict(passes=2)),
        ("sgd", dict(passes=1, groups=2)),
        ("adam", dict(passes=2, groups="first weight with last bias")),
        ("sgd", dict(passes=1, gradient_predivide_factor=2.0)),
        ("sgd", dict(passes=1, op=hvd.Sum)),
        ("sgd", dict(passes=1, clip=True)),
        ("sgd", dict(passes=1, closure=True)),
        ("adam", dict(passes=1, scheduler=True)),
    ]
    for opt_name, kwargs in cases:
        model, reference = train_pair(r, n, opt_name, **kwargs)
        label = f"{opt_name} {kwargs}"
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            close(p, q, f"{label}: {name}", rtol=1e-5, atol=2e-6)
        assert_same_on_all_ranks(hvd, list(model.parameters()), label)
    for compression in (hvd.Compression.fp16, hvd.Compression.bf16):
        for opt_name in ("sgd", "adam"):
            model, reference = train_pair(r, n, opt_name, compression=compression)
            label = f"{opt_name} {compression}"
            for (name, p), q in zip(model.named_parameters(), reference.parameters()):
                close(p, q, f"{label}: {name}", rtol=3e-2, atol=3e-3)
            assert_same_on_all_ranks(hvd, list(model.parameters()), label)


class TwoHeads(torch.nn.Module):
    """Head b is used only on rank 0: the other ranks produce no gradient for it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.body, self.a, self.b = torch.nn.Linear(6, 8), torch.nn.Linear(8, 3), torch.nn.Linear(8, 3)

    def forward(self, x, use_b):
        h = torch.tanh(self.body(x))
        return self.a(h) + (self.b(h) if use_b else 0)


def check_unused_parameters(r, n):
    model, reference = TwoHeads(), TwoHeads()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(3):
        (x, y), = batches(step, 1)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(shard(x, r, n), r == 0), shard(y, r, n)).backward()
        optimizer.step()
        # reference: the average over ranks of each rank's shard loss, rank 0's with head b
        ref_optimizer.zero_grad()
        total = sum(torch.nn.functional.mse_loss(reference(shard(x, k, n), k == 0), shard(y, k, n))
                    for k in range(n)) / n
        total.backward()
        ref_optimizer.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        close(p, q, f"unused parameters: {name}", rtol=1e-5, atol=2e-6)


def check_sparse(r, n):
    def make():
        torch.manual_seed(9)
        return torch.nn.Embedding(10, 3, sparse=True)

    indices = [torch.tensor([k % 10, (3 * k + 1) % 10, k % 10]) for k in range(n)]  # a repeated index too
    reference = make()
    reference.sparse = False
    (sum(reference(indices[k]).square().sum() for k in range(n)) / n).backward()
    torch.optim.SGD(reference.parameters(), lr=0.5).step()
    for sparse_as_dense in (True, False):  # densified allreduce, or Horovod's allgather of indices/values
        emb = make()
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5),
                                             sparse_as_dense=sparse_as_dense, named_parameters=emb.named_parameters())
        emb(indices[r]).square().sum().backward()
        optimizer.step()
        assert emb.weight.grad.is_sparse
        close(emb.weight, reference.weight, f"sparse gradients (sparse_as_dense={sparse_as_dense})")

    emb, other = make(), torch.nn.Linear(3, 1)
    params = list(emb.parameters()) + list(other.parameters())
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.5), groups=1)
    expect_error(NotImplementedError, lambda: other(emb(indices[r])).sum().backward(), "sparse_as_dense=True")
    expect_error(NotImplementedError, optimizer.synchronize, "in a group")  # nothing was submitted
    optimizer.zero_grad()  # and the optimizer is usable again


def check_wrapper(r, n):
    model = make_model(r)
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters())
    assert isinstance(optimizer, torch.optim.Optimizer) and optimizer.optimizer is inner
    assert optimizer.param_groups is inner.param_groups and optimizer.state is inner.state
    assert optimizer.defaults["momentum"] == 0.9
    hvd.broadcast_parameters(model.state_dict(), 0)
    extra = torch.nn.Parameter(torch.ones(4))
    optimizer.add_param_group({"params": [extra], "lr": 0.05})
    (x, y), = batches(r, 1)  # different data on every rank
    optimizer.zero_grad()
    (loss_fn(model, x, y) + (extra * (r + 1)).sum()).backward()
    optimizer.step()
    close(extra.grad, torch.full((4,), (n + 1) / 2), "added param group gradient")
    assert_same_on_all_ranks(hvd, list(model.parameters()) + [extra], "after add_param_group")
    state = optimizer.state_dict()
    optimizer.load_state_dict(state)
    assert len(optimizer.state_dict()["state"]) == len(state["state"])
    expect_error(TypeError, lambda: __import__("pickle").dumps(optimizer), "state_dict")
    # wrapping the same parameters again once the first wrapper is gone: its hooks went with it
    hooks_before = len(model[0].weight._post_accumulate_grad_hooks or {})
    del optimizer
    __import__("gc").collect()
    assert len(model[0].weight._post_accumulate_grad_hooks or {}) == hooks_before - 1, "stale hook left"
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    optimizer.zero_grad()
    loss_fn(model, x, y).backward()
    optimizer.step()
    assert_same_on_all_ranks(hvd, list(model.parameters()), "after re-wrapping")


def check_misuse(r, n):
    model = make_model()
    sgd = lambda: torch.optim.SGD(model.parameters(), lr=0.1)  # noqa: E731
    named = list(model.named_parameters())
    expect_error(ValueError, lambda: hvd.DistributedOptimizer(sgd(), named_parameters=[named[0]] + named),
                 "unique", named[0][0])
    expect_error(ValueError, lambda: hvd.DistributedOptimizer(sgd(), named_parameters=named[1:]),
                 "does not name 1", "param_groups[0]['params'][0]")
    expect_error(ValueError, lambda: hvd.DistributedOptimizer(sgd(), named_parameters=[p for _, p in named]),
                 "(name, parameter) tuples")
    expect_error(ValueError, lambda: hvd.DistributedOptimizer(sgd(), op=hvd.Sum, gradient_predivide_factor=2.0),
                 "op=Average")
    expect_error(ValueError, lambda: hvd.DistributedOptimizer(sgd(), groups=0), "groups")
    expect_error(ValueError, lambda: hvd.DistributedOptimizer(sgd(), backward_passes_per_step=0), "positive")

    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    (x, y), = batches(0, 1)
    loss_fn(model, shard(x, r, n), shard(y, r, n)).backward()
    expect_error(AssertionError, optimizer.zero_grad, "zero_grad() was called after loss.backward()")
    expect_error(AssertionError, lambda: loss_fn(model, shard(x, r, n), shard(y, r, n)).backward(),
                 "more than backward_passes_per_step=1 times")
    optimizer.synchronize()  # recover: the in-flight allreduces finish on every rank
    optimizer.zero_grad()
    loss_fn(model, shard(x, r, n), shard(y, r, n)).backward()
    optimizer.step()
    assert_same_on_all_ranks(hvd, list(model.parameters()), "after recovering from misuse")


@spmd.case
def init():
    hvd.init()


spmd.rank_cases(lambda: (hvd.rank(), hvd.size()), check_equivalence, check_unused_parameters, check_sparse,
                check_wrapper, check_misuse)


@spmd.case
def shutdown():
    hvd.shutdown()


if __name__ == "__main__":
    spmd.main()
