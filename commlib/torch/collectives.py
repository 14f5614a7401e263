"""The collectives on torch tensors: asynchronous and in-place forms, poll and synchronize.

Each function checks the tensor (:mod:`.tensors`), hands the numpy view of its memory to commlib, and
returns a :class:`Handle`. ``synchronize(handle)`` waits and returns torch tensors: for in-place forms the
very tensor that was passed in, for out-of-place forms a new tensor that shares memory with commlib's
result (no copy). Differentiable forms live in :mod:`.autograd`.

The synchronous forms (``allreduce_``, ``broadcast_`` and the ``*_now`` helpers the differentiable forms
use) call commlib's synchronous functions instead of waiting on a handle: the calling thread then drives
the collective itself, where an asynchronous submission would wake commlib's background thread and hand
the work over (measured: 6 small named allreduces took 1.26 ms that way, against 0.53 ms driven in place).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

import commlib as _cl

from ..compression import Compressor, WireCodec
from ..compression.collective import is_special
from ..ops import ReduceOp, as_op
from .tensors import NUMPY_DTYPES, as_array, as_tensor, check_tensor

Average = _cl.Average
Sum = _cl.Sum
Min = _cl.Min
Max = _cl.Max
Product = _cl.Product
Compression = _cl.Compression
HorovodInternalError = _cl.CollectiveError


class Handle:
    """An operation in flight. Pass it to :func:`poll` or :func:`synchronize`.

    It keeps the tensors involved alive until the operation finished, and turns commlib's numpy result
    into torch tensors once."""

    __slots__ = ("_inner", "_finish", "_tensors", "_done", "_result", "_error")

    def __init__(self, inner, finish, tensors):
        self._inner = inner
        self._finish = finish
        self._tensors = tensors
        self._done = False
        self._result = None
        self._error = None

    def wait(self):
        """Block until the operation finished; return its result as torch tensors (or raise its error,
        every time it is asked)."""
        if not self._done:
            try:
                self._result = self._finish(_cl.synchronize(self._inner))
            except BaseException as exc:
                self._error = exc
            self._done = True
            self._tensors = None
        if self._error is not None:
            raise self._error
        return self._result


def resolve_op(op, average=None) -> ReduceOp:
    """Horovod's rule: ``op`` wins; the deprecated ``average`` flag maps to Average/Sum; default Average."""
    if average is not None:
        if op is not None:
            raise ValueError("pass either op or the deprecated average flag, not both")
        warnings.warn("the average argument is deprecated; use op=Average or op=Sum", DeprecationWarning,
                      stacklevel=3)
        return Average if average else Sum
    return Average if op is None else as_op(op)


def _same(tensor):
    return lambda _result: tensor


def _new(result):
    return as_tensor(result)


def poll(handle: Handle) -> bool:
    """True when the operation behind ``handle`` finished (``synchronize`` will then not block)."""
    if handle._done:
        return True
    return bool(_cl.poll(handle._inner))


def synchronize(handle: Handle):
    """Wait for ``handle``'s operation and return its result.

    Raises :class:`HorovodInternalError` if the collective failed (for instance ranks submitted the same
    name with different shapes)."""
    if not isinstance(handle, Handle):
        raise TypeError(f"synchronize() takes a handle returned by an *_async function, not {type(handle).__name__}")
    return handle.wait()


# --- allreduce ------------------------------------------------------------------------------------------

def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    compression=Compression.none) -> Handle:
    """Start reducing ``tensor`` over all ranks into a new tensor; ``tensor`` is not modified.

    Ranks submitting the same ``name`` must pass the same shape, dtype and op. ``compression``
    (``Compression.fp16``/``.bf16``) sends float32 data in half precision and accumulates in float32.
    """
    op = resolve_op(op, average)
    if _horovod_style(compression):
        return _horovod_compressed(tensor, False, compression, name, op, prescale_factor, postscale_factor)
    array = as_array(tensor, name, "allreduce")
    inner = _cl.allreduce_async(array, op=op, name=name, prescale_factor=prescale_factor,
                                postscale_factor=postscale_factor, compression=compression)
    return Handle(inner, _new, tensor)


def _horovod_style(compression) -> bool:
    """A user's compressor with Horovod's torch ``compress``/``decompress`` (not fp16/bf16, which keep
    float32 accumulation, nor commlib's lossy compressors, which work on the numpy view)."""
    return is_special(compression) and not isinstance(compression, Compressor)


def _horovod_compressed(tensor, inplace, compression, name, op, prescale_factor, postscale_factor) -> Handle:
    """Horovod's order: ``compress`` the torch tensor, allreduce what it returns, ``decompress`` the
    result (and copy it into ``tensor`` for in-place calls)."""
    check_tensor(tensor, name, "allreduce")
    compressed, ctx = compression.compress(tensor)
    inner = _cl.allreduce_async(as_array(compressed.contiguous(), name, "allreduce"), op=op, name=name,
                                prescale_factor=prescale_factor, postscale_factor=postscale_factor)

    def finish(result):
        out = compression.decompress(as_tensor(result), ctx)
        return tensor.copy_(out) if inplace else out

    return Handle(inner, finish, (tensor, compressed))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     compression=Compression.none) -> Handle:
    """Start reducing ``tensor`` over all ranks in place; ``synchronize`` returns ``tensor``."""
    op = resolve_op(op, average)
    if _horovod_style(compression):
        return _horovod_compressed(tensor, True, compression, name, op, prescale_factor, postscale_factor)
    array = as_array(tensor, name, "allreduce")
    inner = _cl.allreduce_async_(array, op=op, name=name, prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor, compression=compression)
    return Handle(inner, _same(tensor), tensor)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               compression=Compression.none):
    """Reduce ``tensor`` over all ranks in place and return it."""
    op = resolve_op(op, average)
    if _horovod_style(compression):
        return synchronize(_horovod_compressed(tensor, True, compression, name, op, prescale_factor,
                                               postscale_factor))
    _cl.allreduce_(as_array(tensor, name, "allreduce"), op=op, name=name, prescale_factor=prescale_factor,
                   postscale_factor=postscale_factor, compression=compression)
    return tensor


def allreduce_now(tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                  compression=Compression.none):
    """Reduce ``tensor`` over all ranks into a new tensor, synchronously (``tensor`` is unchanged)."""
    if _horovod_style(compression):
        return synchronize(_horovod_compressed(tensor, False, compression, name, op, prescale_factor,
                                               postscale_factor))
    result = _cl.allreduce(as_array(tensor, name, "allreduce"), op=op, name=name,
                           prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                           compression=compression)
    return as_tensor(result)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, compression=Compression.none) -> Handle:
    """Start reducing a list of tensors as one operation (one negotiation, fused); inputs unchanged."""
    op = resolve_op(op, average)
    tensors = list(tensors)
    if _horovod_style(compression):
        return _grouped_horovod(tensors, False, compression, name, op, prescale_factor, postscale_factor)
    arrays = [as_array(t, name, f"grouped_allreduce (tensor {i})") for i, t in enumerate(tensors)]
    inner = _cl.grouped_allreduce_async(arrays, op=op, name=name, prescale_factor=prescale_factor,
                                        postscale_factor=postscale_factor, compression=compression)
    return Handle(inner, lambda results: [as_tensor(r) for r in results], tensors)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, compression=Compression.none) -> Handle:
    """Start reducing a list of tensors in place as one operation; ``synchronize`` returns the list."""
    op = resolve_op(op, average)
    tensors = list(tensors)
    if _horovod_style(compression):
        return _grouped_horovod(tensors, True, compression, name, op, prescale_factor, postscale_factor)
    arrays = [as_array(t, name, f"grouped_allreduce (tensor {i})") for i, t in enumerate(tensors)]
    inner = _cl.grouped_allreduce_async_(arrays, op=op, name=name, prescale_factor=prescale_factor,
                                         postscale_factor=postscale_factor, compression=compression)
    return Handle(inner, lambda _results: tensors, tensors)


def _grouped_horovod(tensors, inplace, compression, name, op, prescale_factor, postscale_factor) -> Handle:
    """A grouped allreduce with a Horovod-style compressor: each tensor compressed, the group reduced as
    one operation, each result decompressed."""
    for i, t in enumerate(tensors):
        check_tensor(t, name, f"grouped_allreduce (tensor {i})")
    pairs = [compression.compress(t) for t in tensors]
    arrays = [as_array(c.contiguous(), name, f"grouped_allreduce (tensor {i})") for i, (c, _) in enumerate(pairs)]
    inner = _cl.grouped_allreduce_async(arrays, op=op, name=name, prescale_factor=prescale_factor,
                                        postscale_factor=postscale_factor)

    def finish(results):
        outs = [compression.decompress(as_tensor(r), ctx) for r, (_, ctx) in zip(results, pairs)]
        return [t.copy_(o) for t, o in zip(tensors, outs)] if inplace else outs

    return Handle(inner, finish, (tensors, pairs))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       compression=Compression.none):
    """Reduce a list of tensors in place as one operation and return the list."""
    op = resolve_op(op, average)
    return synchronize(grouped_allreduce_async_(tensors, name=name, op=op, prescale_factor=prescale_factor,
                                                postscale_factor=postscale_factor, compression=compression))


# --- allgather, broadcast -------------------------------------------------------------------------------

def _allgather_array(tensor, name) -> np.ndarray:
    array = as_array(tensor, name, "allgather")
    if array.ndim == 0:
        raise ValueError(f"allgather of tensor {name!r}: it concatenates along the first dimension, but the "
                         "tensor is a scalar; pass tensor.reshape(1)")
    return array


def allgather_async(tensor, name=None) -> Handle:
    """Start concatenating every rank's ``tensor`` along the first dimension (which may differ by rank)."""
    return Handle(_cl.allgather_async(_allgather_array(tensor, name), name=name), _new, tensor)


def allgather_now(tensor, name=None):
    """Concatenate every rank's ``tensor`` along the first dimension, synchronously; a new tensor."""
    return as_tensor(_cl.allgather(_allgather_array(tensor, name), name=name))


def broadcast_async(tensor, root_rank, name=None) -> Handle:
    """Start copying ``root_rank``'s ``tensor`` into a new tensor on every rank; ``tensor`` is unchanged."""
    array = as_array(tensor, name, "broadcast")
    return Handle(_cl.broadcast_async(array, root_rank, name=name), _new, tensor)


def broadcast_async_(tensor, root_rank, name=None) -> Handle:
    """Start overwriting ``tensor`` with ``root_rank``'s on every rank; ``synchronize`` returns ``tensor``."""
    array = as_array(tensor, name, "broadcast")
    return Handle(_cl.broadcast_async_(array, root_rank, name=name), _same(tensor), tensor)


def broadcast_(tensor, root_rank, name=None):
    """Overwrite ``tensor`` with ``root_rank``'s on every rank and return it."""
    _cl.broadcast_(as_array(tensor, name, "broadcast"), root_rank, name=name)
    return tensor


def broadcast_now(tensor, root_rank, name=None):
    """``root_rank``'s ``tensor`` on every rank, synchronously, as a new tensor (``tensor`` unchanged)."""
    return as_tensor(_cl.broadcast(as_array(tensor, name, "broadcast"), root_rank, name=name))


# --- reducescatter, alltoall ----------------------------------------------------------------------------

def reducescatter_async(tensor, name=None, compression=Compression.none, op=Average, prescale_factor=1.0,
                        postscale_factor=1.0) -> Handle:
    """Start reducing ``tensor`` over all ranks and keep this rank's block of the first dimension.

    ``compression`` casts float32 to the codec's half type for the collective and back (as Horovod's
    compressors do); ``prescale_factor`` multiplies a copy of the input, ``postscale_factor`` the output.
    """
    op = as_op(op)
    check_tensor(tensor, name, "reducescatter")
    if tensor.dim() == 0:
        raise ValueError(f"reducescatter of tensor {name!r}: it splits the first dimension, but the tensor is "
                         "a scalar; pass tensor.reshape(1)")
    sent = tensor
    if isinstance(compression, WireCodec) and tensor.dtype is torch.float32:
        sent = tensor.to(_torch_dtype(compression.wire_dtype))
    if prescale_factor != 1.0:
        sent = sent * prescale_factor
    original_dtype = tensor.dtype

    def finish(result):
        out = as_tensor(result)
        if out.dtype is not original_dtype:
            out = out.to(original_dtype)
        if postscale_factor != 1.0:
            out.mul_(postscale_factor)
        return out

    return Handle(_cl.reducescatter_async(as_array(sent, name, "reducescatter"), op=op, name=name), finish,
                  (tensor, sent))


def _torch_dtype(numpy_dtype) -> torch.dtype:
    for torch_dtype, np_dtype in NUMPY_DTYPES.items():
        if np_dtype == np.dtype(numpy_dtype):
            return torch_dtype
    raise TypeError(f"no torch dtype for {numpy_dtype}")


def alltoall_async(tensor, splits=None, name=None) -> Handle:
    """Start sending block ``i`` of ``tensor``'s first dimension to rank ``i``.

    ``splits`` (list, numpy array or int tensor, one entry per rank) gives the block sizes; by default
    the first dimension is split evenly. ``synchronize`` returns ``(output, received_splits)`` where
    ``received_splits`` is an int32 tensor of how many rows came from each rank."""
    array = as_array(tensor, name, "alltoall")
    if array.ndim == 0:
        raise ValueError(f"alltoall of tensor {name!r}: it splits the first dimension, but the tensor is a "
                         "scalar; pass tensor.reshape(1)")
    if splits is not None:
        if isinstance(splits, torch.Tensor):
            splits = splits.detach().cpu().numpy()
        splits = np.ascontiguousarray(np.asarray(splits, dtype=np.int64).reshape(-1))

    def finish(result):
        output, received = result
        return as_tensor(output), torch.from_numpy(np.ascontiguousarray(received, dtype=np.int32))

    return Handle(_cl.alltoall_async(array, splits=splits, name=name), finish, tensor)


# --- synchronization points -----------------------------------------------------------------------------

def barrier() -> None:
    """Block until every rank reached this call."""
    _cl.barrier()


def join(device=-1) -> int:
    """Tell the other ranks this rank has no more data; block until all joined. Returns the last rank to
    join. ``device`` is accepted for Horovod compatibility and must be -1 (CPU)."""
    if device != -1:
        raise ValueError(f"join(device={device}): commlib.torch has no GPU backend; use the default device=-1")
    return int(_cl.join())
