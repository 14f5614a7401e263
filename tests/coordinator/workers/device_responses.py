"""Worker: device responses through the real coordinator over MPI, on the host implementation of the
stream interface (commlib.testing.streams.HostStreams: lazy streams, poisoned memory), so that a wait the
device path forgot is a wrong result here. Every rank checks against numpy:

- device allreduces fused into one response: one pack of every tensor, never with host tensors;
- results (Sum, Average, Min, Max; float32/float64/int32/float16/bfloat16; fp16 and bf16 wires; pre and
  postscale; in place and out of place; sizes 0, 1, fewer than ranks, not divisible);
- the events: values written lazily on the producer's stream are read only after it, the result only
  after the consumer's stream waited; and nothing is read early when the pinned buffer is reused;
- the segment schedule: every segment's copy to the host queued before the host waits for the first;
- the other collectives; a joined rank's zeros; the staged route's reason without NCCL.

    mpiexec -n P python device_responses.py       (COMMLIB_DEVICE_SEGMENT and COMMLIB_NUM_STREAMS vary)
"""

from __future__ import annotations

import os
import zlib

import ml_dtypes
import numpy as np

import commlib as cl
import spmd
from commlib import lifecycle
from commlib.coordinator.requests import Entry, Handle, Kind, Meta
from commlib.device import DeviceHandle, DeviceTensor
from commlib.dtypes import dtype_name
from commlib.testing.streams import HostStreams

SEGMENT = int(os.environ.get("COMMLIB_DEVICE_SEGMENT", 4 << 20))
SIZES = [0, 1, 2, 3, 5, 17, 300]
rank, size = spmd.rank_and_size()
ops = HostStreams(gpu=(0, rank, 0))   # a GPU of its own per rank, but no NCCL library: the staged route
user = ops.new_stream("user")


def values(count, dtype, salt, r=None):
    """Rank r's values: small integers (exact in every dtype and wire) or uniform in [0.5, 1.5)."""
    rng = np.random.default_rng([rank if r is None else r, salt, count])
    if np.dtype(dtype).kind in "iu" or np.dtype(dtype) == np.float16 or dtype == ml_dtypes.bfloat16:
        return rng.integers(-4, 5, count).astype(dtype)
    return rng.uniform(0.5, 1.5, count).astype(dtype)


def meta_of(tensor: DeviceTensor, name, kind=Kind.ALLREDUCE, op=cl.Sum, **fields):
    return Meta(name, kind, dtype_name(tensor.dtype), tensor.shape, int(op), device="cuda", **fields)


def submit(meta, tensor: DeviceTensor, output=None, splits=None):
    member = lifecycle.current().sets.member(None, meta.name)
    entry = Entry(meta, tensor, output if output is not None else tensor, Handle(meta.name), splits)
    return DeviceHandle(member.coordinator.submit(entry))


def device_tensor(array):
    return DeviceTensor.submitted(ops.tensor(array, user), ops)


@spmd.case
def init():
    cl.init()


def tolerance(dtype, compression):
    """rtol: one rounding per reduction step in the narrowest type the values cross."""
    narrow = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}.get(compression, dtype)
    if np.dtype(narrow).kind in "iu":
        return 0.0
    return 2 * size * float(ml_dtypes.finfo(narrow).eps)


@spmd.case
def fused_allreduce_matches_numpy():
    for dtype, compression in ((np.float32, "none"), (np.float64, "none"), (np.int32, "none"),
                               (np.float16, "none"), (ml_dtypes.bfloat16, "none"), (np.float32, "fp16"),
                               (np.float32, "bf16")):
        for op in (cl.Sum, cl.Average, cl.Min, cl.Max):
            if op is cl.Average and np.dtype(dtype).kind in "iu":
                continue
            for inplace in (True, False):
                label = f"{np.dtype(dtype).name}.{compression}.{int(op)}.{inplace}"
                salt = zlib.crc32(label.encode())
                tensors = [device_tensor(values(n, dtype, salt)) for n in SIZES]
                handles = [submit(meta_of(t, f"{label}.{i}", op=op, compression=compression), t,
                                  None if inplace else t.like()) for i, t in enumerate(tensors)]
                for n, t, handle in zip(SIZES, tensors, handles):
                    result = cl.synchronize(handle)
                    assert (result is t.tensor) == inplace
                    got = ops.read(result).astype(np.float64)
                    every = np.stack([values(n, dtype, salt, r).astype(np.float64) for r in range(size)])
                    want = {cl.Sum: every.sum(0), cl.Average: every.mean(0), cl.Min: every.min(0),
                            cl.Max: every.max(0)}[op]
                    np.testing.assert_allclose(got, want, rtol=tolerance(dtype, compression), atol=1e-30,
                                               err_msg=f"{label} n={n}")


@spmd.case
def device_packs_hold_device_tensors_only():
    cl.barrier()
    start = len(ops.log)
    tensors = [device_tensor(np.full(4, rank + 1.0, np.float32)) for _ in range(6)]
    host = [np.full(4, rank + 1.0, np.float32) for _ in range(3)]
    handles = [submit(meta_of(t, f"fused.dev.{i}"), t) for i, t in enumerate(tensors)]
    host_handles = [cl.allreduce_async(h, op=cl.Sum, name=f"fused.host.{i}") for i, h in enumerate(host)]
    for handle in handles:
        assert np.all(ops.read(cl.synchronize(handle)) == size * (size + 1) / 2)
    for handle in host_handles:
        assert np.all(cl.synchronize(handle) == size * (size + 1) / 2)
    packs = [entry for entry in ops.log[start:] if entry[0] == "pack"]
    assert all(p[3] == p[2] * 4 for p in packs), f"a pack held more than device tensors: {packs}"
    assert sum(p[2] for p in packs) <= 6, packs


@spmd.case
def reads_wait_for_the_producer_and_results_for_the_consumer():
    producer = ops.new_stream("producer")
    memory = np.full(8, np.nan, np.float32)
    ops.produce(producer, memory, np.full(8, rank + 1.0, np.float32))  # queued: runs only when waited for
    tensor = DeviceTensor.submitted(HostTensorOn(memory, producer), ops)
    result = cl.synchronize(submit(meta_of(tensor, "ordered"), tensor))
    if size > 1:  # the copy back is queued, and the consumer's stream has not run it yet
        assert np.all(memory == rank + 1.0), f"the result landed before the consumer waited: {memory}"
    assert np.all(ops.read(result) == size * (size + 1) / 2), "the producer's values were read too early"


def HostTensorOn(memory, stream):
    from commlib.testing.streams import HostTensor

    return HostTensor(memory, stream)


@spmd.case
def segments_are_all_queued_before_the_host_waits():
    if size == 1:
        spmd.skip("one rank exchanges nothing: no segments")
    count = 3 * SEGMENT // 4 + 5          # float32: 3 segments and a part
    tensor = device_tensor(values(count, np.float32, 7))
    cl.barrier()
    start = len(ops.log)
    result = cl.synchronize(submit(meta_of(tensor, "segmented"), tensor))
    log = ops.log[start:]
    down = [i for i, e in enumerate(log) if e[0] == "to_host"]
    up = [i for i, e in enumerate(log) if e[0] == "to_device"]
    copy_stream = log[down[0]][1]
    waits = [i for i, e in enumerate(log) if e[0] == "synchronize" and e[1] == copy_stream]  # for a segment
    expected = -(-count * 4 // SEGMENT)
    assert len(down) == len(up) == expected, f"{len(down)} copies down, {len(up)} up, {expected} segments"
    assert max(down) < min(waits), "a segment's copy to the host was queued after the host began waiting"
    for i, copy_back in enumerate(up):  # each copy back follows the host's wait for that segment
        assert waits[i] < copy_back, f"segment {i} was copied back before the host had it"
    every = np.stack([values(count, np.float32, 7, r) for r in range(size)])
    np.testing.assert_allclose(ops.read(result), every.sum(0), rtol=1e-6)


@spmd.case
def pinned_buffer_reuse_waits_for_the_copies_back():
    if size == 1:
        spmd.skip("one rank exchanges nothing")
    # a broadcast's result is copied back from the host buffer itself; nobody reads it yet, so (lazy streams)
    # that copy has not run when the allreduce below copies into the same host buffer
    first = device_tensor(np.full(64, rank + 1.0, np.float32))
    r1 = cl.synchronize(submit(meta_of(first, "reuse.1", kind=Kind.BROADCAST, root=0), first, first.like()))
    other = ops.new_stream("other")   # produces the second tensor: waiting for it does not run the first's copies
    second = DeviceTensor.submitted(ops.tensor(np.full(64, 10.0 * (rank + 1), np.float32), other), ops)
    r2 = cl.synchronize(submit(meta_of(second, "reuse.2"), second))
    assert np.all(ops.read(r2) == 10.0 * size * (size + 1) / 2)
    assert np.all(ops.read(r1) == 1.0), "the allreduce overwrote the broadcast's host copy before it was copied back"


@spmd.case
def scaling_and_wires():
    for compression in ("none", "fp16", "bf16"):
        tensor = device_tensor(np.full(10, float(rank + 1), np.float32))
        meta = meta_of(tensor, f"scaled.{compression}", op=cl.Average, prescale=0.5, postscale=4.0,
                       compression=compression)
        got = ops.read(cl.synchronize(submit(meta, tensor)))
        np.testing.assert_allclose(got, 2.0 * (size + 1) / 2, rtol=1e-2)


@spmd.case
def other_collectives():
    rows = rank + 1
    mine = device_tensor(np.full((rows, 2), rank, np.int32))
    gathered = cl.synchronize(submit(meta_of(mine, "ag", kind=Kind.ALLGATHER), mine))
    want = np.concatenate([np.full((r + 1, 2), r, np.int32) for r in range(size)])
    assert np.array_equal(ops.read(gathered), want)
    source = device_tensor(np.arange(6, dtype=np.float64) * (rank + 1))
    result = cl.synchronize(submit(meta_of(source, "bc", kind=Kind.BROADCAST, root=0), source, source.like()))
    assert np.array_equal(ops.read(result), np.arange(6, dtype=np.float64))
    scatter = device_tensor(np.ones((size * 2 + 1, 3), np.float32) * (rank + 1))
    block = ops.read(cl.synchronize(submit(meta_of(scatter, "rs", kind=Kind.REDUCESCATTER), scatter)))
    assert block.shape == (3 if rank == 0 else 2, 3) and np.all(block == size * (size + 1) / 2), block
    table = device_tensor(np.repeat(np.arange(size, dtype=np.int64)[:, None] + 100 * rank, 2, axis=1))
    output, received = cl.synchronize(submit(meta_of(table, "a2a", kind=Kind.ALLTOALL), table,
                                             splits=np.ones(size, np.int64)))
    assert list(received) == [1] * size
    assert np.array_equal(ops.read(output)[:, 0], np.array([rank + 100 * r for r in range(size)]))


@spmd.case
def a_joined_rank_contributes_zeros():
    if size == 1:
        spmd.skip("needs a rank that joins")
    if rank < size - 1:
        tensor = device_tensor(np.full(5, rank + 1.0, np.float32))
        got = ops.read(cl.synchronize(submit(meta_of(tensor, "joined"), tensor)))
        assert np.all(got == sum(r + 1 for r in range(size - 1))), got
    cl.join()


@spmd.case
def nccl_named_without_nccl_runs_staged():
    tensor = device_tensor(np.ones(3, np.float32))
    cl.synchronize(submit(meta_of(tensor, "route", algorithm="nccl"), tensor))  # no NCCL here: staged, by rule
    assert np.all(ops.read(tensor.tensor) == size)


@spmd.case
def shutdown():
    cl.shutdown()


if __name__ == "__main__":
    spmd.main()
