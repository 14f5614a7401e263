"""A byteps.torch training script run on commlib: the only change is the import line.

    mpiexec -genv COMMLIB_ALGORITHM ps -n 2 python examples/train_byteps.py : -n 2 python -m commlib.server

BytePS would launch the same script with its own launcher and servers; here the summation servers are
extra ranks of the MPI job (docs/servers.md). ``COMMLIB_ALGORITHM=ps`` sends the DistributedOptimizer's
gradients through them; ``bps.push_pull`` always goes through them. The script fits a small MLP to a
synthetic regression task (the data is generated here, nothing is downloaded) and exits non-zero unless
the loss falls below a tenth of where it started.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

import commlib.torch as bps  # was: import byteps.torch as bps


def main() -> int:
    bps.init()
    torch.manual_seed(1234 + bps.rank())  # a different model on every worker until the broadcast
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * bps.size(), momentum=0.9)
    optimizer = bps.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=bps.Compression.none)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(optimizer, root_rank=0)

    g = torch.Generator().manual_seed(7)  # the same task on every worker, each its own samples
    teacher = torch.randn(32, 1, generator=g)
    first = last = None
    for step in range(200):
        x = torch.randn(64, 32, generator=torch.Generator().manual_seed(step * 1000 + bps.rank()))
        y = torch.tanh(x @ teacher)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        mean_loss = bps.push_pull(loss.detach().reshape(1), average=True, name="loss").item()
        first = mean_loss if first is None else first
        last = mean_loss
        if step % 50 == 0 and bps.rank() == 0:
            print(f"step {step:3d}  loss {mean_loss:.5f}  ({bps.size()} workers)", flush=True)
    if bps.rank() == 0:
        print(f"final loss {last:.5f} (started at {first:.5f})", flush=True)
    bps.shutdown()
    return 0 if last < first / 10 else 1


if __name__ == "__main__":
    sys.exit(main())
