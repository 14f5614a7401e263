"""The parts of commlib.torch added for Horovod compatibility, on any number of ranks: grouped allgather
and reducescatter (results and gradients), reducescatter's scaling and gradient as Horovod computes
them, Adasum against its definition, sparse_allreduce_async, SyncBatchNorm against BatchNorm on the
combined batch, join(device), DistributedOptimizer._parameter_names, broadcast_optimizer_state's zero
gradients. Every rank's input is a known function of its rank, so references are computed locally.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

import commlib.torch as hvd
from commlib import adasum
from torch_common import close, expect_error
import spmd


def rows_of(r):
    """Rank r's first dimension in the variable-size cases: 0, 1, 3, 2, ... (rank 0 has none)."""
    return [0, 1, 3, 2, 4][r % 5]


def block(total, n, r):
    """Rows of rank r when ``total`` rows are split over n ranks (earlier ranks take the extra)."""
    base, extra = divmod(total, n)
    start = r * base + min(r, extra)
    return start, base + (1 if r < extra else 0)


def check_grouped_allgather(r, n):
    for dtype in (torch.float32, torch.int16, torch.uint8, torch.float64):
        tensors = [torch.full((rows_of(r), 2, 3), r + k, dtype=dtype) for k in range(3)]
        gathered = hvd.grouped_allgather(tensors, name=f"ga.{dtype}")
        for k, g in enumerate(gathered):
            expected = torch.cat([torch.full((rows_of(q), 2, 3), q + k, dtype=dtype) for q in range(n)])
            assert torch.equal(g, expected), f"grouped_allgather {dtype} tensor {k}"
        gathered = hvd.synchronize(hvd.grouped_allgather_async(tensors))
        assert torch.equal(gathered[2], expected)
    # gradient: averaged over ranks, own rows kept (Horovod's rule), per tensor
    xs = [torch.full((rows_of(r) + 1, 4), 1.0 + k, requires_grad=True) for k in range(2)]
    outs = hvd.grouped_allgather(xs)
    total = sum(rows_of(q) + 1 for q in range(n))
    weights = [torch.arange(total * 4, dtype=torch.float32).reshape(total, 4) * (k + 1) for k in range(2)]
    sum((o * w).sum() for o, w in zip(outs, weights)).backward()
    start = sum(rows_of(q) + 1 for q in range(r))
    for k, x in enumerate(xs):
        close(x.grad, weights[k][start:start + rows_of(r) + 1], f"grouped_allgather gradient {k}")


def check_grouped_reducescatter(r, n):
    for total in (0, 1, n - 1, 2 * n + 1, 4 * n):
        tensors = [(torch.arange(total * 3, dtype=torch.float64).reshape(total, 3) + r) * (k + 1) for k in range(2)]
        outs = hvd.grouped_reducescatter(tensors, op=hvd.Sum, name=f"grs.{total}")
        start, rows = block(total, n, r)
        for k, out in enumerate(outs):
            expected = sum((torch.arange(total * 3, dtype=torch.float64).reshape(total, 3) + q) * (k + 1)
                           for q in range(n))[start:start + rows]
            close(out, expected, f"grouped_reducescatter {total} rows, tensor {k}")
    # async, Average
    tensors = [torch.full((2 * n, 2), float(r + 1))]
    out = hvd.synchronize(hvd.grouped_reducescatter_async(tensors, op=hvd.Average))[0]
    close(out, torch.full((2, 2), (n + 1) / 2), "grouped_reducescatter_async average")
    # gradients: Horovod's rule (Sum: times size; Average: not divided; times the scale factors)
    for op, factor in ((hvd.Sum, n), (hvd.Average, 1)):
        xs = [torch.ones(2 * n, 3, requires_grad=True) for _ in range(2)]
        outs = hvd.grouped_reducescatter(xs, op=op, prescale_factor=0.5, postscale_factor=3.0)
        sum(o.sum() * (k + 1) for k, o in enumerate(outs)).backward()
        for k, x in enumerate(xs):
            close(x.grad, torch.full((2 * n, 3), (k + 1) * factor * 1.5), f"grouped_reducescatter grad {op!r}")
        x = torch.ones(2 * n, 3, requires_grad=True)
        hvd.reducescatter(x, op=op).sum().backward()
        close(x.grad, torch.full((2 * n, 3), float(factor)), f"reducescatter gradient {op!r}")


def check_reducescatter_scaling(r, n):
    """Integers scale in float64 and truncate (prescale per rank, postscale after the sum); integer
    Average divides the sum the same way; Adasum is refused."""
    x = torch.tensor([[7 + r], [-9 - r]] * n, dtype=torch.int32)
    start, rows = block(2 * n, n, r)
    pre = hvd.reducescatter(x, op=hvd.Sum, prescale_factor=0.3)
    expected = sum((torch.tensor([[7 + q], [-9 - q]] * n).double() * 0.3).to(torch.int32) for q in range(n))
    assert torch.equal(pre, expected[start:start + rows]), (pre, expected)
    post = hvd.reducescatter(x, op=hvd.Sum, postscale_factor=0.3)
    summed = sum(torch.tensor([[7 + q], [-9 - q]] * n) for q in range(n))
    assert torch.equal(post, (summed.double() * 0.3).to(torch.int32)[start:start + rows]), post
    avg = hvd.reducescatter(x, op=hvd.Average)
    assert avg.dtype == torch.int32
    assert torch.equal(avg, (summed.double() / n).to(torch.int32)[start:start + rows]), avg
    half = hvd.reducescatter(torch.full((n, 2), 3.0, dtype=torch.float16), op=hvd.Sum, prescale_factor=0.1)
    close(half, torch.full((1, 2), float(torch.tensor(0.3, dtype=torch.float16)) * n), "float16 prescale",
          rtol=1e-3)
    expect_error(RuntimeError, lambda: hvd.reducescatter(torch.ones(n, 2), op=hvd.Adasum), "Adasum")


def check_adasum(r, n):
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((n, 3, 7))
    for dtype in (torch.float64, torch.float32):
        mine = torch.tensor(vectors[r], dtype=dtype)
        out = hvd.allreduce(mine, op=hvd.Adasum, name=f"adasum.{dtype}")
        expected = adasum.reduce([vectors[q].astype(mine.numpy().dtype) for q in range(n)])
        close(out, torch.from_numpy(expected), f"Adasum {dtype}", rtol=1e-5, atol=1e-6)
        inplace = mine.clone()
        assert hvd.synchronize(hvd.allreduce_async_(inplace, op=hvd.Adasum)) is inplace
        close(inplace, out, "Adasum in place")
        numpy_result = adasum.allreduce(vectors[r].astype(mine.numpy().dtype), prescale_factor=2.0,
                                        postscale_factor=0.25)
        close(torch.from_numpy(numpy_result), out * 0.5, "Adasum in the numpy API, scaled", rtol=1e-5, atol=1e-6)
    # definition: orthogonal gradients add up, identical ones average
    basis = torch.zeros(n + 1, dtype=torch.float64)
    basis[r] = r + 1.0
    close(hvd.allreduce(basis, op=hvd.Adasum), torch.tensor([q + 1.0 for q in range(n)] + [0.0]), "Adasum orthogonal")
    same = torch.arange(5, dtype=torch.float64)
    close(hvd.allreduce(same, op=hvd.Adasum), same, "Adasum identical")
    # zero vector on every rank but one: the nonzero one survives unchanged
    lone = torch.full((4,), 2.0 if r == n - 1 else 0.0, dtype=torch.float64)
    close(hvd.allreduce(lone, op=hvd.Adasum), torch.full((4,), 2.0), "Adasum with zero vectors")
    # gradient: an Adasum of the gradients
    x = torch.tensor(vectors[r][0], requires_grad=True)
    hvd.allreduce(x, op=hvd.Adasum).sum().backward()
    close(x.grad, torch.ones(7, dtype=torch.float64), "Adasum gradient of identical ones")
    expect_error(RuntimeError, lambda: hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum),
                 "floating dtype")


def check_sparse(r, n):
    dense = torch.zeros(6, 3)
    dense[r % 6] = r + 1.0
    dense[(r + 2) % 6, 1] = 1.0
    for op in (hvd.Average, hvd.Sum):
        result = hvd.sparse_allreduce_async(dense.to_sparse(), name=f"sparse.{op!r}", op=op)()
        assert result.is_sparse
        close(result.to_dense(), hvd.allreduce(dense, op=op), f"sparse_allreduce_async {op!r}")
    expect_error(ValueError, lambda: hvd.sparse_allreduce_async(dense.to_sparse(), name="s", op=hvd.Max), "Sum")


def check_sync_batch_norm(r, n):
    """Forward, running statistics and gradients against BatchNorm on every rank's batch concatenated,
    with uneven batch sizes (rank 0 of 3+ ranks has a batch of its own of 2, the others 1, 3, 2, 4)."""
    sizes = [2, 1, 3, 2, 4][:n] if n > 1 else [3]
    torch.manual_seed(11)
    for shape, bn_class in (((5,), torch.nn.BatchNorm1d), ((5, 4), torch.nn.BatchNorm1d),
                            ((5, 3, 2), torch.nn.BatchNorm2d)):
        full = torch.randn(sum(sizes), *shape, dtype=torch.float64) * 3 + 1
        weights = torch.randn_like(full)
        start = sum(sizes[:r])
        mine = full[start:start + sizes[r]].clone().requires_grad_()
        everyone = full.clone().requires_grad_()
        sync, plain = hvd.SyncBatchNorm(5).double(), bn_class(5).double()
        for module in (sync, plain):
            with torch.no_grad():
                module.weight.copy_(torch.linspace(0.5, 2, 5))
                module.bias.copy_(torch.linspace(-1, 1, 5))
        for step in range(2):  # running statistics over two steps
            out, ref = sync(mine), plain(everyone)
        close(out, ref[start:start + sizes[r]], f"SyncBatchNorm forward {shape}", rtol=1e-9, atol=1e-9)
        close(sync.running_mean, plain.running_mean, "running_mean", rtol=1e-9, atol=1e-12)
        close(sync.running_var, plain.running_var, "running_var", rtol=1e-9, atol=1e-12)
        (out * weights[start:start + sizes[r]]).sum().backward()
        (ref * weights).sum().backward()
        close(mine.grad, everyone.grad[start:start + sizes[r]], f"SyncBatchNorm input gradient {shape}",
              rtol=1e-8, atol=1e-10)
        close(hvd.allreduce(sync.weight.grad, op=hvd.Sum), plain.weight.grad, "weight gradient", rtol=1e-8)
        close(hvd.allreduce(sync.bias.grad, op=hvd.Sum), plain.bias.grad, "bias gradient", rtol=1e-8)
        sync.eval(), plain.eval()
        close(sync(mine), plain(everyone)[start:start + sizes[r]], "SyncBatchNorm eval", rtol=1e-9, atol=1e-9)


def check_optimizer_and_state(r, n):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD([{"params": model[0].parameters()},
                                                          {"params": model[1].parameters()}], lr=0.1))
    names = optimizer._parameter_names
    assert len(names) == 4 and len(set(names.values())) == 4
    assert hvd.allgather_object(sorted(names.values())) == [sorted(names.values())] * n
    model[0](torch.ones(1, 3)).sum().backward()
    optimizer.synchronize()
    with warnings.catch_warnings(record=True) as caught:  # Horovod's warning; no second reduction here
        warnings.simplefilter("always")
        optimizer.step()
    assert any("skip_synchronize" in str(w.message) for w in caught), [str(w.message) for w in caught]
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    live = torch.nn.Parameter(torch.ones(3))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD([frozen, live], lr=0.1, momentum=0.9))
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert frozen.grad is None and torch.equal(live.grad, torch.zeros(3)), "zero gradient where one is required"
    assert torch.equal(live.data, torch.ones(3)), "no step was taken"


class Widen:
    """A user-written compressor with Horovod's interface: float64 on the wire, the caller's dtype back."""

    calls = 0

    @staticmethod
    def compress(tensor):
        Widen.calls += 1
        return tensor.to(torch.float64), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx)


def check_user_compressor(r, n):
    x = torch.full((2 * n, 3), r + 0.5)
    out = hvd.allreduce(x, op=hvd.Sum, compression=Widen)
    assert out.dtype == torch.float32 and Widen.calls == 1
    close(out, torch.full((2 * n, 3), sum(q + 0.5 for q in range(n))), "allreduce with a user compressor")
    inplace = x.clone()
    hvd.allreduce_(inplace, op=hvd.Average, compression=Widen)
    close(inplace, torch.full((2 * n, 3), n / 2), "allreduce_ with a user compressor")
    block = hvd.reducescatter(x, op=hvd.Sum, compression=Widen)
    assert block.dtype == torch.float32
    close(block, torch.full((2, 3), sum(q + 0.5 for q in range(n))), "reducescatter with a user compressor")


def check_process_sets(r, n):
    """The torch face passes process_set= through: results, gradients and the optimizer within a set."""
    # on one rank the even ranks are the world, which is registered already
    evens = hvd.add_process_set(list(range(0, n, 2))) if n > 1 else hvd.global_process_set
    mine = evens if r % 2 == 0 else None
    if mine is not None:
        members = list(range(0, n, 2))
        total = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, process_set=mine)
        close(total, torch.tensor([float(sum(members))]), "allreduce in a set")
        gathered = hvd.grouped_allgather([torch.tensor([r]), torch.tensor([[r, r]])], process_set=mine)
        assert gathered[0].tolist() == members and gathered[1][:, 0].tolist() == members
        x = torch.ones(2 * len(members), requires_grad=True)
        hvd.reducescatter(x, op=hvd.Sum, process_set=mine).sum().backward()
        close(x.grad, torch.full_like(x, float(len(members))), "reducescatter gradient in a set")
        if n > 1:
            expect_error(NotImplementedError,
                         lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum, process_set=mine), "global process set")
    torch.manual_seed(r)
    model = torch.nn.Linear(3, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    before = model.weight.detach().clone()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                         named_parameters=model.named_parameters(), process_set=evens)
    model(torch.full((1, 3), r + 1.0)).sum().backward()
    optimizer.step()
    if mine is not None:  # averaged over the even ranks: x = r + 1 per rank
        expected = before - 0.5 * sum(q + 1.0 for q in range(0, n, 2)) / len(range(0, n, 2))
    else:  # outside the set: its own gradient
        expected = before - 0.5 * (r + 1.0)
    close(model.weight, expected, "DistributedOptimizer with a process set")
    if n > 1:
        hvd.remove_process_set(evens)


def check_alltoall_arguments(r, n):
    """Horovod raises ValueError on the calling rank for splits that cannot work."""
    expect_error(ValueError, lambda: hvd.alltoall(torch.empty(n + 1)) if n > 1 else hvd.alltoall(torch.empty(0, 2), [1]),
                 "alltoall")
    expect_error(ValueError, lambda: hvd.alltoall(torch.empty(n + 1), torch.ones(n, dtype=torch.int32)), "splits")
    expect_error(ValueError, lambda: hvd.alltoall(torch.empty(n), torch.ones(n)), "integers")


def check_join(r, n):
    last = [hvd.join(device) for device in (-1, 0)]
    assert hvd.allgather_object(last) == [last] * n
    expect_error(TypeError, lambda: hvd.join("cpu"), "device")


@spmd.case
def init():
    hvd.init()


spmd.rank_cases(lambda: (hvd.rank(), hvd.size()), check_grouped_allgather, check_grouped_reducescatter,
                check_reducescatter_scaling, check_adasum, check_sparse, check_sync_batch_norm,
                check_optimizer_and_state, check_user_compressor, check_process_sets, check_alltoall_arguments,
                check_join)


@spmd.case
def shutdown():
    hvd.shutdown()


if __name__ == "__main__":
    spmd.main()
