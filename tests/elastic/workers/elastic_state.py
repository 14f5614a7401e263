"""TorchState, ObjectState and ElasticSampler on several ranks without the driver (tests/elastic/test_elastic.py)."""

import random

import torch

import commlib.torch as hvd
import spmd
from commlib.elastic import ObjectState

r, n = spmd.rank_and_size()  # the job's, which commlib's are once init() ran


@spmd.case
def init():
    hvd.init()


@spmd.case
def object_state_sync_takes_rank_0s_values():
    # ObjectState with commlib's own broadcast: sync takes rank 0's saved values
    plain = ObjectState(epoch=10 + r, names=[r])
    plain.sync()
    assert (plain.epoch, plain.names) == (10, [0]), (plain.epoch, plain.names)


@spmd.case
def torch_state_sync_restore_and_commit():
    # TorchState: model, optimizer and attributes
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.fill_(r + 1.0)
        model.bias.fill_(-r)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()  # momentum buffers now exist, different on every rank
    state = hvd.elastic.TorchState(model, optimizer, step=5 + r)
    state.sync()
    weight = model.weight.detach().clone()
    everyone = hvd.allgather_object(weight.tolist())
    assert all(w == everyone[0] for w in everyone) and state.step == 5
    momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    with torch.no_grad():
        model.weight.add_(1.0)
    state.step = 6
    state.restore()
    assert torch.equal(model.weight, weight) and state.step == 5
    with torch.no_grad():
        model.weight.mul_(2.0)
    state.step = 7
    state.commit()
    state.restore()
    assert torch.equal(model.weight, 2 * weight) and state.step == 7
    assert all(torch.equal(optimizer.state[p]["momentum_buffer"], m) for p, m in zip(model.parameters(), momentum))


@spmd.case
def elastic_sampler_splits_and_resplits_after_a_restore():
    # ElasticSampler: the ranks split an epoch without overlap; after a restore the remainder is split again
    data = list(range(23))
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=4)
    state_sampler = hvd.elastic.TorchState(sampler=sampler)
    state_sampler.sync()
    mine = list(iter(sampler))
    everything = [i for part in hvd.allgather_object(mine) for i in part]
    assert set(everything) == set(data) and len(everything) == n * -(-23 // n) and len(mine) == len(sampler)
    sampler.record_batch(0, 2)
    state_sampler.commit()
    sampler.record_batch(1, 2)
    state_sampler.restore()
    assert sampler.processed_num == 2 * n
    rest = [i for part in hvd.allgather_object(list(iter(sampler))) for i in part]
    order = list(range(23))
    random.Random(4).shuffle(order)
    assert set(rest) == set(order[2 * n:]), (sorted(rest), order)


@spmd.case
def shutdown():
    hvd.shutdown()


if __name__ == "__main__":
    spmd.main()
