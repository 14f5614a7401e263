"""A Ray driver (tests/ray/test_ray_executor.py): Ray Train's DataParallelTrainer runs a commlib job through
commlib.ray.train.CommlibConfig on 2 workers; the training function checks its rank against Ray Train's,
allreduces, trains a few steps with DistributedOptimizer, reports through ray.train.report and writes what it
saw to OUT/rank<N>.json (Ray Train 2.60 keeps metrics only with checkpoints, which would need storage)."""

import json
import os
import sys

import ray
from ray.train import ScalingConfig
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from commlib.ray.train import CommlibConfig


def train_loop(config):
    import numpy as np
    import torch

    import commlib.torch as hvd
    import ray.train

    hvd.init()
    context = ray.train.get_context()
    assert (hvd.rank(), hvd.size()) == (context.get_world_rank(), context.get_world_size()), \
        (hvd.rank(), hvd.size(), context.get_world_rank(), context.get_world_size())
    assert hvd.local_rank() == context.get_local_rank(), (hvd.local_rank(), context.get_local_rank())
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    torch.manual_seed(hvd.rank())  # different on purpose: the broadcast makes them equal
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.from_numpy(np.random.default_rng(hvd.rank()).normal(size=(32, 4)).astype(np.float32))
    for _ in range(config["steps"]):
        optimizer.zero_grad()
        ((model(x).squeeze(1) - x.sum(1)) ** 2).mean().backward()
        optimizer.step()
    weights = hvd.allgather(model.weight.detach().reshape(1, -1))
    same = bool(torch.allclose(weights[0], weights[-1]))
    metrics = {"rank": hvd.rank(), "size": hvd.size(), "sum": total, "same_weights": same}
    ray.train.report(metrics)
    with open(os.path.join(config["out"], f"rank{hvd.rank()}.json"), "w") as f:
        json.dump(metrics, f)


ray.init(address="auto", logging_level="WARNING")
OUT = sys.argv[1]
trainer = DataParallelTrainer(train_loop, train_loop_config={"steps": 5, "out": OUT}, backend_config=CommlibConfig(),
                              scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}))
result = trainer.fit()
assert result.error is None, result.error
seen = [json.load(open(os.path.join(OUT, f"rank{r}.json"))) for r in range(2)]
print("SEEN", seen, flush=True)
assert [m["rank"] for m in seen] == [0, 1] and all(m["size"] == 2 and m["sum"] == 3.0 and m["same_weights"]
                                                   for m in seen), seen
print("ALL OK", flush=True)
