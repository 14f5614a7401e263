"""DistributedOptimizer's plain step() updates each communication unit as its reduction finishes; the
weights and the optimizer state must be bit for bit those of the blocking step (synchronize(), then one
step of the wrapped optimizer over all parameters).

Run on 2 ranks. Rank 1 sleeps before the first layer's gradient, so on rank 0 the other units' reductions
finish while the first layer's is still waiting: rank 0's step must update in several parts (checked by
counting the wrapped optimizer's step calls), and still give the bits of the single update.
"""

from __future__ import annotations

import time

import torch

import commlib.torch as hvd
from torch_common import assert_same_on_all_ranks
from worker import run

STEPS = 5
BATCH = 8

OPTIMIZERS = {
    "sgd momentum": lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.9),
    "sgd nesterov foreach": lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3,
                                                      foreach=True),
    "adam": lambda g: torch.optim.Adam(g, lr=0.01),
    "adam foreach": lambda g: torch.optim.Adam(g, lr=0.01, foreach=True),
    "adam fused": lambda g: torch.optim.Adam(g, lr=0.01, fused=True),
    "adamw amsgrad": lambda g: torch.optim.AdamW(g, lr=0.01, amsgrad=True),
    "rmsprop momentum": lambda g: torch.optim.RMSprop(g, lr=0.01, momentum=0.5),
    "adagrad": lambda g: torch.optim.Adagrad(g, lr=0.05),
}


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 96), torch.nn.Tanh(), torch.nn.Linear(96, 96), torch.nn.Tanh(),
                               torch.nn.Linear(96, 3))


class CountSteps:
    """Count the calls of an optimizer class's step (patched on the class, so the instance stays plain)."""

    def __init__(self, cls):
        self.cls, self.calls = cls, 0

    def __enter__(self):
        self.original = original = self.cls.step

        def step(optimizer, *args, **kwargs):
            self.calls += 1
            return original(optimizer, *args, **kwargs)

        self.cls.step = step
        return self

    def __exit__(self, *exc):
        self.cls.step = self.original


def train(r, n, make, overlapped):
    model = make_model()
    # two groups with different learning rates
    groups = [{"params": model[0].parameters(), "lr": 0.02}, {"params": list(model[2:].parameters())}]
    optimizer = hvd.DistributedOptimizer(make(groups), named_parameters=model.named_parameters())
    if r == 1:  # the first layer's gradient (the last of backward) comes late from rank 1
        model[0].weight.register_hook(lambda grad: time.sleep(0.05))
    calls = []
    with CountSteps(type(optimizer.optimizer)) as counter:
        for step in range(STEPS):
            g = torch.Generator().manual_seed(100 + step)
            x, y = torch.randn(BATCH * n, 6, generator=g), torch.randn(BATCH * n, 3, generator=g)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x[r * BATCH:(r + 1) * BATCH]), y[r * BATCH:(r + 1) * BATCH]).backward()
            before = counter.calls
            if overlapped:
                optimizer.step()
            else:
                optimizer.synchronize()
                with optimizer.skip_synchronize():
                    optimizer.step()
            calls.append(counter.calls - before)
    return model, optimizer, calls


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for label, make in OPTIMIZERS.items():
        model, optimizer, calls = train(r, n, make, overlapped=True)
        reference, ref_optimizer, ref_calls = train(r, n, make, overlapped=False)
        assert ref_calls == [1] * STEPS, (label, ref_calls)
        if r == 0:
            assert max(calls) >= 2, f"{label}: the step was not overlapped on rank 0 (step calls {calls})"
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            assert torch.equal(p, q), f"{label}: {name} differs from the blocking step's"
            state, ref_state = optimizer.state[p], ref_optimizer.state[q]
            assert state.keys() == ref_state.keys(), (label, name, state.keys(), ref_state.keys())
            for key in state:
                assert same(state[key], ref_state[key]), f"{label}: state {key!r} of {name} differs"
            if "step" in state:  # per-step counters advance once per step
                assert float(state["step"]) == STEPS, (label, name, state["step"])
        assert_same_on_all_ranks(hvd, list(model.parameters()), label)

    # not overlapped where it would not be the same: a step hook sees one step of all parameters
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    seen = []
    optimizer.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append(sum(len(g["params"]) for g in opt.param_groups)))
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(BATCH, 6)).sum().backward()
        optimizer.step()
    assert seen == [6, 6], seen
    hvd.shutdown()
    print(f"[rank {r}] torch_overlap_step OK on {n} ranks", flush=True)


if __name__ == "__main__":
    run(main)
