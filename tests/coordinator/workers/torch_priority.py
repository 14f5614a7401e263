"""DistributedOptimizer(priority="forward") and overlap_forward train to the same weights as the plain
optimizer; the priorities follow the recorded forward order; misuse is a clear error.

Run on 2 ranks with tiny partitions (COMMLIB_PRIORITY_PARTITION), so that the larger layers run as many
partitions and the queue drains over many rounds. On 2 ranks every partition's sum has the bits of the
whole tensor's (a + b), so the weights must be equal bit for bit.
"""

from __future__ import annotations

import sys

import torch

import commlib.torch as hvd
from torch_common import assert_same_on_all_ranks, expect_error
import spmd

STEPS = 4
BATCH = 8


class Reversed(torch.nn.Module):
    """Layers registered in the reverse of the order the forward pass uses them."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(64, 3)
        self.middle = torch.nn.Linear(256, 64)
        self.stem = torch.nn.Linear(6, 256)

    def forward(self, x):
        return self.head(torch.tanh(self.middle(torch.tanh(self.stem(x)))))


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
}


def train(r, n, opt_name, **kwargs):
    torch.manual_seed(0)
    model = Reversed()
    if kwargs.pop("with_model", False):
        kwargs["model"] = model
    optimizer = hvd.DistributedOptimizer(OPTIMIZERS[opt_name](model.parameters()),
                                         named_parameters=model.named_parameters(), **kwargs)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 + step)
        x, y = torch.randn(BATCH * n, 6, generator=g), torch.randn(BATCH * n, 3, generator=g)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[r * BATCH:(r + 1) * BATCH]), y[r * BATCH:(r + 1) * BATCH])
        loss.backward()
        optimizer.step()
        scheduler.step()
    optimizer.synchronize()  # overlap_forward: the last step's updates
    return model, optimizer


@spmd.case
def init():
    hvd.init()


def variants_give_the_plain_weights(opt_name):
    r, n = hvd.rank(), hvd.size()
    plain, _ = train(r, n, opt_name)
    variants = {
        "priority by registration": dict(priority="forward"),
        "priority by recorded forward": dict(priority="forward", with_model=True),
        "overlap_forward": dict(overlap_forward=True, with_model=True),
        "priority + overlap_forward": dict(priority="forward", overlap_forward=True, with_model=True),
    }
    for what, kwargs in variants.items():
        model, optimizer = train(r, n, opt_name, **kwargs)
        for (name, a), b in zip(plain.named_parameters(), model.parameters()):
            assert torch.equal(a, b), f"{opt_name}, {what}: {name} differs from the plain optimizer " \
                                      f"(max {float((a - b).abs().max())})"
        assert_same_on_all_ranks(hvd, list(model.parameters()), f"{opt_name}, {what}")
        if kwargs.get("priority") and kwargs.get("with_model"):
            # recorded forward order (stem, middle, head) beats registration order (head, middle, stem)
            prio = {optimizer._names[u[0]]: p for u, p in optimizer._priority.items()}
            assert prio["stem.weight"] > prio["stem.bias"] > prio["middle.weight"] > prio["head.weight"], prio
        elif kwargs.get("priority"):
            prio = {optimizer._names[u[0]]: p for u, p in optimizer._priority.items()}
            assert prio["head.weight"] > prio["middle.weight"] > prio["stem.weight"], prio


def case_for(opt_name):
    """The case ``<optimizer>_gives_the_plain_weights``: priority and overlap_forward against the plain one."""
    def run_variants():
        variants_give_the_plain_weights(opt_name)
    run_variants.__name__ = f"{opt_name}_gives_the_plain_weights"
    return spmd.case(run_variants)


for _name in OPTIMIZERS:
    case_for(_name)


@spmd.case
def misuse_is_a_clear_error():
    model = Reversed()
    expect_error(ValueError, lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                              overlap_forward=True), "needs model=")
    expect_error(ValueError, lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                              priority="backward"), "priority must be")


@spmd.case
def a_weight_read_before_its_update_is_an_error():
    class Sneaky(torch.nn.Module):  # reads a child's weight without calling the child
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(4, 2)

        def forward(self, x):
            return torch.nn.functional.linear(x, self.inner.weight, self.inner.bias)

    sneaky = Sneaky()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(sneaky.parameters(), lr=0.1),
                                         named_parameters=sneaky.named_parameters(), model=sneaky,
                                         overlap_forward=True)
    sneaky(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    expect_error(RuntimeError, lambda: sneaky(torch.ones(1, 4)).sum().backward(), "before its previous update")
    optimizer.synchronize()


if __name__ == "__main__":
    names = sys.argv[1:] or OPTIMIZERS  # optimizer names to run (default: all)
    spmd.main(["init", *(f"{name}_gives_the_plain_weights" for name in names), "misuse_is_a_clear_error",
               "a_weight_read_before_its_update_is_an_error"])
