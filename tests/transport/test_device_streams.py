"""The device path's parts that need no MPI and no GPU: the host implementation of the stream interface
(what the CPU tests rely on), the staged pipeline's segment schedule, the NCCL route rule and its reasons,
the unique id's exchange, the kernels' choice of conversion, and refusals that come before any CUDA call."""

import numpy as np
import pytest

import commlib as cl
from commlib.dtypes import BFLOAT16
from commlib.ops import ReduceOp
from commlib.testing.streams import HostStreams
from commlib.transport import nccl as rules
from commlib.transport.device_kernels import _conversion
from commlib.transport.staged import StagedPipeline, segments


def test_host_streams_run_only_when_waited_for():
    ops = HostStreams()
    producer, consumer = ops.new_stream("p"), ops.new_stream("c")
    tensor = ops.tensor(np.arange(4.0), producer)
    assert np.isnan(tensor.values).all()                  # queued, not run
    ops.wait(consumer, ops.record(producer))
    copy = ops.empty(4, np.float64)
    ops.copy(consumer, tensor.values, copy)
    assert np.isnan(copy).all()
    ops.synchronize(ops.record(consumer))                 # runs the consumer, which runs the producer first
    assert np.array_equal(copy, np.arange(4.0))


def test_host_streams_convert_as_the_device_kernels_do():
    ops, stream = HostStreams(), None
    stream = ops.new_stream()
    src = np.array([1.0, 65504.0, 1e-8, np.nan, 3.0], np.float32)
    half, bits = ops.empty(5, np.float16), ops.empty(5, BFLOAT16)
    ops.pack(stream, [src], 0.5, half)
    ops.pack(stream, [src], 2.0, bits)
    ops.synchronize(ops.record(stream))
    np.testing.assert_array_equal(half, (src * np.float32(0.5)).astype(np.float16))
    assert bits.dtype == np.uint16                      # bfloat16 travels as its bits, as on the GPU
    want = (src * np.float32(2.0)).astype(BFLOAT16)
    got = bits.view(BFLOAT16)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])


def test_segments_cover_the_buffer():
    assert segments(10, 4, 16) == [(0, 4), (4, 8), (8, 10)]
    assert segments(1, 8, 1) == [(0, 1)]
    assert segments(0, 4, 16) == []


def test_staged_pipeline_queues_every_copy_down_before_waiting_and_each_copy_up_after():
    ops = HostStreams()
    lane = ops.new_stream("lane")
    source = ops.empty(10, np.float32)
    ops.produce(lane, source, np.arange(10, dtype=np.float32))
    pipeline = StagedPipeline(ops, segment_bytes=16)
    reduced = []

    def reduce_host(host, op):
        reduced.append(host.copy())
        host *= 2

    start = len(ops.log)
    back = pipeline.allreduce(ops.record(lane), source, source, np.dtype(np.float32), ReduceOp.SUM, reduce_host)
    log = [entry[0] for entry in ops.log[start:] if entry[0] in ("to_host", "synchronize", "to_device")]
    assert log == ["to_host"] * 3 + ["synchronize", "to_device"] * 3
    assert [r.tolist() for r in reduced] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    ops.wait(lane, back)
    ops.synchronize(ops.record(lane))
    assert np.array_equal(source, 2 * np.arange(10, dtype=np.float32))


def record(node, gpu, version=22703, host=None):
    return rules.GpuRecord(node, node if host is None else host, (0, gpu, 0), version)


def test_nccl_route_rule():
    assert rules.route([record(0, 0), record(0, 1)], [2])[0] == rules.NCCL
    assert rules.route([record(0, 0)], [1])[0] == rules.NCCL
    route, why = rules.route([record(0, 0), record(0, 0), record(0, 1)], [3])
    assert route == rules.STAGED and "ranks 0 and 1 share one GPU" in why and "NCCL refuses" in why
    route, why = rules.route([record(0, 0), record(0, 1, version=0)], [2])
    assert route == rules.STAGED and "rank(s) [1] cannot load NCCL" in why and "nvidia-nccl-cu12" in why
    assert rules.route([record(0, 0), record(0, 1), record(1, 0), record(1, 1)], [2, 2])[0] == rules.HIERARCHICAL
    route, why = rules.route([record(0, 0), record(0, 1), record(1, 0)], [2, 1])
    assert route == rules.STAGED and "same number of ranks on every node" in why
    # one GPU per node, the same PCI address on both: not shared
    assert rules.route([record(0, 0), record(1, 0)], [1, 1])[0] == rules.HIERARCHICAL
    # emulated nodes (COMMLIB_LOCAL_SIZE) on one machine, one GPU: shared all the same
    route, why = rules.route([record(0, 0, host=9), record(1, 0, host=9)], [1, 1])
    assert route == rules.STAGED and "share one GPU" in why


def test_gpu_records_travel_as_five_integers():
    row = record(3, 7, 21805, host=12345).encode()
    assert row.dtype == np.int64 and row.size == rules.RECORD_SIZE
    assert rules.GpuRecord.decode(row) == record(3, 7, 21805, host=12345)


def test_nccl_cannot_reduce_every_dtype():
    assert rules.why_not_dtype(np.dtype(np.float32)) is None and rules.why_not_dtype(BFLOAT16) is None
    assert "int16" in rules.why_not_dtype(np.dtype(np.int16))


class BroadcastTransport:
    """rank 0's broadcasts, as a transport of ``size`` ranks seen from ``rank`` (its buffers filled from
    what rank 0 sent)."""

    def __init__(self, rank, size, sent):
        self.rank, self.size, self.sent = rank, size, sent

    def bcast_(self, buf, root):
        if self.rank == root:
            self.sent.append(buf.copy())
        else:
            buf[...] = self.sent.pop(0)


def test_unique_id_reaches_the_other_ranks_as_rank_0_made_it():
    sent = []
    unique_id = tuple(range(-64, 64))
    assert rules.exchange_unique_id(BroadcastTransport(0, 2, sent), unique_id) == unique_id
    assert rules.exchange_unique_id(BroadcastTransport(1, 2, sent), ()) == unique_id
    assert rules.exchange_unique_id(BroadcastTransport(0, 1, []), unique_id) == unique_id


def test_kernel_conversions():
    f32, f16, f64, u16, i32 = (np.dtype(t) for t in (np.float32, np.float16, np.float64, np.uint16, np.int32))
    assert _conversion(f32, f32, 1.0) == "copy" and _conversion(f32, f32, 0.5) == "f32"
    assert _conversion(f32, f16, 1.0) == "f32" and _conversion(f64, f32, 1.0) == "f64"
    assert _conversion(f32, u16, 1.0) == "to_bf16" and _conversion(u16, f32, 2.0) == "from_bf16"
    assert _conversion(u16, u16, 2.0) == "bf16_scale" and _conversion(u16, u16, 1.0) == "copy"
    assert _conversion(i32, i32, 0.5) == "f64" and _conversion(i32, i32, 1.0) == "copy"


def test_without_cupy_no_nccl_and_no_wheel():
    pytest.importorskip("numpy")
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed here")
    except ImportError:
        pass
    assert cl.nccl_built() == 0
    assert rules.route([record(0, 0, version=0)], [1])[0] == rules.STAGED


class OnGpu:
    """Declares CUDA memory through DLPack (nothing is allocated)."""

    shape, dtype = (3,), np.dtype(np.float32)

    def __dlpack_device__(self):
        return (2, 0)


def test_a_grouped_call_mixing_host_and_device_tensors_is_refused():
    with pytest.raises(cl.CommlibError, match=r"one kind of device.*0: host, 1: device"):
        cl.grouped_allreduce([np.zeros(3, np.float32), OnGpu()], name="mixed")
    with pytest.raises(RuntimeError):  # Horovod's test expects a RuntimeError (test_horovod_grouped_allreduce_cpu_gpu_error)
        cl.grouped_allreduce_async([OnGpu(), np.zeros(3, np.float32)])


def test_nccl_is_an_algorithm_of_device_tensors_only():
    from commlib.algorithms import ALGORITHMS, spec

    assert "nccl" in spec.names() and spec.get("nccl").device and "nccl" not in ALGORITHMS
    assert "host memory" in spec.get("nccl").requires(None, None)
