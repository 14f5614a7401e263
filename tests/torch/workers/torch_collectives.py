"""commlib.torch collectives, their autograd, broadcast helpers and misuse errors, on any number of ranks.

Every result is checked against a reference computed locally from the data every rank can regenerate
(rank r's input is a known function of r).
"""

from __future__ import annotations

import numpy as np
import torch

import commlib as cl
import commlib.torch as hvd
from torch_common import assert_same_on_all_ranks, close, expect_error
import spmd

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64]


def data(r, shape, dtype=torch.float32):
    """Rank r's input: small integers (exact in every dtype and in every sum below)."""
    n = int(np.prod(shape)) if shape else 1
    values = (torch.arange(n, dtype=torch.float64) % 5) + r + 1
    return values.reshape(shape).to(dtype)


def reference(shape, dtype, op, n):
    inputs = torch.stack([data(r, shape, torch.float64) for r in range(n)])
    result = {hvd.Sum: inputs.sum(0), hvd.Average: inputs.mean(0), hvd.Min: inputs.min(0).values,
              hvd.Max: inputs.max(0).values, hvd.Product: inputs.prod(0)}[op]
    return result


def check_queries(r, n):
    assert hvd.mpi_built() is True and hvd.mpi_enabled() is True
    assert hvd.nccl_built() == cl.nccl_built() and type(hvd.nccl_built()) is int  # NCCL where the device path has it
    for query in (hvd.gloo_built, hvd.gloo_enabled, hvd.ddl_built, hvd.ccl_built, hvd.rocm_built):
        assert query() is False, query.__name__
    assert isinstance(hvd.mpi_threads_supported(), bool)
    assert hvd.is_initialized()
    assert 0 <= hvd.local_rank() < hvd.local_size() and 0 <= hvd.cross_rank() < hvd.cross_size()
    import commlib
    assert hvd.cuda_built() is commlib.cuda_built()   # CuPy and a GPU (docs/gpu.md)

    assert hvd.HorovodInternalError is commlib.CollectiveError
    assert hvd.Compression is commlib.Compression


def check_allreduce(r, n):
    shape = (3, 5)
    for dtype in DTYPES:
        ops = [hvd.Sum, hvd.Min, hvd.Max] + ([hvd.Average] if dtype.is_floating_point else [])
        if n <= 3 and dtype not in (torch.int8, torch.uint8):
            ops.append(hvd.Product)
        for op in ops:
            name = f"ar.{dtype}.{op.name}"
            x = data(r, shape, dtype)
            before = x.clone()
            expected = reference(shape, dtype, op, n).to(dtype)
            out = hvd.allreduce(x, name=name, op=op)
            assert out.dtype == dtype and out.shape == x.shape, name
            assert torch.equal(x, before), f"{name}: allreduce modified its input"
            tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
            close(out.float(), expected.float(), name, rtol=tol)
            y = x.clone()
            pointer = y.data_ptr()
            result = hvd.allreduce_(y, name=name + "_", op=op)
            assert result is y and y.data_ptr() == pointer, f"{name}: allreduce_ did not work in place"
            close(y.float(), expected.float(), name + "_", rtol=tol)
    # async forms, poll, and the default op (Average); out-of-place results are writable torch tensors
    x = data(r, (1000,))
    handle = hvd.allreduce_async(x, name="ar.async")
    out = hvd.synchronize(handle)
    assert hvd.poll(handle) and hvd.synchronize(handle) is out
    close(out, reference((1000,), torch.float32, hvd.Average, n), "allreduce_async")
    out.add_(1)  # must be writable
    handle = hvd.allreduce_async_(x, name="ar.async_", op=hvd.Sum)
    while not hvd.poll(handle):
        pass
    assert hvd.synchronize(handle) is x
    close(x, reference((1000,), torch.float32, hvd.Sum, n), "allreduce_async_")
    # deprecated average flag
    out = hvd.allreduce(data(r, (4,)), average=False, name="ar.avgflag")
    close(out, reference((4,), torch.float32, hvd.Sum, n), "average=False")
    # scale factors: Average divides by size after the postscale
    out = hvd.allreduce(data(r, (7,)), name="ar.scaled", op=hvd.Average, prescale_factor=3.0, postscale_factor=0.5)
    close(out, reference((7,), torch.float32, hvd.Sum, n) * 1.5 / n, "pre/postscale")
    # wire compression: float32 in, float32 out, half precision on the wire
    for compression in (hvd.Compression.fp16, hvd.Compression.bf16):
        x = torch.linspace(-3, 3, 257) * (r + 1)
        out = hvd.allreduce(x, name=f"ar.{compression}", compression=compression, op=hvd.Sum)
        assert out.dtype == torch.float32
        expected = torch.linspace(-3, 3, 257) * sum(range(1, n + 1))
        close(out, expected, f"allreduce {compression}", rtol=2e-2, atol=2e-2 * n)
    # grouped
    xs = [data(r, (4,)), data(r, (2, 3), torch.float64), data(r, (5,), torch.int32)]
    outs = hvd.grouped_allreduce(xs, name="gar", op=hvd.Sum)
    for i, (x, o) in enumerate(zip(xs, outs)):
        assert o.dtype == x.dtype
        close(o, reference(tuple(x.shape), x.dtype, hvd.Sum, n), f"grouped_allreduce[{i}]")
    result = hvd.grouped_allreduce_(xs, name="gar_", op=hvd.Max)
    assert all(a is b for a, b in zip(result, xs))
    for i, x in enumerate(xs):
        close(x, reference(tuple(x.shape), x.dtype, hvd.Max, n), f"grouped_allreduce_[{i}]")


def check_gather_broadcast(r, n):
    for dtype in (torch.bfloat16, torch.float32, torch.int64, torch.uint8):
        x = data(r, (r + 1, 3), dtype)
        out = hvd.allgather(x, name=f"ag.{dtype}")
        expected = torch.cat([data(k, (k + 1, 3), dtype) for k in range(n)])
        assert out.dtype == dtype and torch.equal(out, expected), f"allgather {dtype}"
    out = hvd.synchronize(hvd.allgather_async(data(r, (2,)), name="ag.async"))
    assert torch.equal(out, torch.cat([data(k, (2,)) for k in range(n)]))

    root = n - 1
    for dtype in (torch.bfloat16, torch.float64, torch.int32):
        x = data(r, (4, 2), dtype)
        out = hvd.broadcast(x, root, name=f"bc.{dtype}")
        assert torch.equal(out, data(root, (4, 2), dtype)) and torch.equal(x, data(r, (4, 2), dtype))
        assert hvd.broadcast_(x, root, name=f"bc_.{dtype}") is x and torch.equal(x, data(root, (4, 2), dtype))
    x = data(r, (3,))
    assert hvd.synchronize(hvd.broadcast_async_(x, 0, name="bc.async_")) is x
    assert torch.equal(x, data(0, (3,)))
    assert torch.equal(hvd.synchronize(hvd.broadcast_async(data(r, (3,)), root, name="bc.async")), data(root, (3,)))

    # reducescatter: rows not divisible by the rank count; earlier ranks take the extra rows
    rows = 2 * n + 1
    x = data(r, (rows, 2))
    bounds = np.cumsum([0] + [rows // n + (1 if k < rows % n else 0) for k in range(n)])
    for op in (hvd.Sum, hvd.Average):
        out = hvd.reducescatter(x, name=f"rs.{op.name}", op=op)
        close(out, reference((rows, 2), torch.float32, op, n)[bounds[r]:bounds[r + 1]], f"reducescatter {op.name}")
    out = hvd.synchronize(hvd.reducescatter_async(x, name="rs.scaled", op=hvd.Sum, prescale_factor=2.0,
                                                  postscale_factor=0.25))
    close(out, reference((rows, 2), torch.float32, hvd.Sum, n)[bounds[r]:bounds[r + 1]] * 0.5, "reducescatter scaled")

    # alltoall: rank r sends (k + r) % 3 rows to rank k, row values identify sender and position
    def rows_for(src, dst):
        return (dst + src) % 3

    def block(src):
        parts = [torch.full((rows_for(src, k), 2), float(100 * src + k)) for k in range(n)]
        return torch.cat(parts)

    splits = [rows_for(r, k) for k in range(n)]
    for kind in ("list", "tensor"):
        given = splits if kind == "list" else torch.tensor(splits, dtype=torch.int32)
        out, received = hvd.alltoall(block(r), splits=given, name=f"a2a.{kind}")
        expected = torch.cat([torch.full((rows_for(k, r), 2), float(100 * k + r)) for k in range(n)])
        assert torch.equal(out, expected), f"alltoall ({kind} splits)"
        assert received.tolist() == [rows_for(k, r) for k in range(n)], f"received splits {received.tolist()}"
    x = torch.arange(2 * n, dtype=torch.float32) + 10 * r
    out = hvd.alltoall(x, name="a2a.even")
    assert torch.equal(out, torch.tensor([10 * k + 2 * r + j for k in range(n) for j in range(2)], dtype=torch.float32))
    out, received = hvd.synchronize(hvd.alltoall_async(x, name="a2a.async"))
    assert received.dtype == torch.int32 and received.tolist() == [2] * n

    # timeline: one Chrome-trace file per rank naming the tensors, Horovod's activity names, cycle marks
    import glob
    import json
    import shutil
    import tempfile

    directory = hvd.broadcast_object(tempfile.mkdtemp() if r == 0 else None, root_rank=0)
    hvd.start_timeline(f"{directory}/trace.json", mark_cycles=True)
    hvd.allreduce(torch.ones(8), name="timeline.tensor")
    hvd.stop_timeline()
    hvd.barrier()
    files = sorted(glob.glob(f"{directory}/trace*.json"))
    assert len(files) == n, f"timeline files {files}"
    mine = f"{directory}/trace.json" if r == 0 else f"{directory}/trace.rank{r}.json"
    text = open(mine).read()
    assert "timeline.tensor" in text and json.loads(text)
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "CYCLE_START"} <= {e["name"] for e in json.loads(text)}
    hvd.barrier()
    if r == 0:
        shutil.rmtree(directory)

    assert hvd.broadcast_object({"from": r, "list": [1, 2]}, root_rank=root) == {"from": root, "list": [1, 2]}
    assert hvd.allgather_object(("rank", r)) == [("rank", k) for k in range(n)]


def check_autograd(r, n):
    w = lambda k, shape: data(k, shape) * 0.5  # noqa: E731 - rank k's upstream gradient

    # allreduce: gradient is the allreduce of the gradient, same op and scales
    for op, pre, post in ((hvd.Average, 1.0, 1.0), (hvd.Sum, 2.0, 0.5)):
        x = data(r, (3, 2)).requires_grad_()
        (hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post) * w(r, (3, 2))).sum().backward()
        upstream = torch.stack([w(k, (3, 2)) for k in range(n)]).sum(0) * pre * post
        close(x.grad, upstream / n if op is hvd.Average else upstream, f"allreduce grad {op.name}")
    # grouped_allreduce
    a, b = data(r, (2,)).requires_grad_(), data(r, (3,)).requires_grad_()
    ya, yb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    ((ya * w(r, (2,))).sum() + (yb * w(r, (3,))).sum()).backward()
    close(a.grad, sum(w(k, (2,)) for k in range(n)), "grouped grad 0")
    close(b.grad, sum(w(k, (3,)) for k in range(n)), "grouped grad 1")
    # allgather: average of the upstream gradients, this rank's rows; sum() gives an expanded gradient
    total = n * (n + 1) // 2
    x = data(r, (r + 1, 2)).requires_grad_()
    (hvd.allgather(x) * w(r, (total, 2))).sum().backward()
    offset = r * (r + 1) // 2
    mean_upstream = torch.stack([w(k, (total, 2)) for k in range(n)]).mean(0)
    close(x.grad, mean_upstream[offset:offset + r + 1], "allgather grad")
    x = data(r, (2,)).requires_grad_()
    hvd.allgather(x).sum().backward()  # non-contiguous (expanded) upstream gradient
    close(x.grad, torch.ones(2), "allgather grad of sum()")
    # broadcast: averaged gradient on the root, zeros elsewhere
    root = n - 1
    x = data(r, (4,)).requires_grad_()
    (hvd.broadcast(x, root) * w(r, (4,))).sum().backward()
    expected = torch.stack([w(k, (4,)) for k in range(n)]).mean(0) if r == root else torch.zeros(4)
    close(x.grad, expected, "broadcast grad")
    # reducescatter: allgather of the gradient times the scale factors, and times size for Sum (Horovod)
    rows = 2 * n + 1
    sizes = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    for op in (hvd.Sum, hvd.Average):
        x = data(r, (rows, 2)).requires_grad_()
        (hvd.reducescatter(x, op=op, prescale_factor=2.0) * w(r, (sizes[r], 2))).sum().backward()
        gathered = torch.cat([w(k, (sizes[k], 2)) for k in range(n)]) * 2.0
        close(x.grad, gathered * n if op is hvd.Sum else gathered, f"reducescatter grad {op.name}")
    # alltoall: the reverse alltoall; rank r sends k + 1 rows to rank k
    splits = [k + 1 for k in range(n)]
    x = data(r, (sum(splits), 2)).requires_grad_()
    out, received = hvd.alltoall(x, splits=splits)
    assert not received.requires_grad
    received_rows = int(received.sum())
    (out * w(r, (received_rows, 2))).sum().backward()
    # rows of x sent to rank k come back with rank k's upstream rows for sender r
    expected = []
    for k in range(n):
        upstream_k = w(k, ((k + 1) * n, 2))  # rank k received k + 1 rows from each rank
        expected.append(upstream_k[r * (k + 1):(r + 1) * (k + 1)])
    close(x.grad, torch.cat(expected), "alltoall grad")
    x = (torch.arange(2 * n, dtype=torch.float32) + r).requires_grad_()
    (hvd.alltoall(x) * 3).sum().backward()
    close(x.grad, torch.full((2 * n,), 3.0), "alltoall grad without splits")


def check_misuse(r, n):
    x = torch.zeros(4, 4)
    expect_error(ValueError, lambda: hvd.allreduce(x.t()[:, :2], name="nc"), "not contiguous", "contiguous()")
    expect_error(ValueError, lambda: hvd.allreduce_(x[:, 1]), "not contiguous")
    expect_error(TypeError, lambda: hvd.allreduce(torch.zeros(3, dtype=torch.bool)), "dtype torch.bool")
    expect_error(TypeError, lambda: hvd.allreduce(torch.zeros(3, dtype=torch.complex64)), "dtype torch.complex64")
    expect_error(TypeError, lambda: hvd.broadcast_(torch.zeros(3, dtype=torch.uint16), 0), "torch.uint16")
    expect_error(hvd.DeviceNotSupportedError, lambda: hvd.allreduce(torch.zeros(3, device="meta")),
                 "device meta", "CPU")
    if torch.cuda.is_available() and not hvd.cuda_built():  # CUDA without CuPy: says what to install
        expect_error(hvd.DeviceNotSupportedError, lambda: hvd.allreduce(torch.zeros(3, device="cuda")),
                     "cuda_built() is False", "commlib[cuda12]")
    expect_error(ValueError, lambda: hvd.allreduce(torch.zeros(2), op=hvd.Sum, average=True), "either op")
    if n > 1:
        # the same name with different shapes on different ranks: every rank gets HorovodInternalError
        exc = expect_error(hvd.HorovodInternalError,
                           lambda: hvd.allreduce(torch.zeros(3 + r), name="mismatched.shape"), "mismatched.shape")
        assert type(exc).__name__ == "CollectiveError" and str(exc).startswith("tensor 'mismatched.shape'"), \
            f"[rank {r}] mismatched shapes -> {type(exc).__name__}: {exc}"
        handle = hvd.allreduce_async_(torch.zeros(2, dtype=torch.float32 if r else torch.float64), name="mismatched.dtype")
        expect_error(hvd.HorovodInternalError, lambda: hvd.synchronize(handle), "mismatched.dtype")
        expect_error(hvd.HorovodInternalError, lambda: hvd.synchronize(handle), "mismatched.dtype")  # again
    # and communication still works afterwards
    close(hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after.errors"), torch.full((3,), float(n)), "after errors")


def check_broadcast_state(r, n):
    root = n - 1

    def make_model(seed):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))

    model = make_model(r)
    model(torch.randn(5, 4))  # moves BatchNorm statistics and num_batches_tracked (a 0-dim int64)
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    expected = make_model(root)
    expected(torch.randn(5, 4))  # same draw as root's (the generator was seeded the same)
    for (name, mine), (_, ref) in zip(sorted(model.state_dict().items()), sorted(expected.state_dict().items())):
        assert torch.equal(mine, ref), f"broadcast_parameters: {name} differs from the root's"
    other = make_model(100 + r)
    hvd.broadcast_parameters(other.named_parameters(), root_rank=0)
    hvd.broadcast_parameters(list(other.parameters()), root_rank=0)
    assert_same_on_all_ranks(hvd, list(other.parameters()), "broadcast_parameters(named_parameters)")

    def step(optimizer, model, seed):
        torch.manual_seed(seed)
        optimizer.zero_grad()
        model(torch.randn(6, 4)).square().sum().backward()
        optimizer.step()

    def state_tensors(optimizer):
        sd = optimizer.state_dict()
        out = []
        for pid in sorted(sd["state"]):
            for key in sorted(sd["state"][pid]):
                value = sd["state"][pid][key]
                out.append(value if torch.is_tensor(value) else torch.tensor(value))
        return out, [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]

    cases = {
        "sgd momentum, state everywhere": (lambda p: torch.optim.SGD(p, lr=0.1 * (r + 1), momentum=0.9), range(n)),
        "adam, no state anywhere": (lambda p: torch.optim.Adam(p, lr=0.01 * (r + 1), betas=(0.9, 0.99 - 0.01 * r)), []),
        "adam, state only on the root": (lambda p: torch.optim.Adam(p, lr=0.01 * (r + 1)), [root]),
        "adamw, state only off the root": (lambda p: torch.optim.AdamW(p, lr=0.01), [k for k in range(n) if k != root]),
    }
    for case, (factory, stepping_ranks) in cases.items():
        model = make_model(7)
        optimizer = factory(model.parameters())
        if r in stepping_ranks:
            step(optimizer, model, seed=r)
        hvd.broadcast_parameters(model.state_dict(), root_rank=root)
        hvd.broadcast_optimizer_state(optimizer, root_rank=root)
        tensors, groups = state_tensors(optimizer)
        assert hvd.allgather_object(groups) == [groups] * n, f"{case}: hyperparameters differ between ranks"
        assert hvd.allgather_object(len(tensors)) == [len(tensors)] * n, f"{case}: state sizes differ"
        if root not in stepping_ranks:
            assert not tensors, f"{case}: state should be empty everywhere like the root's"
        assert_same_on_all_ranks(hvd, tensors, f"{case}: optimizer state")
        step(optimizer, model, seed=42)  # identical state + identical grads -> identical parameters
        assert_same_on_all_ranks(hvd, list(model.parameters()), f"{case}: parameters after a step")
    # through a DistributedOptimizer as well
    model = make_model(3 + r)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1 + r, momentum=0.5),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert optimizer.param_groups[0]["lr"] == 0.1
    step(optimizer, model, seed=r)  # different data per rank; averaged gradients keep ranks identical
    assert_same_on_all_ranks(hvd, list(model.parameters()) + state_tensors(optimizer)[0], "distributed optimizer state")


@spmd.case
def init():
    hvd.init()


spmd.rank_cases(lambda: (hvd.rank(), hvd.size()), check_queries, check_allreduce, check_gather_broadcast,
                check_autograd, check_misuse, check_broadcast_state)


@spmd.case
def shutdown():
    hvd.shutdown()


if __name__ == "__main__":
    spmd.main()
