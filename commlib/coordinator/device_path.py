"""The device half of a lane: how an agreed response of device tensors runs.

A response whose tensors live on a GPU (``meta.device == "cuda"``; ranks agree on it, and fusion only
joins tensors of one device kind) runs here, on the lane's thread, never by staging each tensor alone:

1. the lane's compute stream waits for each tensor's ``ready`` event (recorded on the stream that produced
   it when it was submitted), so nothing is read early;
2. the tensors are packed into one device buffer by one kernel, multiplied by the prescale factor and cast
   to the wire type on the way (fp16/bf16 compression halves every later byte); a single tensor that needs
   neither is used as it is;
3. the buffer is reduced: by NCCL on the lane's stream (``nccl``: one communicator per lane, so
   ``COMMLIB_NUM_STREAMS`` lanes are that many streams), by NCCL inside each node and the host path across
   nodes (``hierarchical``), or through the host (``staged``: segments copied to pinned memory on a copy
   stream and reduced by the lane's engine as they arrive, copied back on another; :mod:`..transport.staged`);
4. it is unpacked into the outputs with the postscale factor on the way, and the event recorded after that
   becomes each output's ``done``: the caller's stream waits for it when the caller synchronizes.

Which of the three runs is a rule (:func:`commlib.transport.nccl.route`) on facts every rank gathers once
per lane, at the first device allreduce that may use NCCL (``algorithm="nccl"``, or ``auto``): every rank
decides alike. Where NCCL cannot run the staged path runs, and :attr:`DevicePath.route` says why (``commlib-bench
--device cuda --explain`` prints it, the timeline's events carry it). Another named algorithm (``ring``, ...)
runs the staged path with that algorithm on the host.

The other collectives (allgather, broadcast, reducescatter, alltoall) cross to the host whole, on the
copy streams, and the result comes back the same way: asynchronous for the caller, ordered by events.

Everything here talks to the GPU through the stream interface (:mod:`..transport.streams`): the tensors
bring theirs (``DeviceTensor.streams``).
"""

from __future__ import annotations

import math

import numpy as np

from ..compression import Compression, codec_for
from ..device import DeviceTensor
from ..dtypes import BFLOAT16
from ..engine import scale_factors
from ..errors import CollectiveError
from ..ops import ReduceOp
from ..transport import nccl as nccl_rules
from ..timeline import COMMUNICATION, MEMCPY_IN_FUSION_BUFFER, MEMCPY_OUT_FUSION_BUFFER
from ..transport.device_kernels import device_dtype
from ..transport.staged import StagedPipeline
from .requests import Entry, Kind, Response


NCCL_ALLREDUCE = "NCCL_ALLREDUCE"  # Horovod's activity name for the same
LOCAL = "local"  # the route of a response with nothing to exchange (one rank, or no elements)


class DevicePath:
    """One lane's device streams, buffers and NCCL communicators, made on the lane's first device response.

    ``nccl`` is the NCCL library (None: ``cupy.cuda.nccl``, found when first needed; the tests hand in a
    stand-in)."""

    def __init__(self, engine, segment_bytes: int, nccl=None):
        self.engine = engine
        self.segment_bytes = segment_bytes
        self.streams = None
        self.stream = None           # the lane's compute stream: waits, packing, NCCL, unpacking
        self.pipeline: StagedPipeline | None = None
        self._nccl_library = nccl
        self._fused = None           # the fused device buffer, grown when a response needs more
        self._route: tuple[str, str] | None = None  # (nccl | hierarchical | staged, why), decided once
        self._comm = None            # the lane's NcclComm (nccl), or its node's (hierarchical)
        self._cross = None           # hierarchical: the staging of this rank's shard, and its reduction

    # ---- set-up ------------------------------------------------------------------------------------------

    def bind(self, streams) -> None:
        """Use ``streams`` (the GPU of this rank's tensors) from now on: the lane's stream, the pipeline."""
        if self.streams is streams:
            return
        if self.streams is not None:
            raise CollectiveError("device tensors of one process set must stay on one GPU per rank; this rank "
                                  f"sent tensors from GPU {self.streams.index} and then from GPU {streams.index}")
        self.streams = streams
        with streams.activate():
            self.stream = streams.new_stream()
            self.pipeline = StagedPipeline(streams, self.segment_bytes)

    def _bound(self, entries: list[Entry | None]):
        """The stream interface of this response's tensors (a joined rank has none: the one bound before)."""
        for entry in entries:
            if entry is not None:
                self.bind(entry.array.streams)
                return self.streams
        if self.streams is None:
            from ..transport.streams import cuda_streams

            import cupy  # a rank that joined before any device tensor: the GPU current in this thread

            self.bind(cuda_streams(cupy.cuda.runtime.getDevice()))
        return self.streams

    @property
    def route(self) -> tuple[str, str] | None:
        """(``nccl``, ``hierarchical`` or ``staged``, why), once decided (see the module docstring)."""
        return self._route

    def decide_route(self) -> tuple[str, str]:
        """The route of this lane's device allreduces: collective the first time (every rank tells the
        others its node, GPU and NCCL version), the same answer on every rank."""
        if self._route is not None:
            return self._route
        engine = self.engine
        version, library = 0, None
        try:
            library = self._nccl_library if self._nccl_library is not None else nccl_rules.nccl_module()
            version = int(library.get_version())
        except Exception:  # noqa: BLE001 - no NCCL here: the route says so (every rank learns it)
            library = None
        topology = engine.topology
        width = nccl_rules.RECORD_SIZE
        mine = nccl_rules.GpuRecord(topology.node_of_rank[topology.rank], nccl_rules.this_host(),
                                    tuple(self.streams.identity()), version)
        every = np.empty(width * engine.size, np.int64)
        engine.transport.allgatherv(mine.encode(), every, [width] * engine.size)
        records = [nccl_rules.GpuRecord.decode(row) for row in every.reshape(engine.size, width)]
        route = nccl_rules.route(records, list(topology.node_sizes))
        if route[0] == nccl_rules.NCCL:
            self._comm = nccl_rules.NcclComm(library, engine.transport, self.streams)
        elif route[0] == nccl_rules.HIERARCHICAL:
            from ..algorithms.hierarchical import cross_allreduce

            context = engine.context
            self._comm = nccl_rules.NcclComm(library, context.intra(), self.streams)
            group = context.shard_groups()[topology.local_rank]  # one rank per node: equal nodes
            with self.streams.activate():
                self._cross = (StagedPipeline(self.streams, self.segment_bytes),
                               lambda host, op: cross_allreduce(context, group, host, op, None))
        self._route = route
        return route

    def close(self) -> None:
        if self._comm is not None:
            self._comm.close()
            self._comm = None

    # ---- allreduce ---------------------------------------------------------------------------------------

    def allreduce(self, response: Response, entries: list[Entry | None], span, how: str | None = None) -> str:
        """Queue the allreduce of ``response`` (see the module docstring); returns the route it took.
        ``how`` forces ``staged`` (or the route, where it is not staged: commlib-bench compares them)."""
        meta = response.metas[0]
        op = ReduceOp(meta.op)
        codec = _codec(meta)
        dtype = np.dtype(meta.dtype)
        wire = codec.wire_dtype if codec is not None else dtype
        size = self.engine.size
        prescale, postscale = scale_factors(op, codec, meta.prescale, meta.postscale, size)
        if dtype in HALVES:  # as on the GPU in Horovod: a half tensor is scaled in its own precision
            prescale, postscale = _rounded(prescale, dtype), _rounded(postscale, dtype)
        kernel_op = op.kernel_op
        streams = self._bound(entries)
        present = entries[0] is not None
        sources = [e.array.flat for e in entries] if present else []
        targets = [e.output.flat for e in entries] if present else []
        total = sum(math.prod(m.shape) for m in response.metas)
        if not total or (size == 1 and how is None and meta.algorithm != "nccl"):
            how = LOCAL  # nothing to exchange (a named nccl still runs on one rank: it proves NCCL works)
        elif how != nccl_rules.STAGED:
            how = self._how(meta, wire)
        with streams.activate():
            lane = self.stream
            if present:
                waited = set()
                for entry in entries:
                    ready = entry.array.ready
                    if ready is not None and id(ready) not in waited:
                        waited.add(id(ready))
                        streams.wait(lane, ready)
            direct = present and len(sources) == 1 and wire == dtype and prescale == 1.0
            if direct:
                source, target = sources[0], targets[0]
            else:
                source = target = self._fused_buffer(total, wire)
                with span(MEMCPY_IN_FUSION_BUFFER, tensors=len(entries)):
                    if present:
                        streams.pack(lane, sources, prescale, source)
                    else:  # a joined rank contributes zeros
                        streams.fill(lane, source, 0)
            with span(NCCL_ALLREDUCE if how in (nccl_rules.NCCL, nccl_rules.HIERARCHICAL)
                      else COMMUNICATION["ALLREDUCE"], tensors=len(entries), route=how):
                if how == LOCAL:
                    if source is not target:
                        streams.copy(lane, source, target)
                elif how == nccl_rules.NCCL:
                    self._comm.allreduce(lane, source, target, wire, kernel_op)
                elif how == nccl_rules.HIERARCHICAL:
                    if source is not target:
                        streams.copy(lane, source, target)
                    self._hierarchical(target, wire, kernel_op)
                else:
                    algorithm = meta.algorithm if meta.algorithm not in ("", "nccl") else None
                    back = self.pipeline.allreduce(
                        streams.record(lane), source, target, wire, kernel_op,
                        lambda host, o: self.engine.allreduce_(host, o, algorithm, name=meta.name))
                    streams.wait(lane, back)
            if present and (not direct or postscale != 1.0):
                with span(MEMCPY_OUT_FUSION_BUFFER, tensors=len(entries)):
                    streams.unpack(lane, target, postscale, targets)
            done = streams.record(lane)
        if present:
            for entry in entries:
                entry.output.done = done
                entry.handle.set_result(entry.output)
        return how

    def _how(self, meta, wire: np.dtype) -> str:
        """nccl, hierarchical or staged for this request (the route, where its algorithm lets NCCL run)."""
        algorithm = meta.algorithm or self.engine.config.algorithm
        if algorithm not in ("auto", "nccl"):
            return nccl_rules.STAGED
        route, _ = self.decide_route()
        if route == nccl_rules.STAGED or nccl_rules.why_not_dtype(wire) is not None:
            return nccl_rules.STAGED
        if ReduceOp(meta.op).kernel_op not in nccl_rules.NCCL_OPS:
            return nccl_rules.STAGED
        return route

    def _hierarchical(self, buffer, wire: np.dtype, op: ReduceOp) -> None:
        """``buffer`` reduced in place: NCCL reduce-scatter in the node, each rank's shard through the host
        across nodes (the shard group of the host ``hierarchical`` algorithm), NCCL allgather in the node."""
        streams, lane, local = self.streams, self.stream, self._comm
        count = int(buffer.size)
        shard = -(-count // local.size)
        padded = streams.empty(shard * local.size, wire)
        mine = streams.empty(shard, wire)
        if shard * local.size != count:
            streams.fill(lane, padded, 0)
        streams.copy(lane, buffer, padded[:count])
        local.reduce_scatter(lane, padded, mine, wire, op)
        pipeline, reduce_across = self._cross
        back = pipeline.allreduce(streams.record(lane), mine, mine, wire, op, reduce_across)
        streams.wait(lane, back)
        local.all_gather(lane, mine, padded, wire)
        streams.copy(lane, padded[:count], buffer)

    def _fused_buffer(self, count: int, dtype: np.dtype):
        """``count`` elements of the lane's fused device buffer. Reuse is safe without waiting: everything
        that reads or writes it is queued on the lane's stream, or on a copy stream the lane's stream waits
        for before it goes on."""
        nbytes = count * np.dtype(dtype).itemsize
        if self._fused is None or self._fused.nbytes < nbytes:
            self._fused = self.streams.empty(max(nbytes, 1 << 20), np.dtype(np.uint8))
        return self._fused[:nbytes].view(device_dtype(dtype))

    # ---- the other collectives -------------------------------------------------------------------------------

    def collective(self, response: Response, entries: list[Entry | None], span) -> None:
        """allgather, broadcast, reducescatter or alltoall of one device tensor, through the host whole."""
        kind, meta, entry = response.kind, response.metas[0], entries[0]
        streams = self._bound(entries)
        engine = self.engine
        tensor: DeviceTensor = entry.array
        pipeline = self.pipeline
        with streams.activate():
            down, up = pipeline.to_host_stream, pipeline.to_device_stream
            count = int(tensor.flat.size)
            host = pipeline.host_buffer(count, tensor.dtype)
            if tensor.ready is not None:
                streams.wait(down, tensor.ready)
            streams.to_host(down, tensor.flat, host)
            streams.synchronize(streams.record(down))
            shaped = host.reshape(tensor.shape)
            extra = ()
            with span(COMMUNICATION[kind.name], tensors=1, route=nccl_rules.STAGED):
                if kind is Kind.ALLGATHER:
                    result = engine.allgather(shaped, meta.name)
                elif kind is Kind.BROADCAST:
                    result = engine.broadcast_(shaped, meta.root, meta.name)
                elif kind is Kind.REDUCESCATTER:
                    result = engine.reducescatter(shaped, ReduceOp(meta.op), meta.name, meta.prescale,
                                                  meta.postscale)
                elif kind is Kind.ALLTOALL:
                    result, received = engine.alltoall(shaped, entry.splits, meta.name)
                    extra = (received,)
                else:
                    raise CollectiveError(f"unexpected device response kind {kind!r}")
            if kind is Kind.BROADCAST:
                output = entry.output
            else:
                buffer = streams.empty(int(result.size), tensor.dtype)
                output = DeviceTensor(streams.result(tensor.tensor, buffer, result.shape), streams, buffer,
                                      tensor.dtype, result.shape)
            streams.to_device(up, np.ascontiguousarray(result).reshape(-1), output.flat)
            output.done = streams.record(up)
            pipeline.released(output.done)  # broadcast's result is the host buffer itself
        entry.handle.set_result((output,) + extra if extra else output)


HALVES = (np.dtype(np.float16), BFLOAT16)


def _rounded(factor: float, dtype: np.dtype) -> float:
    """``factor`` as ``dtype`` holds it: the product of two halves, computed in float32 and rounded once,
    is the half-precision product Horovod's CUDA kernels compute."""
    return float(np.array(factor, np.float32).astype(dtype).astype(np.float64))


def _codec(meta):
    if meta.compression == "none":
        return None
    return codec_for(getattr(Compression, meta.compression), np.dtype(meta.dtype), meta.name)
