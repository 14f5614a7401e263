"""DDP communication hooks over commlib's compressors, for any DDP (gloo, NCCL or the ``commlib`` backend).

PyTorch's contract is ``hook(state, bucket) -> Future[Tensor]``: DDP hands a bucket of gradients, the hook
returns a future of the averaged bucket. Pieces compose as PyTorch's ``ddp_comm_hooks`` do: a wire codec
wraps an allreduce hook, a compressor wraps an allreduce hook, error feedback wraps a compressor::

    from commlib import Compression
    from commlib.torch import hooks

    state = hooks.State()                                  # the default group; State(process_group=pg)
    ddp.register_comm_hook(state, hooks.fp16_wrapper(hooks.allreduce_hook))                 # fp16 on the wire
    ddp.register_comm_hook(state, hooks.compress_wrapper(hooks.allreduce_hook, Compression.topk(0.01)))
    ddp.register_comm_hook(state, hooks.compress_wrapper(hooks.bf16_wrapper(hooks.allreduce_hook),
                                                          Compression.powersgd(rank=2)))
    ddp.register_comm_hook(state, hooks.compress_wrapper(
        hooks.allreduce_hook, Compression.error_feedback(Compression.onebit(error_feedback=False))))

- :func:`allreduce_hook`: the bucket averaged (PyTorch's ``allreduce_hook``).
- :func:`wire_wrapper` (:func:`fp16_wrapper`, :func:`bf16_wrapper`): the bucket travels in half precision,
  as commlib's wire codecs send it: divided by the number of ranks *before* it is rounded (so no sum of
  in-range values overflows float16), encoded and decoded by commlib's kernels.
- :func:`compress_wrapper`: commlib's lossy compressors (``commlib.Compression``: top-k, random-k, one-bit,
  DGC, PowerSGD, and the error-feedback and momentum wrappers; docs/compression.md), one implementation for
  ``DistributedOptimizer``, the ``commlib`` backend's options and these hooks. Each gradient of the bucket is
  compressed on its own, as ``DistributedOptimizer`` does (PowerSGD then sees each weight as its matrix),
  under the key ``bucket<index>.<position>:<shape>``, the same on every rank; the compressor's dense messages go
  through the wrapped hook (so ``fp16_wrapper`` sends them in half precision), its sparse ones through one
  ``all_gather_into_tensor``.

A compressor's second phase (PowerSGD's Q) needs the first's result, so a compressed bucket is sent by a
worker thread of the ``State``, one bucket after the other: every rank issues the calls in the same order.
The last bucket of a backward pass is sent by the hook itself after the worker has finished, so that the
calls DDP makes after its last hook (find_unused_parameters' bitmap) come after all of them.
"""

from __future__ import annotations

import functools
import queue
import threading

import numpy as np
import torch
import torch.distributed as dist

from ..compression import Compression, Compressor, Exchange, WireCodec
from .distributed.naming import naming_scope
from .bridge import as_array


class State:
    """The state every hook of this module takes: the process group (None: the default group) and, for
    :func:`compress_wrapper`, the worker that sends compressed buckets."""

    def __init__(self, process_group=None):
        self.process_group = process_group
        self._worker: _Worker | None = None
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        return dist.get_world_size(self.process_group)

    def worker(self) -> "_Worker":
        with self._lock:
            if self._worker is None:
                self._worker = _Worker()
            return self._worker

    def __getstate__(self):  # DDP may pickle its hook's state (checkpointing): the thread is not part of it
        return {"process_group": None}

    def __setstate__(self, values):
        self.__init__(values.get("process_group"))


class _SumState:
    """What a wrapper hands the hook it wraps: the same group, and "sum, do not average"."""

    def __init__(self, state: State):
        self.process_group = state.process_group
        self.size = state.size
        self.sum = True


def allreduce_hook(state, bucket):  # (no annotations: DDP checks them against objects, not strings)
    """The bucket averaged over the group (summed, when a wrapper asks for the sum)."""
    tensor = bucket.buffer()
    if not getattr(state, "sum", False):
        tensor.div_(state.size)
    return dist.all_reduce(tensor, group=state.process_group, async_op=True).get_future().then(
        lambda fut: fut.value()[0])


def wire_wrapper(hook, codec: WireCodec):
    """``hook`` with the bucket sent as ``codec`` (``Compression.fp16`` or ``.bf16``): float32 values are
    divided by the group's size and rounded to half precision by commlib's kernels, ``hook`` sums the half
    precision bucket, and the sum is widened back into the bucket. Other dtypes go through ``hook`` as they
    are."""

    @functools.wraps(hook)
    def wire_hook(state, bucket):
        buffer = bucket.buffer()
        if buffer.dtype != torch.float32 or buffer.device.type != "cpu":
            return hook(state, bucket)
        wire = torch.empty(buffer.shape, dtype=torch.float16 if codec.name == "fp16" else torch.bfloat16)
        codec.encode(as_array(buffer), as_array(wire), scale=1.0 / _size(state))
        summed = hook(_SumState(state) if isinstance(state, State) else state, _Bucket(wire, bucket.index()))
        scale = _average_scale(state)

        def widen(fut):
            codec.decode(as_array(fut.value().contiguous()), as_array(buffer), scale=scale)
            return buffer

        return summed.then(widen)

    return wire_hook


fp16_wrapper = functools.partial(wire_wrapper, codec=Compression.fp16)
fp16_wrapper.__doc__ = "``hook`` with float16 on the wire (:func:`wire_wrapper`)."
bf16_wrapper = functools.partial(wire_wrapper, codec=Compression.bf16)
bf16_wrapper.__doc__ = "``hook`` with bfloat16 on the wire (:func:`wire_wrapper`)."


def compress_wrapper(hook, compressor: Compressor):
    """A hook that sends each float32 gradient of the bucket with ``compressor`` (a commlib compressor:
    ``Compression.topk(0.01)``, ``.dgc()``, ``.powersgd(rank=2)``, ``.onebit()``,
    ``.error_feedback(...)``), its dense messages through ``hook`` (commlib's :func:`allreduce_hook`, possibly
    wrapped); the result is the average. Keep one compressor object per model: it holds the residuals and
    factors between steps. Takes a :class:`State`."""
    if not isinstance(compressor, Compressor):
        raise TypeError(f"compress_wrapper takes a commlib compressor (Compression.topk(...), .dgc(), .powersgd(), "
                        f".onebit(), .error_feedback(...)), not {compressor!r}")

    @functools.wraps(hook)
    def compressed_hook(state: State, bucket):
        if not isinstance(state, State):
            raise TypeError(f"compress_wrapper's hook takes a commlib.torch.hooks.State, not {type(state).__name__}")
        future = torch.futures.Future()
        job = functools.partial(_send_compressed, state, hook, compressor, bucket, future)
        worker = state.worker()
        if bucket.is_last():  # after every earlier bucket, and before DDP's own calls that follow its last hook
            worker.drain()
            job()
        else:
            worker.put(job)
        return future

    return compressed_hook


def _send_compressed(state: State, hook, compressor: Compressor, bucket, future) -> None:
    try:
        buffer = bucket.buffer()
        exchange = _HookExchange(state, hook, bucket.index())
        finishes = []
        dense = []
        for position, grad in enumerate(bucket.gradients()):
            if grad.dtype == torch.float32 and grad.device.type == "cpu" and grad.is_contiguous():
                # DDP rebuilds its buckets after the first step: the shape keeps a key to one parameter
                key = f"bucket{bucket.index()}.{position}:{tuple(grad.shape)}"
                finishes.append(compressor.start(key, as_array(grad), exchange))
            else:
                dense.append(grad)
        for grad in dense:  # other dtypes: averaged as they are
            exchange.wait(exchange.allreduce_tensor(grad))
        for finish in finishes:
            finish()
        buffer.div_(state.size)
        future.set_result(buffer)
    except Exception as exc:  # noqa: BLE001 - DDP raises it from the future
        future.set_exception(exc)


class _Bucket:
    """The part of DDP's GradBucket a hook uses, around one array of a compressor's message."""

    def __init__(self, tensor: torch.Tensor, index: int):
        self._tensor = tensor
        self._index = index

    def buffer(self):
        return self._tensor

    def set_buffer(self, tensor):
        self._tensor = tensor

    def index(self):
        return self._index

    def is_last(self):
        return False

    def gradients(self):
        return [self._tensor]


class _HookExchange(Exchange):
    """commlib's compressor interface over a hook: ``allreduce`` sums in place through ``hook``,
    ``allgather`` concatenates every rank's array through the group (every rank's message of one tensor has
    the same size: commlib's compressors decide it from the tensor's size, the ranks and the step)."""

    def __init__(self, state: State, hook, index: int):
        super().__init__(state.size, dist.get_rank(state.process_group), state.process_group)
        self._state = state
        self._hook = hook
        self._index = index

    def allreduce(self, array, name):
        return self.allreduce_tensor(torch.from_numpy(array), array)

    def allreduce_tensor(self, tensor: torch.Tensor, array=None):
        summed = self._hook(_SumState(self._state), _Bucket(tensor, self._index))
        return summed, tensor, array

    def allgather(self, array, name):
        mine = torch.from_numpy(array)
        every = torch.empty(self.size * mine.numel(), dtype=mine.dtype)
        work = dist.all_gather_into_tensor(every, mine, group=self._state.process_group, async_op=True)
        return work.get_future(), every, None

    def wait(self, handle):
        future, tensor, array = handle
        result = future.wait()
        result = result[0] if isinstance(result, list) else result
        if result.data_ptr() != tensor.data_ptr():  # a wrapped hook may hand back a new tensor
            tensor.copy_(result)
        return array if array is not None else tensor.numpy()


class _Worker(threading.Thread):
    """Sends compressed buckets one after the other (their calls named in the hooks' own scope)."""

    def __init__(self):
        super().__init__(name="commlib-torch-hooks", daemon=True)
        self._queue: queue.Queue = queue.Queue()
        self.start()

    def put(self, job) -> None:
        self._queue.put(job)

    def drain(self) -> None:
        """Wait until every job put so far has run."""
        self._queue.join()

    def run(self) -> None:
        with naming_scope("hook."):
            while True:
                job = self._queue.get()
                try:
                    job()
                finally:
                    self._queue.task_done()


def _size(state) -> int:
    return state.size if isinstance(state, (State, _SumState)) else dist.get_world_size(state)


def _average_scale(state) -> float:
    """What the widened sum is multiplied by: nothing when the wrapper's caller asked for the sum (it then
    gets the sum of values divided by the size before rounding: it multiplies back), else 1 (the values were
    divided already)."""
    return float(_size(state)) if getattr(state, "sum", False) else 1.0
