"""commlib's public functions, named as in horovod.torch.

Every collective is asynchronous underneath: ``*_async`` submits and returns a handle; the plain names
submit and wait. Functions ending in ``_`` work in place. All of them act on the runtime that ``init()``
created; that runtime is the library's only state (see :mod:`commlib.runtime`).
"""

from __future__ import annotations

import pickle
from typing import Any, Sequence

import numpy as np

from .compression import Compression, WireCodec, codec_for
from .compression import collective as _compressed
from .config import _algorithm
from .coordinator.requests import Entry, Handle, Kind, Meta
from .dtypes import REDUCIBLE, check_contiguous, check_reducible, check_writable, dtype_name
from .errors import CommlibError
from .ops import Average, ReduceOp, Sum, as_op
from .runtime import Runtime


class _Session:
    """Holds the runtime between init() and shutdown(); the single place commlib keeps state."""

    runtime: Runtime | None = None


_session = _Session()


def _rt() -> Runtime:
    runtime = _session.runtime
    if runtime is None:
        raise CommlibError("commlib is not initialized; call commlib.init() first")
    return runtime


# ---- lifecycle and topology ---------------------------------------------------------------------------

def init(comm=None, **settings) -> None:
    """Start commlib on ``comm`` (default MPI.COMM_WORLD). ``settings`` override ``COMMLIB_*`` variables
    (e.g. ``algorithm="ring"``, ``num_streams=2``; see docs/configuration.md). Calling it again while
    initialized does nothing; after ``shutdown()`` it starts afresh."""
    if _session.runtime is None:
        _session.runtime = Runtime(comm, **settings)


def shutdown() -> None:
    """Stop commlib: pending operations fail with a clear error; ``init()`` may be called again."""
    runtime, _session.runtime = _session.runtime, None
    if runtime is not None:
        runtime.close()


def is_initialized() -> bool:
    return _session.runtime is not None


def rank() -> int:
    return _rt().rank


def size() -> int:
    return _rt().size


def local_rank() -> int:
    return _rt().topology.local_rank


def local_size() -> int:
    return _rt().topology.local_size


def cross_rank() -> int:
    return _rt().topology.cross_rank


def cross_size() -> int:
    return _rt().topology.cross_size


def mpi_threads_supported() -> bool:
    """Whether MPI runs with MPI_THREAD_MULTIPLE (other threads may call MPI while commlib runs)."""
    from mpi4py import MPI

    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def start_timeline(path: str) -> None:
    """Start writing a Chrome-trace timeline to ``path`` (one file per rank: ``name.rankN.json``)."""
    _rt().start_timeline(path)


def stop_timeline() -> None:
    _rt().stop_timeline()


# ---- building requests ---------------------------------------------------------------------------------

def _validated(check, *args) -> str:
    """Run a validation; return its message instead of raising, so that the tensor fails on every rank
    rather than leave the others waiting."""
    try:
        check(*args)
    except (CommlibError, TypeError, ValueError) as exc:
        return str(exc)
    return ""


def _submit(runtime: Runtime, meta: Meta, array, output, splits=None, wait: bool = False) -> Handle:
    """Queue the request; with ``wait``, also drive it to completion in this thread."""
    entry = Entry(meta, array, output, Handle(meta.name), splits)
    if wait:
        return runtime.coordinator.run(entry)
    return runtime.coordinator.submit(entry)


def _in_place(tensor, name: str, operation: str) -> np.ndarray:
    """The array an in-place call writes into; only a numpy array will do."""
    if not isinstance(tensor, np.ndarray):
        raise TypeError(f"{name}: {operation}_ works in place on a numpy array, not {type(tensor).__name__}")
    return tensor


_PLAIN_DTYPES = frozenset(REDUCIBLE)


def _plain_allreduce_meta(runtime: Runtime, name: str, output: np.ndarray, op, prescale: float,
                          postscale: float) -> Meta | None:
    """The request's metadata when nothing about it needs checking beyond a few flags (a ReduceOp, no
    compression or forced algorithm, a writable C-contiguous array of a reducible dtype), looked up in
    ``runtime.metas``; else None (the caller validates in full). A training loop's repeated calls take
    this path: building and comparing a fresh Meta each time costs more than the rest of a small call."""
    dtype = output.dtype
    if type(op) is not ReduceOp or dtype not in _PLAIN_DTYPES:
        return None
    flags = output.flags
    if not (flags.c_contiguous and flags.writeable):
        return None
    key = (name, dtype, output.shape, op, prescale, postscale)
    meta = runtime.metas.get(key)
    if meta is None:
        if dtype.kind in "iu" and (op is Average or prescale != 1.0 or postscale != 1.0):
            return None  # an error: the full path explains it
        meta = runtime.metas.put(key, Meta(name, Kind.ALLREDUCE, dtype_name(dtype), tuple(output.shape),
                                           int(op), prescale=float(prescale), postscale=float(postscale)))
    return meta


def _allreduce_handle(tensor, inplace: bool, op, name, prescale_factor, postscale_factor, algorithm,
                      compression, wait: bool) -> Handle:
    runtime = _rt()
    name = name or runtime.auto_name("allreduce")
    if inplace:
        array = output = tensor if isinstance(tensor, np.ndarray) else _in_place(tensor, name, "allreduce")
    else:
        array = np.asarray(tensor)
        output = np.array(array, copy=True, order="C")
    if compression is Compression.none:
        compression = None
    if compression is None and algorithm is None:
        meta = _plain_allreduce_meta(runtime, name, output, op, prescale_factor, postscale_factor)
        if meta is not None:
            return _submit(runtime, meta, array, output, wait=wait)
    errors = []
    try:
        op = as_op(op)
    except ValueError as exc:
        errors.append(str(exc))
        op = Sum
    errors.append(_validated(check_contiguous, output, name))
    errors.append(_validated(check_writable, output, name))
    errors.append(_validated(check_reducible, output, op, name))
    if _compressed.is_special(compression):  # lossy or Horovod-style: see commlib/compression/collective.py
        errors.append(_compressed.check(compression, output, op, algorithm, name))
        if not any(errors):
            handle = _compressed.allreduce(compression, runtime.size, runtime.rank, array, output, inplace, op,
                                           name, prescale_factor, postscale_factor)
            if wait:
                runtime.coordinator.wait(handle)
            return handle
        compression = None  # the error travels under ``name``, where the other ranks' first collective is
    errors.append(_validated(codec_for, compression, output.dtype, name))
    if algorithm is not None:
        errors.append(_validated(_algorithm, algorithm))
    if (prescale_factor != 1.0 or postscale_factor != 1.0) and output.dtype.kind in "iub":
        errors.append(f"{name}: prescale_factor/postscale_factor need a floating dtype, not {output.dtype}")
    if compression is not None and not isinstance(compression, WireCodec):
        compression = None
    meta = Meta(name, Kind.ALLREDUCE, dtype_name(output.dtype), tuple(output.shape), int(op),
                prescale=float(prescale_factor), postscale=float(postscale_factor),
                compression=compression.name if compression is not None else "none",
                algorithm=(algorithm or "").lower() if not any(errors) else "",
                error="; ".join(e for e in errors if e))
    return _submit(runtime, meta, array, output, wait=wait)


# ---- allreduce -----------------------------------------------------------------------------------------

def allreduce_async(tensor, op=Average, name: str | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, algorithm: str | None = None,
                    compression: WireCodec | None = Compression.none) -> Handle:
    """Start reducing ``tensor`` across ranks into a new array; ``synchronize`` returns it.

    ``op``: Sum, Average (default), Min, Max, Product. ``prescale_factor``/``postscale_factor`` multiply
    before/after the reduction. ``algorithm`` forces one (see docs/algorithms.md). ``compression``
    (Compression.fp16 / .bf16) sends float32 in half precision and accumulates in float32; a lossy
    compressor (Compression.topk(0.01), .dgc(), .powersgd(), ...; Sum/Average only, state kept per
    ``name``) or an object with Horovod's compress/decompress runs as docs/compression.md describes."""
    return _allreduce_handle(tensor, False, op, name, prescale_factor, postscale_factor, algorithm,
                             compression, wait=False)


def allreduce_async_(tensor: np.ndarray, op=Average, name: str | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0, algorithm: str | None = None,
                     compression: WireCodec | None = Compression.none) -> Handle:
    """In-place version of :func:`allreduce_async`."""
    return _allreduce_handle(tensor, True, op, name, prescale_factor, postscale_factor, algorithm,
                             compression, wait=False)


def allreduce(tensor, op=Average, name: str | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, algorithm: str | None = None,
              compression: WireCodec | None = Compression.none) -> np.ndarray:
    """Reduce ``tensor`` across ranks; returns a new array.

    Example::

        import commlib as cl, numpy as np
        cl.init()
        mean = cl.allreduce(np.full(4, cl.rank(), np.float32))   # every rank: the mean of the ranks
    """
    return synchronize(_allreduce_handle(tensor, False, op, name, prescale_factor, postscale_factor,
                                         algorithm, compression, wait=True))


def allreduce_(tensor: np.ndarray, op=Average, name: str | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, algorithm: str | None = None,
               compression: WireCodec | None = Compression.none) -> np.ndarray:
    """Reduce ``tensor`` across ranks in place; returns it."""
    return synchronize(_allreduce_handle(tensor, True, op, name, prescale_factor, postscale_factor,
                                         algorithm, compression, wait=True))


def _grouped(tensors: Sequence, inplace: bool, name, kwargs) -> Handle:
    runtime = _rt()
    base = name or runtime.auto_name("grouped_allreduce")
    parts = [_allreduce_handle(t, inplace, name=f"{base}.{i}", wait=False, **kwargs)
             for i, t in enumerate(tensors)]
    return Handle(base, parts=parts)


def grouped_allreduce_async(tensors: Sequence, op=Average, name: str | None = None, prescale_factor=1.0,
                            postscale_factor=1.0, algorithm=None, compression=Compression.none) -> Handle:
    """Start allreducing a list of tensors together; ``synchronize`` returns the list of results."""
    return _grouped(tensors, False, name, dict(op=op, prescale_factor=prescale_factor,
                                               postscale_factor=postscale_factor, algorithm=algorithm,
                                               compression=compression))


def grouped_allreduce_async_(tensors: Sequence, op=Average, name: str | None = None, prescale_factor=1.0,
                             postscale_factor=1.0, algorithm=None, compression=Compression.none) -> Handle:
    """In-place version of :func:`grouped_allreduce_async`."""
    return _grouped(tensors, True, name, dict(op=op, prescale_factor=prescale_factor,
                                              postscale_factor=postscale_factor, algorithm=algorithm,
                                              compression=compression))


def grouped_allreduce(tensors: Sequence, **kwargs) -> list:
    return synchronize(grouped_allreduce_async(tensors, **kwargs))


def grouped_allreduce_(tensors: Sequence, **kwargs) -> list:
    return synchronize(grouped_allreduce_async_(tensors, **kwargs))


# ---- other collectives -----------------------------------------------------------------------------------

def _plain_handle(kind: Kind, operation: str, tensor, name, inplace=False, op=Sum, root=-1,
                  splits=None, wait=False) -> Handle:
    runtime = _rt()
    name = name or runtime.auto_name(operation)
    if inplace:
        array = output = _in_place(tensor, name, operation)
    else:
        array = np.ascontiguousarray(tensor)
        output = np.array(array, copy=True) if kind is Kind.BROADCAST else None
    errors = [_validated(check_contiguous, array, name)]
    if inplace:
        errors.append(_validated(check_writable, array, name))
    if array.ndim == 0 and kind in (Kind.ALLGATHER, Kind.REDUCESCATTER, Kind.ALLTOALL):
        errors.append(f"{name}: {operation} needs at least one dimension, got a scalar")
    if kind is Kind.REDUCESCATTER:
        try:
            op = as_op(op)
            errors.append(_validated(check_reducible, array, op, name))
        except ValueError as exc:
            errors.append(str(exc))
            op = Sum
    if kind is Kind.BROADCAST and not 0 <= root < runtime.size:
        errors.append(f"{name}: root_rank {root} is not a rank (0..{runtime.size - 1})")
    if splits is not None:
        splits = np.asarray(splits, dtype=np.int64).reshape(-1)
        if splits.size != runtime.size or (splits < 0).any() or (array.ndim and splits.sum() != array.shape[0]):
            errors.append(f"{name}: splits {splits.tolist()} must have one non-negative entry per rank "
                          f"({runtime.size}) summing to the first dimension {array.shape[:1]}")
    elif kind is Kind.ALLTOALL and array.ndim and array.shape[0] % runtime.size:
        errors.append(f"{name}: alltoall without splits needs the first dimension ({array.shape[0]}) to be "
                      f"divisible by the number of ranks ({runtime.size}); pass splits=")
    meta = Meta(name, kind, dtype_name(array.dtype), tuple(array.shape), int(op), root=root,
                error="; ".join(e for e in errors if e))
    return _submit(runtime, meta, array, output, splits, wait=wait)


def allgather_async(tensor, name: str | None = None) -> Handle:
    """Start concatenating every rank's ``tensor`` along the first dimension (which may differ)."""
    return _plain_handle(Kind.ALLGATHER, "allgather", tensor, name)


def allgather(tensor, name: str | None = None) -> np.ndarray:
    return synchronize(_plain_handle(Kind.ALLGATHER, "allgather", tensor, name, wait=True))


def broadcast_async(tensor, root_rank: int, name: str | None = None) -> Handle:
    """Start copying ``root_rank``'s ``tensor`` to every rank, into a new array."""
    return _plain_handle(Kind.BROADCAST, "broadcast", tensor, name, root=int(root_rank))


def broadcast_async_(tensor: np.ndarray, root_rank: int, name: str | None = None) -> Handle:
    return _plain_handle(Kind.BROADCAST, "broadcast", tensor, name, inplace=True, root=int(root_rank))


def broadcast(tensor, root_rank: int, name: str | None = None) -> np.ndarray:
    return synchronize(_plain_handle(Kind.BROADCAST, "broadcast", tensor, name, root=int(root_rank), wait=True))


def broadcast_(tensor: np.ndarray, root_rank: int, name: str | None = None) -> np.ndarray:
    return synchronize(_plain_handle(Kind.BROADCAST, "broadcast", tensor, name, inplace=True,
                                     root=int(root_rank), wait=True))


def reducescatter_async(tensor, op=Average, name: str | None = None) -> Handle:
    """Start reducing ``tensor`` and giving each rank its block of the first dimension (earlier ranks
    take the extra rows)."""
    return _plain_handle(Kind.REDUCESCATTER, "reducescatter", tensor, name, op=op)


def reducescatter(tensor, op=Average, name: str | None = None) -> np.ndarray:
    return synchronize(_plain_handle(Kind.REDUCESCATTER, "reducescatter", tensor, name, op=op, wait=True))


def alltoall_async(tensor, splits=None, name: str | None = None) -> Handle:
    """Start sending ``splits[i]`` rows of ``tensor`` to rank i (equal parts by default);
    ``synchronize`` returns ``(output, received_splits)``."""
    return _plain_handle(Kind.ALLTOALL, "alltoall", tensor, name, splits=splits)


def alltoall(tensor, splits=None, name: str | None = None):
    return synchronize(_plain_handle(Kind.ALLTOALL, "alltoall", tensor, name, splits=splits, wait=True))


def barrier() -> None:
    """Wait until every rank has reached the barrier."""
    synchronize(_plain_handle(Kind.BARRIER, "barrier", np.zeros(0, np.uint8), None, wait=True))


def join() -> int:
    """Declare that this rank has run out of data. Until every rank has joined, its allreduces contribute
    zeros to the others'. Returns the last rank to join."""
    runtime = _rt()
    meta = Meta("__join__", Kind.JOIN, "uint8", ())
    return synchronize(_submit(runtime, meta, None, None, wait=True))


def poll(handle: Handle) -> bool:
    """True when the operation behind ``handle`` has finished (``synchronize`` will not block)."""
    return handle.done()


def synchronize(handle: Handle) -> Any:
    """Wait for ``handle`` and return its result; raises :class:`CollectiveError` if it failed."""
    if not handle.done():
        _rt().coordinator.wait(handle)
    return handle.result()


# ---- Python objects ------------------------------------------------------------------------------------

def broadcast_object(obj: Any = None, root_rank: int = 0, name: str | None = None) -> Any:
    """Broadcast a picklable object from ``root_rank``; every rank returns it."""
    runtime = _rt()
    name = name or runtime.auto_name("broadcast_object")
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if runtime.rank == root_rank else None
    length = broadcast_(np.array([0 if payload is None else payload.size], np.int64), root_rank,
                        name=f"{name}.length")
    data = payload.copy() if payload is not None else np.empty(int(length[0]), np.uint8)
    broadcast_(data, root_rank, name=f"{name}.data")
    return pickle.loads(data.tobytes())


def allgather_object(obj: Any, name: str | None = None) -> list:
    """Gather a picklable object from every rank; returns the list in rank order."""
    runtime = _rt()
    name = name or runtime.auto_name("allgather_object")
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    lengths = allgather(np.array([payload.size], np.int64), name=f"{name}.lengths")
    data = allgather(payload, name=f"{name}.data")
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [pickle.loads(data[bounds[i]:bounds[i + 1]].tobytes()) for i in range(len(lengths))]
