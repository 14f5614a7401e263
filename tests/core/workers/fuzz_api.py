"""Random arguments to commlib's public entry points (numpy API and commlib.torch) on every rank.

Every rank draws the same calls (hypothesis derandomized, no example database, no shrinking: a rank that
shrank alone would call something the others do not), so each call is one the ranks agree on. A call may
succeed or raise a clear error (TypeError, ValueError or a CommlibError); after every call, an allreduce
with good arguments must still give the right answer on every rank, and every rank must have seen the same
outcome. Nothing may stop the background coordinator.

argv: number of examples (default 150), then optionally a seed (the same on every rank; default: hypothesis's
derandomized sequence), and -v to print every error's message on rank 0.
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings, strategies as st
from hypothesis.extra import numpy as hnp

import commlib as cl
import commlib.torch as hvd
import spmd

ARGS = [a for a in sys.argv[1:] if a != "-v"]
EXAMPLES = int(ARGS[0]) if ARGS else 150
SEED = int(ARGS[1]) if len(ARGS) > 1 else None
VERBOSE = "-v" in sys.argv  # print every error's message (rank 0), to read them
CLEAR = (TypeError, ValueError, cl.CommlibError, NotImplementedError)

class Identity:
    """A Horovod-style compressor (compress/decompress), for numpy arrays and torch tensors alike."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, context):
        return tensor


# ---- argument strategies: good values, near misses and junk -----------------------------------------------
junk = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(), st.text(max_size=6),
                 st.binary(max_size=4), st.lists(st.integers(-2, 2), max_size=3), st.just(object()),
                 st.just({"a": 1}))
names = st.one_of(st.none(), st.text(max_size=12), st.just(""), st.just("w.noname.0"), junk)
ops = st.one_of(st.sampled_from([cl.Sum, cl.Average, cl.Min, cl.Max, cl.Product, hvd.Adasum]),
                st.sampled_from(["sum", "SUM", "average", "bogus"]), st.integers(-2, 8), junk)
factors = st.one_of(st.just(1.0), st.floats(), st.integers(-3, 3), st.just(np.float32(2.0)), junk)
roots = st.one_of(st.integers(-2, 3), st.just(np.int64(1)), st.floats(), junk)
splits = st.one_of(st.none(), st.lists(st.integers(-1, 4), max_size=3), st.lists(st.floats(0, 3), max_size=3),
                   st.just(np.array([1, 1])), junk)
compressions = st.one_of(
    st.sampled_from(["none", "fp16", "bf16", "topk", "dgc", "onebit", "powersgd", "horovod"]).map(
        lambda kind: {"none": cl.Compression.none, "fp16": cl.Compression.fp16, "bf16": cl.Compression.bf16,
                      "topk": cl.Compression.topk(0.5, min_elements=0), "dgc": cl.Compression.dgc(min_elements=0),
                      "onebit": cl.Compression.onebit(min_elements=0),
                      "powersgd": cl.Compression.powersgd(start_step=0),
                      "horovod": Identity}[kind]),
    junk)
algorithms = st.one_of(st.none(), st.sampled_from(["auto", "ring", "NATIVE", "fastest", ""]), junk)
process_sets = st.one_of(st.none(), st.just(cl.global_process_set), st.just(cl.ProcessSet([0])), junk)
dtypes = st.sampled_from([np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int32, np.int64, np.uint8,
                          np.bool_, np.complex64, np.dtype("U2"), object])


@st.composite
def arrays(draw):
    dtype = np.dtype(draw(dtypes))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4))
    array = np.zeros(shape, dtype) if dtype.kind != "O" else np.full(shape, None, object)
    if array.ndim and draw(st.booleans()) and array.shape[0] > 1:
        array = array[::2]  # not contiguous when there is a second dimension
    if draw(st.booleans()):
        array.flags.writeable = False
    return array


tensors = st.one_of(arrays(), arrays(), st.none(), st.text(max_size=3), st.floats(), st.lists(st.floats(), max_size=3))


@st.composite
def torch_tensors(draw):
    array = draw(arrays())
    if array.dtype.kind in "OU" or array.dtype == ml_dtypes.bfloat16 or array.dtype == np.complex64:
        return draw(st.one_of(st.just(torch.zeros(3)), junk))
    return torch.from_numpy(np.array(array))


# ---- the calls --------------------------------------------------------------------------------------------
def numpy_calls(draw):
    kind = draw(st.sampled_from(["allreduce", "allreduce_async", "allreduce_", "grouped_allreduce", "allgather",
                                 "broadcast", "broadcast_", "reducescatter", "alltoall", "broadcast_object",
                                 "allgather_object", "synchronize", "poll", "barrier", "grouped_allgather",
                                 "grouped_reducescatter", "adasum", "add_process_set", "compressor",
                                 "persistent_allreduce"]))
    name = draw(names)
    if kind in ("allreduce", "allreduce_async", "allreduce_"):
        kwargs = dict(op=draw(ops), name=name, prescale_factor=draw(factors), postscale_factor=draw(factors),
                      algorithm=draw(algorithms), compression=draw(compressions), process_set=draw(process_sets))
        tensor = draw(tensors)
        if kind == "allreduce_async":
            return kind, lambda: cl.synchronize(cl.allreduce_async(tensor, **kwargs))
        return kind, lambda: getattr(cl, kind)(tensor, **kwargs)
    if kind == "persistent_allreduce":  # made once, started twice (the second start may take the kept request)
        kwargs = dict(op=draw(ops), prescale_factor=draw(factors), postscale_factor=draw(factors),
                      process_set=draw(process_sets))
        tensor = draw(tensors)

        def start_twice():
            request = cl.persistent_allreduce(name, **kwargs)
            for _ in range(2):
                cl.synchronize(request.start_(tensor))

        return kind, start_twice
    if kind == "grouped_allreduce":
        group = draw(st.one_of(st.lists(tensors, max_size=3), tensors))
        kwargs = dict(op=draw(ops), name=name, prescale_factor=draw(factors), compression=draw(compressions))
        return kind, lambda: cl.grouped_allreduce(group, **kwargs)
    if kind in ("grouped_allgather", "grouped_reducescatter"):
        group = draw(st.one_of(st.lists(tensors, max_size=3), tensors))
        return kind, lambda: getattr(cl, kind)(group, name=name)
    if kind in ("allgather", "allgather_object"):
        tensor, process_set = draw(tensors), draw(process_sets)
        return kind, lambda: getattr(cl, kind)(tensor, name=name, process_set=process_set)
    if kind in ("broadcast", "broadcast_", "broadcast_object"):
        tensor, root = draw(tensors), draw(roots)
        return kind, lambda: getattr(cl, kind)(tensor, root, name=name)
    if kind == "reducescatter":
        tensor, op, pre = draw(tensors), draw(ops), draw(factors)
        return kind, lambda: cl.reducescatter(tensor, op=op, name=name, prescale_factor=pre)
    if kind == "alltoall":
        tensor, given_splits = draw(tensors), draw(splits)
        return kind, lambda: cl.alltoall(tensor, splits=given_splits, name=name)
    if kind in ("synchronize", "poll"):
        handle = draw(junk)
        return kind, lambda: getattr(cl, kind)(handle)
    if kind == "barrier":
        process_set = draw(process_sets)
        return kind, lambda: cl.barrier(process_set=process_set)
    if kind == "adasum":
        from commlib import adasum

        tensor, pre = draw(tensors), draw(factors)
        return kind, lambda: adasum.allreduce(tensor, name=name, prescale_factor=pre)
    if kind == "compressor":  # a compressor built from random arguments, then used
        factory = draw(st.sampled_from(["topk", "randomk", "onebit", "dgc", "powersgd", "momentum"]))
        number = st.one_of(st.floats(-1, 2), st.integers(-1, 3), st.floats(), junk)
        args = {"topk": lambda: (draw(number),), "randomk": lambda: (draw(number), draw(number)),
                "onebit": lambda: (), "dgc": lambda: (draw(number), (draw(number),), draw(number), draw(number),
                                                      draw(number)),
                "powersgd": lambda: (draw(number), draw(number)), "momentum": lambda: ()}[factory]()
        tensor = draw(arrays())

        def build_and_use():
            if factory == "momentum":
                compressor = cl.Compression.momentum(cl.Compression.topk(0.5, error_feedback=False), draw_mu)
            else:
                compressor = getattr(cl.Compression, factory)(*args)
            cl.allreduce(tensor, name=name, compression=compressor)
        draw_mu = draw(number)
        return kind + "." + factory, build_and_use
    ranks = draw(junk)  # add_process_set with junk only: a good one would register a set for good
    return kind, lambda: cl.add_process_set(ranks)


def torch_calls(draw):
    kind = draw(st.sampled_from(["allreduce", "allreduce_async_", "grouped_allreduce", "allgather", "broadcast_",
                                 "alltoall", "reducescatter", "synchronize", "poll", "broadcast_object",
                                 "DistributedOptimizer"]))
    name = draw(names)
    tensor = draw(torch_tensors())
    if kind == "allreduce":
        kwargs = dict(op=draw(ops), prescale_factor=draw(factors), postscale_factor=draw(factors),
                      compression=draw(compressions))
        return "torch." + kind, lambda: hvd.allreduce(tensor, name=name, **kwargs)
    if kind == "allreduce_async_":
        op = draw(ops)
        return "torch." + kind, lambda: hvd.synchronize(hvd.allreduce_async_(tensor, name=name, op=op))
    if kind == "grouped_allreduce":
        group = draw(st.one_of(st.lists(torch_tensors(), max_size=3), torch_tensors()))
        return "torch." + kind, lambda: hvd.grouped_allreduce(group, name=name)
    if kind == "allgather":
        return "torch." + kind, lambda: hvd.allgather(tensor, name=name)
    if kind == "broadcast_":
        root = draw(roots)
        return "torch." + kind, lambda: hvd.broadcast_(tensor, root, name=name)
    if kind == "alltoall":
        given_splits = draw(splits)
        return "torch." + kind, lambda: hvd.alltoall(tensor, splits=given_splits, name=name)
    if kind == "reducescatter":
        op = draw(ops)
        return "torch." + kind, lambda: hvd.reducescatter(tensor, name=name, op=op)
    if kind in ("synchronize", "poll"):
        handle = draw(junk)
        return "torch." + kind, lambda: getattr(hvd, kind)(handle)
    if kind == "broadcast_object":
        root = draw(roots)
        return "torch." + kind, lambda: hvd.broadcast_object({"x": 1}, root, name=name)
    momentum, compression, factor = draw(st.sampled_from([0.0, 0.9])), draw(compressions), draw(factors)

    def optimizer():
        model = torch.nn.Linear(2, 2)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum),
                                       named_parameters=model.named_parameters(), compression=compression,
                                       gradient_predivide_factor=factor)
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
    return "torch." + kind, optimizer


@st.composite
def calls(draw):
    return draw(st.sampled_from([numpy_calls, torch_calls]))(draw)


@spmd.case
def init():
    hvd.init()


@spmd.case
def random_calls_work_or_fail_clearly_and_commlib_keeps_working():
    rank, size = cl.rank(), cl.size()
    seen = {}
    check = [0]

    @seed(SEED if SEED is not None else 0)
    @settings(max_examples=EXAMPLES, derandomize=SEED is None, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(calls())
    def one_call(call):
        kind, function = call
        try:
            function()
            outcome = "ok"
        except CLEAR as exc:
            outcome = type(exc).__name__
            if VERBOSE and rank == 0:
                print(f"  {kind}: {outcome}: {str(exc)[:200]}", flush=True)
        except Exception as exc:  # an unclear error: say which call, with what
            raise AssertionError(f"rank {rank}: {kind} raised {type(exc).__name__}: {exc}") from exc
        seen[(kind, outcome)] = seen.get((kind, outcome), 0) + 1
        check[0] += 1
        x = np.full(3, rank + 1, np.float32)
        total = cl.allreduce(x, op=cl.Sum, name=f"fuzz.check.{check[0] % 4}")
        assert np.array_equal(total, np.full(3, size * (size + 1) / 2, np.float32)), (kind, total)
        outcomes = cl.allgather_object(outcome, name="fuzz.outcome")
        assert len(set(outcomes)) == 1, f"{kind}: ranks disagree: {outcomes}"

    one_call()
    if rank == 0:
        for (kind, outcome), count in sorted(seen.items()):
            print(f"  {kind:28s} {outcome:22s} {count}")
    assert sum(seen.values()) >= min(EXAMPLES, 50), seen


@spmd.case
def shutdown():
    hvd.shutdown()


if __name__ == "__main__":
    spmd.main()
