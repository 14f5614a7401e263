"""``ProcessGroupCommlib``: every c10d call of a torch process group as commlib requests.

The default group is commlib's world; ``new_group(ranks)`` (every rank calls it, as c10d requires) registers
the ranks as a commlib process set, shared by every group with the same ranks. Groups made by their members
alone, ``new_group(ranks, use_local_synchronization=True)`` and ``new_subgroups(group_size, group=g)`` (called on
g's ranks only), get commlib's members-only process sets, registered by those ranks alone. Each call becomes commlib
requests on that set, and commlib's coordinator negotiates, fuses and runs them with the algorithm its
``auto`` chooses for the size and topology:

| c10d call | commlib requests |
|---|---|
| ``allreduce`` (DDP's buckets), ``allreduce_coalesced`` | ``allreduce_async_`` in place on the tensor's memory (no copy); AVG is Average, PREMUL_SUM a Sum with ``prescale_factor``; BAND/BOR/BXOR an allgather reduced on every rank |
| ``allreduce`` of sparse COO tensors (SUM, as on gloo) | ``allgather_async`` of each rank's indices and values, summed here by coalescing |
| ``broadcast`` | ``broadcast_async_`` in place |
| ``allgather``, ``all_gather_single`` | ``allgather_async`` of the tensor's bytes, then copied into the outputs |
| ``reduce_scatter``, ``reduce_scatter_single`` | ``reducescatter_async`` of the (ranks, n) blocks (uneven blocks: an allreduce) |
| ``alltoall``, ``all_to_all_single`` | ``alltoall_async`` with the split sizes |
| ``gather``, ``scatter`` | ``alltoall_async`` where only the root receives (gather) or sends (scatter) |
| ``reduce`` | ``allreduce_async_`` (the root's tensor in place, the others' on a copy) |
| ``barrier`` | commlib's barrier |
| ``send``, ``recv``, ``recv_anysource`` | MPI point-to-point on the group's own communicator (:mod:`.p2p`) |

Names. commlib matches requests by name; c10d matches calls by their order on a group. The k-th call on a
group is named ``<group>.<scope><k mod 64>`` on every rank (every rank calls in the same order), so two
ranks that disagree about that call (shapes, dtypes, ops, a broadcast's root, the call itself) get
commlib's error on every rank, naming each rank's value, instead of waiting for each other. A name comes
back every 64 calls: where its request is the same as last time (a training loop's calls repeat), commlib's
negotiation cache serves it; a call whose name is still in flight (64 calls outstanding) waits for it. A
finished call is forgotten once the calls before it have finished too: the group keeps no tensor alive
(a DDP hook's fresh bucket each step, FSDP's gathered parameters). Calls from futures' callbacks count
in the program's order, as c10d's contract asks (every rank issues a group's calls in one order; gloo pairs
them by that order too). The backend's own threads that issue calls while the program may issue others,
the DDP hooks' worker and the compression worker, name theirs in a scope of their own
(:mod:`.naming`), in an order that is the same on every rank.

A lossy compressor given in the options (``Compression.topk(...)``, ``.powersgd()``, ...) runs on the group's
compression worker, one call after the other, through commlib's compressor interface
(``compressor.start(key, buffer, exchange)``): its state (error feedback, PowerSGD's Q) is kept under the
tensor's dtype and shape, so that DDP's bucket keeps its state from step to step; buckets of one size share
it (the DDP hooks of :mod:`commlib.torch.hooks` key it by bucket index instead).

A call waited for at once (``dist.all_reduce(t)`` without ``async_op``, on a group whose timeout is no shorter
than commlib's deadline) runs commlib's synchronous form in the calling thread. The commonest one, an
all_reduce of one contiguous CPU tensor with an arithmetic op and no compression, skips the general path's
steps as well (:meth:`ProcessGroupCommlib._allreduce_now`): a lone small call's cost is mostly such steps.

Element types: reductions take commlib's dtypes (float16, bfloat16, float32, float64, uint8, int8, int16,
int32, int64, bool); the data-moving calls (broadcast, gathers, scatters, all-to-all, send/recv) move any
contiguous tensor as its bytes.
"""

from __future__ import annotations

import collections
import datetime
import functools
import queue
import sys
import threading
from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, ReduceOp as TorchReduceOp

import commlib as cl

from ...compression import Compressor, Exchange, NoCompression
from ...errors import ConfigError, ProcessSetError
from ..bridge import NUMPY_DTYPES, as_array, as_tensor
from . import internals, naming
from .options import Options
from .p2p import AnySourceReceive, Transfer
from .work import Work, raising_torch_errors

RedOp = TorchReduceOp.RedOpType
_SLOTS = 64  # a group's names in one scope: call k is named k mod _SLOTS (see the module docstring)
_COMMLIB_OPS = {RedOp.SUM: cl.Sum, RedOp.AVG: cl.Average, RedOp.PRODUCT: cl.Product, RedOp.MIN: cl.Min,
                RedOp.MAX: cl.Max, RedOp.PREMUL_SUM: cl.Sum}
_BITWISE = {RedOp.BAND: np.bitwise_and, RedOp.BOR: np.bitwise_or, RedOp.BXOR: np.bitwise_xor}
_PLAIN_OPS = {kind: op for kind, op in _COMMLIB_OPS.items() if kind != RedOp.PREMUL_SUM}  # no factor to read
_SHARED_DTYPES = frozenset(d for d in NUMPY_DTYPES if d is not torch.bfloat16)  # tensor.numpy() shares them
BACKEND_NAME = "commlib"


def _red_op(reduce_op):
    """(RedOpType, PREMUL_SUM's factor as a float or 1.0) of a c10d ReduceOp (or RedOpType)."""
    kind = reduce_op.op if isinstance(reduce_op, TorchReduceOp) else reduce_op
    factor = 1.0
    if kind == RedOp.PREMUL_SUM:
        factor = reduce_op.factor
        factor = float(factor.item()) if isinstance(factor, torch.Tensor) else float(factor)
    return kind, factor


def _contiguous(tensor: torch.Tensor, what: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError(f"{what}: tensors must be contiguous (shape: {tuple(tensor.shape)}, strides: "
                         f"{tensor.stride()}); pass tensor.contiguous()")
    return tensor.detach()


def _values(tensor: torch.Tensor, what: str):
    """The array commlib reduces for ``tensor`` (its memory: writing the array writes the tensor)."""
    tensor = _contiguous(tensor, what)
    if tensor.dtype is torch.bool and not tensor.is_cuda:
        return tensor.numpy()
    if tensor.dtype not in NUMPY_DTYPES:
        names = ", ".join(str(d).replace("torch.", "") for d in (*NUMPY_DTYPES, torch.bool))
        raise TypeError(f"{what}: the commlib backend cannot reduce {tensor.dtype}; it reduces {names}")
    return as_array(tensor, None, what)


def _bytes(tensor: torch.Tensor, what: str):
    """``tensor``'s memory as a flat array of bytes (any dtype): what the data-moving calls send."""
    flat = _contiguous(tensor, what).reshape(-1).view(torch.uint8)
    return flat if flat.is_cuda else flat.numpy()


def _dtype_label(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).replace("torch.", "")


class ProcessGroupCommlib(ProcessGroup):
    """A torch process group whose calls run on commlib (see the module docstring). Made by
    ``init_process_group("commlib")`` and ``new_group``; ``ranks`` are its world ranks (sorted), ``process_set``
    commlib's set for them (None: the world), ``prefix`` makes its request names unique."""

    Options = Options  # as c10d's backends expose theirs (ProcessGroupNCCL.Options)

    def __init__(self, rank: int, size: int, ranks: Sequence[int], process_set, prefix: str, options,
                 timeout_s: float | None, owns_commlib: bool = False):
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        self._ranks = list(ranks)
        self._set = process_set
        self._prefix = prefix
        self.options = options
        self._timeout_s = timeout_s  # None: commlib's deadline alone bounds waits
        self._owns_commlib = owns_commlib
        self._counts: dict = {}   # naming scope -> requests named so far
        self._in_flight: dict = {}  # name -> the handle of its last asynchronous call, while it runs
        self._issued: collections.deque = collections.deque()  # (name, handle) in call order, to release
        self._compress_worker = None
        self._lock = threading.Lock()
        # made now, by every rank of the group: a communicator's duplicate is collective, and a send involves two
        self._p2p = internals.point_to_point(process_set)
        self._sets = {}           # (world default group only) ranks -> commlib ProcessSet shared by subgroups
        self._made = {}           # (world default group only) ranks -> groups made by their members so far
        self._closed = False
        self._group_name = prefix[2:-1]
        self._group_desc = "undefined"

    # ---- identity -------------------------------------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - c10d's name
        return BACKEND_NAME

    @property
    def name(self) -> str:
        return BACKEND_NAME

    def rank(self) -> int:
        return self._rank

    # c10d keeps a group's name in its device backends, which a Python group has none of: kept here
    def _set_group_name(self, name: str) -> None:
        self._group_name = str(name)

    @property
    def group_name(self) -> str:
        return self._group_name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = str(desc)

    @property
    def group_desc(self) -> str:
        return self._group_desc

    def size(self) -> int:
        return self._size

    # ---- naming ---------------------------------------------------------------------------------------

    def _name(self) -> str:
        """The name of this group's next request in this thread's scope (see the module docstring)."""
        scope = naming.scope()
        with self._lock:
            count = self._counts.get(scope, 0)
            self._counts[scope] = count + 1
        return f"{self._prefix}{scope}{count % _SLOTS}"

    def _bounded(self, opts) -> bool:
        """Whether a timeout shorter than commlib's own deadline bounds this call (the group's, or the call's
        options'): then its Work's wait enforces it, so the call is submitted even where the caller waits at
        once (commlib's synchronous forms wait as long as commlib's deadline)."""
        if self._timeout_s is not None:
            return True
        timeout = seconds(getattr(opts, "timeout", None))
        return bool(timeout and timeout > 0 and shorter_than_commlib(timeout))

    def _work(self, handles, finish, what: str, timeout=None) -> Work:
        limit = self._timeout_s
        if timeout is not None and timeout.total_seconds() > 0:
            limit = timeout.total_seconds()
        return Work(handles, finish, f"{what} on process group {self._prefix[:-1]}", limit)

    def _start(self, submit, *args, **kwargs):
        """commlib's ``submit`` (an ``*_async`` function) for this call; when the caller waits for it at once
        (c10d's ``asyncOp`` is False: ``dist.all_reduce(t)`` without ``async_op``), its synchronous form
        instead, which drives the collective in this thread (the asynchronous one hands it to commlib's
        background thread, which first gathers submissions for a cycle: about a millisecond per call)."""
        name = self._name()
        previous = self._in_flight.pop(name, None)
        if previous is not None and not previous.done():  # the name's last call: _SLOTS calls ago
            previous.wait()
        if getattr(_calls, "synchronous", False):
            return _Completed(_SYNCHRONOUS[submit](*args, name=name, **kwargs))
        handle = self._in_flight[name] = submit(*args, name=name, **kwargs)
        self._release(name, handle)
        return handle

    def _release(self, name: str, handle) -> None:
        """Note ``handle`` as the newest call, and forget the oldest calls that are done: a handle holds its
        result, the caller's tensor, and a training loop's tensors (a DDP hook's fresh half-precision
        bucket each step) would otherwise stay alive until their name came back ``_SLOTS`` calls later."""
        with self._lock:
            issued, in_flight = self._issued, self._in_flight
            issued.append((name, handle))
            while issued and issued[0][1].done():
                old, done = issued.popleft()
                if in_flight.get(old) is done:
                    del in_flight[old]

    def _compression(self, array):
        """The compression of a float32 SUM/AVG of ``array``: the group's option, else
        COMMLIB_TORCH_COMPRESSION; None for none."""
        compression = self.options.compression
        if compression is None:
            compression = getattr(cl.Compression, internals.config().torch_compression)
        if isinstance(compression, NoCompression) or array.dtype != np.float32:
            return None
        return compression

    # ---- reductions -----------------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        if len(tensors) == 1 and getattr(_calls, "synchronous", False):
            work = self._allreduce_now(tensors[0], opts.reduceOp)
            if work is not None:
                return work
        if any(t.layout is torch.sparse_coo for t in tensors):
            return self._sparse_allreduce(tensors, opts)
        started = [self._allreduce_one(t, opts.reduceOp, "allreduce") for t in tensors]

        def done(_results):
            for _, finish in started:
                finish()
            return list(tensors)

        return self._work([handle for handle, _ in started], done, "all_reduce", opts.timeout)

    def _allreduce_now(self, tensor, reduce_op) -> Work | None:
        """The common synchronous ``dist.all_reduce``: one contiguous CPU tensor that numpy shares, an
        arithmetic op, no compression; reduced in place by commlib's synchronous call, with none of the general
        path's steps that this case does not need (a lone call's cost is mostly such steps). None for any other
        call: the general path takes it, and raises its errors."""
        op = _PLAIN_OPS.get(getattr(reduce_op, "op", reduce_op))
        if (op is None or type(tensor) is not torch.Tensor or not tensor.is_cpu or tensor.requires_grad
                or tensor.layout is not torch.strided or tensor.dtype not in _SHARED_DTYPES
                or not tensor.is_contiguous() or tensor.is_conj() or tensor.is_neg()):
            return None
        array = tensor.numpy()
        if op in (cl.Sum, cl.Average) and self._compression(array) is not None:  # as _allreduce_one decides
            return None
        self._start(cl.allreduce_async_, array, op=op, algorithm=self.options.algorithm, process_set=self._set)
        return Work.completed([tensor], f"all_reduce on process group {self._prefix[:-1]}")

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def _sparse_allreduce(self, tensors, opts):
        """all_reduce of sparse COO tensors (DDP's sparse gradients, an ``nn.Embedding(sparse=True)``'s):
        every rank's coalesced indices and values are gathered, and each rank sums them by coalescing; the
        sum then replaces the tensor's contents, as on gloo. SUM only, as on gloo."""
        kind, _ = _red_op(opts.reduceOp)
        if kind != RedOp.SUM:
            raise ValueError(f"all_reduce: sparse tensors reduce with ReduceOp.SUM only (as on gloo), not {kind.name}")
        for tensor in tensors:
            if tensor.layout is not torch.sparse_coo:
                raise TypeError(f"all_reduce: a list of sparse COO and {tensor.layout} tensors; reduce the sparse "
                                "and the dense ones in separate calls")
        started = []
        for tensor in tensors:
            local = tensor.detach().coalesce().cpu()
            indices = local.indices().t().contiguous()  # (nnz, sparse dims): each rank's rows, gathered
            values = local.values().contiguous()
            started.append((tensor, values, self._gather_bytes(indices, "allreduce"),
                            self._gather_bytes(values, "allreduce")))

        def done(_results):
            for tensor, values, gathered_indices, gathered_values in started:
                indices = torch.from_numpy(gathered_indices.result().view(np.int64)).view(-1, tensor.sparse_dim())
                summed = torch.sparse_coo_tensor(
                    indices.t(), torch.from_numpy(gathered_values.result()).view(values.dtype).view(
                        -1, *values.shape[1:]), tensor.shape).coalesce()
                with torch.no_grad():
                    tensor.copy_(summed.to(tensor.device))
            return list(tensors)

        handles = [h for _t, _v, *pair in started for h in pair]
        return self._work(handles, done, "all_reduce", opts.timeout)

    def _allreduce_one(self, tensor, reduce_op, call: str, into=None):
        """Start reducing ``tensor`` (into ``into``'s array if given, else in place); returns (handle,
        finish) where ``finish()`` completes what the handle's result does not (bitwise ops)."""
        kind, factor = _red_op(reduce_op)
        array = _values(tensor, call) if into is None else into
        if kind in _BITWISE:
            return self._bitwise(array, kind, call)
        op = _COMMLIB_OPS[kind]
        compression = self._compression(array) if op in (cl.Sum, cl.Average) else None
        if isinstance(compression, Compressor):
            return self._compressed(array, op, factor, compression), lambda: None
        handle = self._start(cl.allreduce_async_, array, op=op, prescale_factor=factor,
                                     algorithm=self.options.algorithm, compression=compression or cl.Compression.none,
                                     process_set=self._set)
        return handle, lambda: None

    def _bitwise(self, array, kind, call: str):
        """BAND/BOR/BXOR (integer and bool tensors): every rank's data gathered and combined here."""
        if array.dtype.kind not in "iub":
            raise TypeError(f"{call}: {kind.name} needs an integer or bool tensor, not {array.dtype}")
        flat = array.reshape(-1)
        handle = self._start(cl.allgather_async, flat, process_set=self._set)

        def finish():
            gathered = handle.result().reshape(self._size, -1)
            _BITWISE[kind].reduce(gathered, axis=0, out=flat)

        return handle, finish

    def _compressed(self, array, op, factor: float, compressor):
        """A lossy compressor's allreduce of ``array`` in place, on the group's compression worker (one call
        after the other: the collectives of a compressor's second phase are then named in the same order on
        every rank); returns a handle the worker completes."""
        handle = _Job(f"{self._prefix}compressed")
        key = f"{self._prefix}{array.dtype}{tuple(array.shape)}"  # the compressor's state follows the tensor
        exchange = _GroupExchange(self)

        def run():
            try:
                if factor != 1.0:
                    np.multiply(array, np.float32(factor), out=array)
                compressor.start(key, array.reshape(-1), exchange)()
                if op is cl.Average:  # as commlib's allreduce scales a compressor's sum
                    np.multiply(array, np.float32(1.0 / self._size), out=array)
                handle.set_result(array)
            except Exception as exc:  # noqa: BLE001 - the Work raises it
                handle.set_error(exc)

        with self._lock:
            if self._compress_worker is None:
                self._compress_worker = _Worker(f"commlib-torch-compress-{self._prefix[:-1]}", "cmp.")
        self._compress_worker.put(run)
        return handle

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        tensor = tensors[opts.rootTensor]
        array = _values(tensor, "reduce")
        into = array if opts.rootRank == self._rank else np.array(array, copy=True)  # others keep theirs
        handle, finish = self._allreduce_one(tensor, opts.reduceOp, f"reduce{opts.rootRank}", into=into)
        return self._work([handle], lambda _r: finish() or [tensor], "reduce", opts.timeout)

    def reduce_scatter(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        output, blocks = outputs[0], inputs[0]
        if len(blocks) != self._size:
            raise ValueError(f"reduce_scatter: {len(blocks)} input tensors for a group of {self._size} ranks")
        sizes = [b.numel() for b in blocks]
        if len(set(sizes)) == 1:
            stacked = torch.stack([_contiguous(b, "reduce_scatter").reshape(-1) for b in blocks])
            return self._reduce_scatter(output, stacked, opts, "reduce_scatter")
        # uneven blocks: reduce all of them, keep this rank's
        flat = torch.cat([_contiguous(b, "reduce_scatter").reshape(-1) for b in blocks])
        handle, finish = self._allreduce_one(flat, opts.reduceOp, "reduce_scatter_v")
        start = sum(sizes[:self._rank])

        def done(_results):
            finish()
            output.copy_(flat[start:start + sizes[self._rank]].view_as(output))
            return [output]

        return self._work([handle], done, "reduce_scatter", opts.timeout)

    def reduce_scatter_single(self, output, inp, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        if inp.numel() != output.numel() * self._size:
            raise ValueError(f"reduce_scatter_tensor: the input has {inp.numel()} elements, the output "
                             f"{output.numel()}; the input must have the output's times the group's size "
                             f"({self._size})")
        blocks = _contiguous(inp, "reduce_scatter_tensor").reshape(self._size, -1)
        return self._reduce_scatter(output, blocks, opts, "reduce_scatter_tensor")

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._join(works, "reduce_scatter_tensor_coalesced")

    def _reduce_scatter(self, output, blocks: torch.Tensor, opts, what: str) -> Work:
        """``blocks`` (ranks x n): reduce, and this rank's row into ``output``."""
        kind, factor = _red_op(opts.reduceOp)
        array = _values(blocks, what)
        if kind in _BITWISE:  # every rank's blocks gathered, combined here, this rank's row kept
            if array.dtype.kind not in "iub":
                raise TypeError(f"{what}: {kind.name} needs an integer or bool tensor, not {array.dtype}")
            handle = self._start(cl.allgather_async, array.reshape(-1), process_set=self._set)

            def done_bitwise(results):
                gathered = results[0].reshape(self._size, self._size, -1)[:, self._rank]
                reduced = _BITWISE[kind].reduce(gathered, axis=0)
                output.copy_(as_tensor(np.ascontiguousarray(reduced)).reshape(output.shape))
                return [output]

            return self._work([handle], done_bitwise, what, opts.timeout)
        handle = self._start(cl.reducescatter_async, array, op=_COMMLIB_OPS[kind], process_set=self._set,
                                        prescale_factor=factor)

        def done(results):
            output.copy_(as_tensor(results[0]).reshape(output.shape))
            return [output]

        return self._work([handle], done, what, opts.timeout)

    # ---- data movement ---------------------------------------------------------------------------------

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        handles = []
        for tensor in tensors:
            data = _bytes(tensor, "broadcast")
            handle = self._start(cl.broadcast_async_, data, root_rank=self._ranks[opts.rootRank],
                                 process_set=self._set)
            handles.append(handle)
        return self._work(handles, lambda _r: list(tensors), "broadcast", opts.timeout)

    def allgather(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        handles, finishes = [], []
        for out_list, tensor in zip(outputs, inputs):
            if len(out_list) != self._size:
                raise ValueError(f"all_gather: {len(out_list)} output tensors for a group of {self._size} ranks")
            handle = self._gather_bytes(tensor, "allgather")
            handles.append(handle)
            finishes.append((handle, out_list))

        def done(_results):
            for handle, out_list in finishes:
                _scatter_into(handle.result(), out_list)
            return [t for out_list in outputs for t in out_list]

        return self._work(handles, done, "all_gather", opts.timeout)

    def allgather_coalesced(self, outputs, inputs, opts=None):
        """``outputs[r][i]`` receives rank r's ``inputs[i]`` (all_gather's lists, transposed)."""
        if len(outputs) != self._size:
            raise ValueError(f"all_gather_coalesced: {len(outputs)} output lists for a group of {self._size} ranks")
        per_input = [[outputs[r][i] for r in range(self._size)] for i in range(len(inputs))]
        work = self.allgather(per_input, inputs, opts)
        return work

    def all_gather_single(self, output, inp, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        if output.numel() != inp.numel() * self._size:
            raise ValueError(f"all_gather_into_tensor: the output has {output.numel()} elements; it must have the "
                             f"input's ({inp.numel()}) times the group's size ({self._size})")
        handle = self._gather_bytes(inp, "allgather")

        def done(results):
            _bytes(output, "all_gather_into_tensor")[...] = results[0]
            return [output]

        return self._work([handle], done, "all_gather_into_tensor", opts.timeout)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._join(works, "all_gather_into_tensor_coalesced")

    def _gather_bytes(self, tensor, call: str):
        data = _bytes(tensor, call)
        handle = self._start(cl.allgather_async, data, process_set=self._set)
        return handle

    def all_to_all_single(self, output, inp, output_splits, input_splits, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        rows = inp.shape[0] if inp.dim() else 1
        row_bytes = (inp.numel() // rows if rows else 0) * inp.element_size()
        if not input_splits:
            if rows % self._size:
                raise ValueError(f"all_to_all_single: {rows} rows do not split evenly over {self._size} ranks; "
                                 "give input_split_sizes")
            input_splits = [rows // self._size] * self._size
        if row_bytes == 0 and output.numel():  # an empty input row: take the row size from the output
            row_bytes = output.numel() // max(output.shape[0], 1) * output.element_size()
        data = _bytes(inp, "all_to_all_single")
        splits = np.array([int(s) * row_bytes for s in input_splits], np.int64)
        handle = self._start(cl.alltoall_async, data, splits=splits, process_set=self._set)

        def done(results):
            received, _ = results[0]
            target = _bytes(output, "all_to_all_single")
            if received.size != target.size:
                raise ValueError(f"all_to_all_single: received {received.size} bytes for an output of "
                                 f"{target.size} bytes (output_split_sizes {list(output_splits)})")
            target[...] = received
            return [output]

        return self._work([handle], done, "all_to_all_single", opts.timeout)

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        parts = [_bytes(t, "all_to_all") for t in inputs]
        data = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
        splits = np.array([p.size for p in parts], np.int64)
        handle = self._start(cl.alltoall_async, data, splits=splits, process_set=self._set)

        def done(results):
            _scatter_into(results[0][0], outputs)
            return list(outputs)

        return self._work([handle], done, "all_to_all", opts.timeout)

    def gather(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        root = opts.rootRank
        data = _bytes(inputs[0], "gather")
        splits = np.zeros(self._size, np.int64)
        splits[root] = data.size
        handle = self._start(cl.alltoall_async, data, splits=splits, process_set=self._set)

        def done(results):
            if self._rank == root:
                _scatter_into(results[0][0], outputs[0])
                return list(outputs[0])
            return []

        return self._work([handle], done, "gather", opts.timeout)

    def scatter(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.ScatterOptions()
        root = opts.rootRank
        output = outputs[0]
        if self._rank == root:
            parts = [_bytes(t, "scatter") for t in inputs[0]]
            data = np.concatenate(parts)
            splits = np.array([p.size for p in parts], np.int64)
        else:
            data = np.zeros(0, np.uint8)
            splits = np.zeros(self._size, np.int64)
        handle = self._start(cl.alltoall_async, data, splits=splits, process_set=self._set)

        def done(results):
            _bytes(output, "scatter")[...] = results[0][0]
            return [output]

        return self._work([handle], done, "scatter", opts.timeout)

    def barrier(self, opts=None):
        opts = opts if opts is not None else dist.BarrierOptions()
        handle = self._start(cl.barrier_async, self._set)
        return self._work([handle], lambda _r: [], "barrier", opts.timeout)

    # ---- point to point ---------------------------------------------------------------------------------

    def _transport(self):
        if self._p2p is None:
            raise RuntimeError(f"process group {self._group_name} was destroyed")
        return self._p2p

    def send(self, tensors, dst: int, tag: int = 0):
        transport = self._transport()
        data = _bytes(tensors[0], "send")
        transfer = Transfer(transport, transport.isend(data, dst, tag), "a send")
        return Work([transfer], lambda _r, keep=data: [], f"send to rank {dst}", self._timeout_s)

    def recv(self, tensors, src: int, tag: int = 0):
        transport = self._transport()
        data = _bytes(tensors[0], "recv")
        transfer = Transfer(transport, transport.irecv(data, src, tag), "a receive")
        work = Work([transfer], lambda _r: list(tensors), f"recv from rank {src}", self._timeout_s)
        work.source = src
        return work

    def recv_anysource(self, tensors, tag: int = 0):
        transport = self._transport()
        data = _bytes(tensors[0], "recv")
        transfer = AnySourceReceive(transport, data, tag, internals.config().timeout_s)

        def done(_results):  # runs once the receive is done: the Work below exists by then
            work.source = transfer.source
            return list(tensors)

        work = Work([transfer], done, "recv from any rank", self._timeout_s)
        return work

    # ---- groups and lifetime ----------------------------------------------------------------------------

    def new_group(self, ranks, timeout=None, pg_options=None, group_name=None, group_desc=None):
        """c10d's ``new_group`` on the default group: the group's ranks as a commlib process set (one per
        distinct set of ranks); None on ranks outside it. Who calls it decides how the set is registered
        (:meth:`shared_set`): every rank (an ordinary ``new_group``), or the group's members alone."""
        options = options_of(pg_options)
        if options.settings:
            raise ConfigError("commlib backend Options: settings apply to the whole job: give them to the default "
                              "group's options (init_process_group), not to new_group")
        ranks = sorted(int(r) for r in ranks)
        me = cl.rank()
        members_only = _made_by_members(group_name)
        if members_only and me not in ranks:
            return None  # new_subgroups(group=...): a subgroup of the parent's that this rank is not in
        process_set = self.shared_set(ranks, members_only)
        if me not in ranks:
            return None
        prefix = f"pg{group_name}."
        if members_only:  # c10d's name for it counts groups this rank made, which members may not agree on
            made = self._made.get(tuple(ranks), 0)
            self._made[tuple(ranks)] = made + 1
            prefix = f"pgm{made}."  # the set's own count: its members made every group of these ranks
        group = ProcessGroupCommlib(ranks.index(me), len(ranks), ranks, process_set, prefix, options,
                                    shorter_than_commlib(seconds(timeout)))
        group._set_group_name(str(group_name))  # c10d sets these itself only on groups it creates
        group._set_group_desc(group_desc or "undefined")
        return group

    def shared_set(self, ranks: list[int], members_only: bool = False):
        """The commlib process set of ``ranks`` (None: the world), registered once for every group with
        these ranks. Every rank calls it, in the same order and with the same ranks, as c10d's new_group
        requires: the ranks are agreed first, also where this rank has the set already, so that ranks which
        disagree all get the error, none a hang. ``members_only``: only the set's ranks call it (they agree
        among themselves, under commlib's deadline); such sets are shared only with groups made the same way,
        which the same ranks, and only they, made."""
        ranks = list(ranks)
        if members_only:
            if ranks == list(range(cl.size())):
                return None
            key = ("members", *ranks)
            if key not in self._sets:
                self._sets[key] = cl.add_process_set(ranks, members_only=True)
            return self._sets[key]
        every = cl.allgather_object(ranks, name="commlib.torch.new_group")
        if any(theirs != ranks for theirs in every):
            listing = ", ".join(f"rank {r}: {theirs}" for r, theirs in enumerate(every))
            raise ProcessSetError(
                f"new_group: the ranks called it with different ranks ({listing}). The commlib backend's groups "
                "are created by every rank of the default group, with the same ranks in the same order, or by "
                "their members alone with new_group(ranks, use_local_synchronization=True) or "
                "new_subgroups(group_size, group=...); new_subgroups_by_enumeration called on some ranks only "
                "is neither: call it on every rank, or new_group(..., use_local_synchronization=True) on the "
                "members")
        if ranks == list(range(cl.size())):
            return None
        key = tuple(ranks)
        if key not in self._sets:
            self._sets[key] = cl.add_process_set(ranks)
        return self._sets[key]

    def shutdown(self) -> None:
        """Called by ``destroy_process_group``: stop this group's compression worker, free its transport; the
        default group also shuts commlib down if it started it."""
        if self._closed:
            return
        self._closed = True
        if self._compress_worker is not None:
            self._compress_worker.stop()
        if self._p2p is not None:
            self._p2p.free()
            self._p2p = None
        if self._owns_commlib and cl.is_initialized():
            cl.shutdown()

    def abort(self) -> None:
        self.shutdown()

    def _join(self, works: list[Work], what: str) -> Work:
        """One Work over several (the coalesced calls)."""
        handles = [_WorkHandle(w) for w in works]
        return Work(handles, lambda _r: [t for w in works for t in w.result()], what)


_calls = threading.local()  # .synchronous: the c10d call running in this thread is waited for at once
_calls.synchronous = False


_SYNCHRONOUS = {cl.allreduce_async_: cl.allreduce_, cl.broadcast_async_: cl.broadcast_, cl.allgather_async: cl.allgather,
                cl.reducescatter_async: cl.reducescatter, cl.alltoall_async: cl.alltoall, cl.barrier_async: cl.barrier}


def _c10d_call(method):
    """``method`` (a c10d call of the group): notes whether the caller waits at once (its options'
    ``asyncOp``), and raises torch's error where commlib refuses to start it (it already lost a peer)."""
    method = raising_torch_errors(method)

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        opts = kwargs.get("opts", args[-1] if args else None)
        before = getattr(_calls, "synchronous", False)
        _calls.synchronous = getattr(opts, "asyncOp", True) is False and not self._bounded(opts)
        try:
            return method(self, *args, **kwargs)
        finally:
            _calls.synchronous = before

    return call


for _call in ("allreduce", "allreduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_single",
              "reduce_scatter_single_coalesced", "broadcast", "allgather", "allgather_coalesced", "all_gather_single",
              "all_gather_single_coalesced", "all_to_all_single", "alltoall", "gather", "scatter", "barrier"):
    setattr(ProcessGroupCommlib, _call, _c10d_call(getattr(ProcessGroupCommlib, _call)))
for _call in ("send", "recv", "recv_anysource"):
    setattr(ProcessGroupCommlib, _call, raising_torch_errors(getattr(ProcessGroupCommlib, _call)))


class _Completed:
    """The handle of a collective that ran synchronously: its result."""

    def __init__(self, result):
        self._result = result

    @staticmethod
    def done() -> bool:
        return True

    def wait(self) -> None:
        pass

    def result(self):
        return self._result
ProcessGroupCommlib._reduce_scatter_base = ProcessGroupCommlib.reduce_scatter_single
ProcessGroupCommlib._allgather_base = ProcessGroupCommlib.all_gather_single
ProcessGroupCommlib.alltoall_base = ProcessGroupCommlib.all_to_all_single


class _Job(cl.Handle):
    """A handle completed by a thread of the backend (the compression worker)."""

    __slots__ = ()

    def wait(self) -> None:
        while not self.wait_briefly(1.0):
            pass


class _Worker(threading.Thread):
    """Runs functions one after the other, naming their calls in scope ``label``."""

    def __init__(self, name: str, label: str):
        super().__init__(name=name, daemon=True)
        self._label = label
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.start()

    def put(self, function) -> None:
        self._queue.put(function)

    def stop(self) -> None:
        self._queue.put(None)

    def run(self) -> None:
        naming.enter(self._label)
        while True:
            function = self._queue.get()
            if function is None:
                return
            function()


class _GroupExchange(Exchange):
    """The collectives a compressor uses (commlib's compressor interface), on a group's commlib set, named
    in the group's order (the compressor's own names are its state's keys, the same on every call)."""

    def __init__(self, group: "ProcessGroupCommlib"):
        super().__init__(group.size(), group.rank(), group._set)
        self._group = group

    def allreduce(self, array, name):
        return self._group._start(cl.allreduce_async_, array, op=cl.Sum, process_set=self.process_set)

    def allgather(self, array, name):
        return self._group._start(cl.allgather_async, array, process_set=self.process_set)

    def wait(self, handle):
        return cl.synchronize(handle)


class _WorkHandle:
    """A Work seen as a handle (to wait for several Works as one)."""

    def __init__(self, work: Work):
        self._work = work

    def done(self) -> bool:
        return self._work.is_completed()

    def wait(self) -> None:
        try:
            self._work.wait()
        except Exception:  # noqa: BLE001 - result() raises it
            pass

    def result(self):
        return self._work.result()


def _scatter_into(data: np.ndarray, tensors: Sequence[torch.Tensor]) -> None:
    """Copy consecutive pieces of ``data`` (bytes) into ``tensors``, each its own byte size."""
    offset = 0
    for tensor in tensors:
        target = _bytes(tensor, "output")
        target[...] = data[offset:offset + target.size]
        offset += target.size
    if offset != data.size:
        raise ValueError(f"received {data.size} bytes for outputs of {offset} bytes in all: the tensors' sizes "
                         "differ between ranks")


def _made_by_members(group_name) -> bool:
    """Whether this ``new_group`` is called by some ranks only (its members, or a parent group's ranks).

    c10d hands a Python group's ``new_group`` the ranks but not who calls it. Two of its callers are known
    to call on some ranks only: ``new_group(..., use_local_synchronization=True)``, on the members alone
    (c10d then names the group by a hash of its ranks, where an ordinary group's name is a number), and
    ``new_subgroups(group_size, group=g)``, on g's ranks alone (each calls ``new_group`` for every subgroup
    of g; found here as the caller's frame, c10d's own ``new_subgroups``, with a ``group`` that is not the
    whole world). Both get members-only process sets; everything else is an ordinary, world-wide one."""
    if group_name is not None and not str(group_name).isdigit():
        return True  # use_local_synchronization: the members alone (and only they reach here)
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "new_subgroups" and frame.f_globals.get("__name__") == dist.distributed_c10d.__name__:
            group = frame.f_locals.get("group")
            if group is None or group is dist.GroupMember.WORLD:
                return False
            return sorted(dist.get_process_group_ranks(group)) != list(range(cl.size()))
        frame = frame.f_back
    return False


def options_of(options) -> Options:
    """A group's ``pg_options`` (None: the defaults)."""
    if options is None:
        return Options()
    if not isinstance(options, Options):
        raise TypeError(f"the commlib backend takes commlib.torch.distributed.Options as pg_options, not "
                        f"{type(options).__name__}")
    return options


def seconds(timeout) -> float | None:
    return timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout


def shorter_than_commlib(timeout: float | None) -> float | None:
    """``timeout`` where it is shorter than commlib's own deadline (then the group's Works enforce it), else
    None (commlib's deadline, which is the default group's timeout, bounds every wait)."""
    if timeout and timeout < internals.config().timeout_s:
        return timeout
    return None
