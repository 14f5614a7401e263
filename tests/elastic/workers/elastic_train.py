"""Elastic training under commlib-run's driver (tests/elastic/test_elastic.py): a linear model, DistributedOptimizer,
ElasticSampler and TorchState committed after every step.

Each process logs to LOGDIR/<launch>.<rank>.log: its launch (a time rank 0 broadcasts at each start of the
training function: a restarted job, or the survivors going on in process), the step it
resumed at, the size, then per step the epoch, step and sample indices it trained on (before the step's allreduce) and the
time the step completed. Rank 0 writes the
final weights to LOGDIR/final.json. Optional, through the environment:
- ELASTIC_KILL_AT=s: in the first launch, rank 1 kills itself (SIGKILL) at step s, writing the time to
  LOGDIR/killed;
- ELASTIC_CUT_AT=s: at step s rank 0 writes LOGDIR/cut_please and waits for LOGDIR/cut (the test takes the
  last host's link down, writes the time there), once;
- ELASTIC_ADD_HOST_AT=s with ELASTIC_TRIGGER=f: at step s rank 0 creates f (the test's discovery script
  then prints one host more), once.
"""

import json
import os
import signal
import sys
import time

import torch

import commlib.torch as hvd

LOGDIR = sys.argv[1]
EPOCHS, SAMPLES, BATCH, LR = 2, 144, 4, 0.05
STEP_SLEEP = float(os.environ.get("ELASTIC_STEP_SLEEP", "0.05"))

hvd.init()
# MPICH's shared-memory files: a killed job leaves them in /dev/shm, and the test removes these afterwards
with open(os.path.join(LOGDIR, f"shm.{os.getpid()}.txt"), "w") as f:
    f.write("\n".join(sorted({line.split()[-1] for line in open("/proc/self/maps") if "/dev/shm/" in line})))

generator = torch.Generator().manual_seed(7)
features = torch.randn(SAMPLES, 4, generator=generator)
targets = features @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.25


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return i, features[i], targets[i]


model = torch.nn.Linear(4, 1)
with torch.no_grad():
    model.weight.zero_()
    model.bias.zero_()
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                     named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(Data(), shuffle=True, seed=3)
loader = torch.utils.data.DataLoader(Data(), batch_size=BATCH, sampler=sampler)
state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, step=0)


@hvd.elastic.run
def train(state):
    global rank, size
    rank, size = hvd.rank(), hvd.size()  # other ranks after an in-process recovery
    launch = hvd.broadcast_object(f"{time.time():.6f}" if rank == 0 else None)
    log = open(os.path.join(LOGDIR, f"{launch}.{rank}.log"), "w", buffering=1)
    log.write(json.dumps({"launch": launch, "rank": rank, "size": size, "start_step": state.step,
                          "time": time.time()}) + "\n")
    while state.epoch < EPOCHS:
        for _, (index, x, y) in enumerate(loader):
            if os.environ.get("ELASTIC_KILL_AT") and state.step == int(os.environ["ELASTIC_KILL_AT"]) and rank == 1 \
                    and not os.path.exists(os.path.join(LOGDIR, "killed")):
                with open(os.path.join(LOGDIR, "killed"), "w") as f:
                    f.write(f"{time.time()}\n")
                os.kill(os.getpid(), signal.SIGKILL)
            if os.environ.get("ELASTIC_CUT_AT") and state.step == int(os.environ["ELASTIC_CUT_AT"]) and rank == 0 \
                    and not os.path.exists(os.path.join(LOGDIR, "cut")):
                open(os.path.join(LOGDIR, "cut_please"), "w").close()  # the test takes the last host's link down
                while not os.path.exists(os.path.join(LOGDIR, "cut")):
                    time.sleep(0.01)
            if (os.environ.get("ELASTIC_ADD_HOST_AT") and state.step == int(os.environ["ELASTIC_ADD_HOST_AT"])
                    and rank == 0):
                open(os.environ["ELASTIC_TRIGGER"], "a").close()
            optimizer.zero_grad()
            loss = ((model(x).squeeze(1) - y) ** 2).mean()
            loss.backward()
            # logged before the step's allreduce: a rank cut off during it may have given its gradient to
            # the others (small tensors travel with the negotiation), who complete the step without it
            log.write(json.dumps({"epoch": state.epoch, "step": state.step, "indices": index.tolist(),
                                  "time": time.time()}) + "\n")
            optimizer.step()
            log.write(json.dumps({"done": state.step, "time": time.time()}) + "\n")
            state.sampler.record_batch(0, BATCH)
            state.step += 1
            time.sleep(STEP_SLEEP)
            state.commit()
        state.epoch += 1
        state.sampler.set_epoch(state.epoch)
        state.commit()


train(state)
if rank == 0:
    with open(os.path.join(LOGDIR, "final.json"), "w") as f:
        json.dump({"weight": model.weight.detach().reshape(-1).tolist(), "bias": model.bias.item(),
                   "step": state.step, "size": size}, f)
hvd.shutdown()
