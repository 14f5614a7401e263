"""commlib's public functions, named as in horovod.torch.

Every collective is asynchronous underneath: ``*_async`` submits and returns a handle; the plain names
submit and wait. Functions ending in ``_`` work in place. All of them act on the runtime that ``init()``
created; that runtime is the library's only state (see :mod:`commlib.runtime`).
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import pickle
import sys
import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from . import device
from .compression import Compression, Compressor, Encoder, Exchange, WireCodec, codec_for
from .compression import collective as _compressed
from .coordinator.requests import Entry, Handle, Kind, Meta
from . import validation
from .dtypes import BY_NUMPY, dtype_name
from .errors import CommlibError
from .ops import Average, ReduceOp, Sum, as_op
from .process_sets import ProcessSet, _GlobalProcessSet, check_process_set

if TYPE_CHECKING:  # runtime.py imports MPI: init() imports it, so that `import commlib` does not
    from .process_sets import Member
    from .runtime import Runtime
    from .server.discovery import Job

log = logging.getLogger("commlib")


class _State:
    """Holds the runtime between init() and shutdown(); the single place commlib keeps state."""

    runtime: Runtime | None = None
    lost = None   # the PeerLostError a runtime of this process met: MPI must not be finalized
    settings: dict | None = None  # init()'s settings, for a runtime rebuilt over survivors (commlib.elastic)

    def __init__(self):
        #: the job's layout (workers and summation servers) by user communicator, for the life of the
        #: process: found by the first runtime on it, reused by the next (the servers take part once)
        self.layouts: dict[int, Job] = {}


_state = _State()


def _rt() -> "Runtime":
    runtime = _state.runtime
    if runtime is None:
        raise CommlibError("commlib is not initialized; call commlib.init() first")
    return runtime


#: The world as a process set (id 0): always registered while commlib is initialized.
global_process_set = _GlobalProcessSet(lambda: _state.runtime.sets if _state.runtime is not None else None)


# ---- lifecycle and topology ---------------------------------------------------------------------------

def init(comm=None, process_sets: Sequence[ProcessSet] | None = None, **settings) -> None:
    """Start commlib on ``comm`` (default MPI.COMM_WORLD); this initializes MPI (mpi4py) if needed.
    ``process_sets``: sets to register at once (as ``add_process_set`` each, in order). ``settings``
    override ``COMMLIB_*`` variables (e.g. ``algorithm="ring"``, ``num_streams=2``; see
    docs/configuration.md). Calling it again while initialized does nothing; after ``shutdown()`` it
    starts afresh.

    ``timeout`` (seconds, or a ``datetime.timedelta`` as torch.distributed takes; ``COMMLIB_TIMEOUT``,
    default 10 minutes) bounds every wait for a peer: past it the call raises ``PeerLostError`` naming the
    peers (docs/failures.md).

    Until ``shutdown()``, an exit hook runs the shutdown path if the process exits without it, so that the
    other ranks learn at once that this rank left (their pending and later operations fail, naming it)."""
    if _state.runtime is not None:
        return
    from .runtime import Runtime

    if "timeout" in settings:
        timeout = settings.pop("timeout")
        settings["timeout_s"] = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    _state.runtime = Runtime(comm, layouts=_state.layouts, **settings)
    _state.settings = dict(settings)
    atexit.register(_leave)
    for process_set in process_sets or ():
        add_process_set(process_set)


def shutdown() -> None:
    """Stop commlib: pending operations fail with a clear error; ``init()`` may be called again."""
    runtime, _state.runtime = _state.runtime, None
    atexit.unregister(_leave)
    if runtime is not None:
        try:
            runtime.close()
        finally:
            _after_loss(runtime)


def _leave() -> None:
    """The exit hook: the process exits without ``shutdown()``. Tell the other ranks, without waiting for
    them (they may be waiting for this rank in their next collective)."""
    runtime, _state.runtime = _state.runtime, None
    if runtime is None:
        return
    try:
        runtime.close(leaving=True)
    except Exception as exc:  # exiting anyway: say why the others may not have been told
        log.warning("commlib: could not tell the other ranks that rank %d is exiting: %r", runtime.rank, exc)
    _after_loss(runtime)
    if _state.lost is not None:
        _exit_after_loss()


#: The exit status of a process that lost a peer (the launcher then ends the rest of the job).
LOST_PEER_EXIT_STATUS = 1


def _after_loss(runtime) -> None:
    """After a runtime that lost a peer: the process must not finalize MPI (MPI_Finalize, and freeing
    what the lost peers still hold, would wait for them), so it ends without it at exit."""
    lost = runtime.lost
    if lost is not None and _state.lost is None:
        _state.lost = lost
        atexit.register(_exit_after_loss)


#: How long the exit path waits before aborting the job, so that the other live ranks, which reach their
#: own verdict within moments (or at once through this rank's notice), can report it before the launcher
#: stops them.
ABORT_GRACE_S = 1.0


def _exit_after_loss() -> None:
    """At exit after a lost peer: end the job with ``MPI_Abort(MPI_COMM_WORLD, 1)`` instead of reaching
    mpi4py's MPI_Finalize (which would wait for the lost peers). The launcher ends every other rank it
    can reach and exits (measured with hydra: a plain exit(1) left mpiexec waiting for the proxy behind
    the cut link; MPI_Abort ended it at once). Other exit handlers registered before ``init()`` do not
    run."""
    log.error("commlib: ending the job (MPI_Abort, status %d) after a lost peer: %s",
              LOST_PEER_EXIT_STATUS, _state.lost)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream: nothing more to say
            pass
    time.sleep(ABORT_GRACE_S)
    try:
        from mpi4py import MPI

        from .transport.deadline import unlink_mapped_shared_memory

        if MPI.Is_initialized() and not MPI.Is_finalized():
            unlink_mapped_shared_memory()  # MPI_Abort leaves MPICH's node segments in /dev/shm
            MPI.COMM_WORLD.Abort(LOST_PEER_EXIT_STATUS)
    finally:
        os._exit(LOST_PEER_EXIT_STATUS)


def is_initialized() -> bool:
    return _state.runtime is not None


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


# ---- process sets --------------------------------------------------------------------------------------

def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set (a ProcessSet or a list of world ranks) and return it, with its
    ``process_set_id``. Collective: every rank calls it, with the same ranks, in the same order. Raises
    a ValueError (:class:`ProcessSetError`) for a set already registered or ranks that differ between
    ranks."""
    return _rt().add_process_set(process_set)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` (every rank calls it); its pending operations fail. False for the
    global set or a set that is not registered."""
    return _rt().sets.remove(check_process_set(process_set, "remove_process_set"))


def start_timeline(path: str, mark_cycles: bool | None = None) -> None:
    """Start writing a Chrome-trace timeline with Horovod's activity names to ``path`` (one file per rank:
    rank 0 writes ``path``, rank r > 0 ``name.rankR.json``). ``mark_cycles``: mark each coordinator cycle
    that did something with ``CYCLE_START`` (default: ``COMMLIB_TIMELINE_MARK_CYCLES``)."""
    _rt().start_timeline(validation.check_path(path, "path", "start_timeline"), mark_cycles)


def stop_timeline() -> None:
    _rt().stop_timeline()


# ---- building requests ---------------------------------------------------------------------------------

def _submit(member: "Member", meta: Meta, array, output, splits=None, wait: bool = False) -> Handle:
    """Queue the request with the set's coordinator; with ``wait``, also drive it to completion here."""
    entry = Entry(meta, array, output, Handle(meta.name), splits)
    if wait:
        return member.coordinator.run(entry)
    return member.coordinator.submit(entry)


def _member_and_name(process_set, name, operation: str) -> tuple["Runtime", "Member", str]:
    name = validation.check_name(name, operation)
    runtime = _rt()
    member = runtime.sets.member(process_set, name or operation)
    return runtime, member, name or member.auto_name(operation)


def _op(op) -> tuple[ReduceOp, str]:
    """The ReduceOp, and '' or why ``op`` is none (then Sum, so that the request can still be sent)."""
    try:
        return as_op(op), ""
    except ValueError as exc:
        return Sum, str(exc)


def _in_place(tensor, name: str, operation: str) -> np.ndarray:
    """The array an in-place call writes into; only a numpy array will do."""
    if not isinstance(tensor, np.ndarray):
        raise TypeError(f"{name}: {operation}_ works in place on a numpy array, not {type(tensor).__name__}")
    return tensor


_PLAIN_DTYPES = frozenset(row.numpy for row in BY_NUMPY.values() if row.kind != "bool")


def _plain_allreduce_meta(runtime: "Runtime", name: str, output: np.ndarray, op, prescale: float,
                          postscale: float, priority: int = 0) -> Meta | None:
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
    key = (name, dtype, output.shape, op, prescale, postscale, priority)
    meta = runtime.metas.get(key)
    if meta is None:  # (bool, which may not take every op or factor, is not a plain dtype)
        meta = runtime.metas.put(key, Meta(name, Kind.ALLREDUCE, dtype_name(dtype), tuple(output.shape),
                                           int(op), prescale=float(prescale), postscale=float(postscale),
                                           priority=priority))
    return meta


def _codec_error(compression, dtype: np.dtype, name: str) -> str:
    """Why ``compression`` (None or a wire codec) cannot take ``dtype`` ('' when it can)."""
    try:
        codec_for(compression, dtype, name)
    except TypeError as exc:
        return str(exc)
    return ""


def _algorithm_error(algorithm) -> str:
    """'' or why ``algorithm`` is not one commlib has (the names come from the configuration)."""
    if algorithm is None:
        return ""
    from .config import algorithm_names  # the registry of algorithms: loaded on first use, not at import

    return validation.algorithm(algorithm, algorithm_names())


def _allreduce_handle(tensor, inplace: bool, op, name, prescale_factor, postscale_factor, algorithm,
                      compression, wait: bool, process_set=None, staged: device.Staged | None = None,
                      priority: int = 0) -> Handle:
    label = validation.check_name(name, "allreduce") or "allreduce"  # type errors: before any auto name
    if priority:
        priority = _priority(priority, label)
    prescale_factor = validation.check_scale_factor(prescale_factor, "prescale_factor", label)
    postscale_factor = validation.check_scale_factor(postscale_factor, "postscale_factor", label)
    runtime, member, name = _member_and_name(process_set, name, "allreduce")
    if not isinstance(tensor, np.ndarray) and device.on_device(tensor):  # through pinned host memory
        staged = device.Staged(tensor, name)
        return staged.handle(_allreduce_handle(staged.host, True, op, name, prescale_factor, postscale_factor,
                                               algorithm, compression, wait, process_set, staged, priority),
                             inplace)
    if inplace:
        array = output = tensor if isinstance(tensor, np.ndarray) else _in_place(tensor, name, "allreduce")
    else:
        array = np.asarray(tensor)
        output = np.array(array, copy=True, order="C")
    if compression is Compression.none:
        compression = None
    if compression is None and algorithm is None and staged is None:
        meta = _plain_allreduce_meta(runtime, name, output, op, prescale_factor, postscale_factor, priority)
        if meta is not None:
            return _submit(member, meta, array, output, wait=wait)
    if (isinstance(compression, Compressor) and staged is None and _through_servers(runtime, algorithm)
            and (isinstance(compression, Encoder) or algorithm is not None)):
        # a lossy encoder through the servers: each worker pushes its encoded partitions (push_pull). DGC
        # and PowerSGD under COMMLIB_ALGORITHM=ps keep their own collectives; named with algorithm="ps",
        # push_pull says why they do not apply
        if process_set is not None and member is not runtime.sets.world:
            raise CommlibError(f"{name}: {compression!r} through the summation servers reduces over every "
                               "worker; a process set takes an allreduce algorithm (algorithm='ring', ...)")
        handle = _push_pull_handle(output, True, op, name, prescale_factor, postscale_factor, compression)
        if wait:
            synchronize(handle)
        return handle
    op, error = _op(op)
    dtype = output.dtype
    special = _compressed.is_special(compression)  # lossy or Horovod-style: commlib/compression/collective.py
    errors = validation.joined(error, validation.contiguous(output, name), validation.writable(output, name),
                               validation.reduction(dtype, op, name),
                               (_compressed.check(compression, output, op, algorithm, name) if special
                                else _codec_error(compression, dtype, name)),
                               _algorithm_error(algorithm),
                               validation.scaling(dtype, prescale_factor, postscale_factor, name),
                               staged.error if staged else "")
    if special:
        if not errors and staged is None:
            handle = _compressed.allreduce(
                compression, _Exchange(member.size, member.rank, process_set), array, output, inplace, op, name,
                prescale_factor, postscale_factor,
                lambda a, o, n, pre, post: allreduce_async(a, op=o, name=n, prescale_factor=pre,
                                                           postscale_factor=post, process_set=process_set))
            if wait:
                handle.wait()
            return handle
        compression = None  # the error travels under ``name``, where the other ranks' first collective is
    if compression is not None and not isinstance(compression, WireCodec):
        compression = None
    meta = Meta(name, Kind.ALLREDUCE, dtype_name(output.dtype), tuple(output.shape), int(op),
                prescale=float(prescale_factor), postscale=float(postscale_factor),
                compression=compression.name if compression is not None else "none",
                algorithm=(algorithm or "").lower() if not errors else "", error=errors,
                device=staged.kind if staged else device.CPU, priority=priority)
    return _submit(member, meta, array, output, wait=wait)


def _priority(priority, label: str) -> int:
    """``priority`` checked: an int (a bool or anything else is a TypeError naming the call)."""
    if isinstance(priority, bool) or not isinstance(priority, (int, np.integer)):
        raise TypeError(f"{label}: priority must be an int (higher runs sooner), not {type(priority).__name__}")
    return int(priority)


class _Exchange(Exchange):
    """The collectives a compressor uses (handed to it: compression sits below the API): commlib's own,
    Sum over the ranks of ``process_set``; remembers the handles it starts (the deferred handle's parts)."""

    def __init__(self, size: int, rank: int, process_set=None):
        super().__init__(size, rank, process_set)
        self.handles: list[Handle] = []

    def allreduce(self, array, name):
        handle = allreduce_async_(array, op=Sum, name=name, process_set=self.process_set)
        self.handles.append(handle)
        return handle

    def allgather(self, array, name):
        handle = allgather_async(array, name=name, process_set=self.process_set)
        self.handles.append(handle)
        return handle

    def wait(self, handle):
        return synchronize(handle)


# ---- allreduce -----------------------------------------------------------------------------------------

def allreduce_async(tensor, op=Average, name: str | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, algorithm: str | None = None,
                    compression: WireCodec | None = Compression.none, process_set=None, priority: int = 0) -> Handle:
    """Start reducing ``tensor`` across ranks into a new array; ``synchronize`` returns it.

    ``op``: Sum, Average (default), Min, Max, Product. ``prescale_factor``/``postscale_factor`` multiply
    before/after the reduction. ``algorithm`` forces one (see docs/algorithms.md). ``compression``
    (Compression.fp16 / .bf16) sends float32 in half precision and accumulates in float32; a lossy
    compressor (Compression.topk(0.01), .dgc(), .powersgd(), ...; Sum/Average only, state kept per
    ``name``) or an object with Horovod's compress/decompress runs as docs/compression.md describes.
    ``process_set``: reduce among that set's ranks only (default: every rank). ``priority``: among
    allreduces ready at once, higher ones run first, and large ones in partitions (docs/coordinator.md,
    "Priority scheduling"); every rank must give a tensor the same priority."""
    return _allreduce_handle(tensor, False, op, name, prescale_factor, postscale_factor, algorithm,
                             compression, wait=False, process_set=process_set, priority=priority)


def allreduce_async_(tensor: np.ndarray, op=Average, name: str | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0, algorithm: str | None = None,
                     compression: WireCodec | None = Compression.none, process_set=None,
                     priority: int = 0) -> Handle:
    """In-place version of :func:`allreduce_async`."""
    return _allreduce_handle(tensor, True, op, name, prescale_factor, postscale_factor, algorithm,
                             compression, wait=False, process_set=process_set, priority=priority)


class PersistentAllreduce:
    """One named in-place allreduce started again and again (a gradient, every step), as MPI's persistent
    collectives: the arguments are checked once, and after the first start of an array of a given dtype
    and shape the request's metadata is kept, so a start only checks that the array is still a writable
    C-contiguous numpy array of that dtype and shape and queues it (``allreduce_async_`` with the same
    arguments builds and looks up the request on every call). Anything else (another dtype or shape, a
    device array, commlib re-initialized) takes ``allreduce_async_``'s full path, with its checks and
    errors. Made by :func:`persistent_allreduce`."""

    __slots__ = ("name", "_kwargs", "_runtime", "_meta", "_dtype", "_shape", "_process_set")

    def __init__(self, name: str, kwargs: dict):
        self.name = name
        self._kwargs = kwargs
        self._process_set = kwargs.get("process_set")
        self._runtime = None
        self._meta: Meta | None = None
        self._dtype = None
        self._shape = None

    def start_(self, array) -> Handle:
        """Start reducing ``array`` in place; returns the handle to ``synchronize``."""
        runtime = _state.runtime
        meta = self._meta
        if (meta is None or runtime is not self._runtime or type(array) is not np.ndarray
                or array.dtype is not self._dtype or array.shape != self._shape):
            return self._first(array)
        flags = array.flags
        if not (flags.c_contiguous and flags.writeable):
            return self._first(array)
        member = runtime.sets.member(self._process_set, self.name)  # a removed set is still an error
        return member.coordinator.submit(Entry(meta, array, array, Handle(meta.name)))

    def _first(self, array) -> Handle:
        """The full path; keeps the request's metadata when it was a plain one."""
        kwargs = self._kwargs
        handle = _allreduce_handle(array, True, kwargs["op"], self.name, kwargs["prescale_factor"],
                                   kwargs["postscale_factor"], None, None, wait=False,
                                   process_set=self._process_set, priority=kwargs["priority"])
        runtime = _state.runtime
        self._meta = None
        if type(array) is np.ndarray and type(kwargs["op"]) is ReduceOp:
            meta = _plain_allreduce_meta(runtime, self.name, array, kwargs["op"], kwargs["prescale_factor"],
                                         kwargs["postscale_factor"], kwargs["priority"])
            if meta is not None:
                self._runtime, self._meta, self._dtype, self._shape = runtime, meta, array.dtype, array.shape
        return handle


def persistent_allreduce(name: str, op=Average, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                         process_set=None, priority: int = 0) -> PersistentAllreduce:
    """An in-place allreduce of ``name`` to start many times: ``request.start_(array)`` does what
    ``allreduce_async_(array, op, name, prescale_factor, postscale_factor, process_set=process_set,
    priority=priority)`` does, with less work per start (:class:`PersistentAllreduce`; no compression or
    forced algorithm: use ``allreduce_async_`` for those). ``name`` is required: it is what makes the
    repeated starts the same request on every rank."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"persistent_allreduce: name must be a non-empty string (it is what matches the request's "
                        f"starts across ranks), not {type(name).__name__} {name!r}"[:300])
    name = str(name)
    if priority:
        priority = _priority(priority, name)
    prescale_factor = validation.check_scale_factor(prescale_factor, "prescale_factor", name)
    postscale_factor = validation.check_scale_factor(postscale_factor, "postscale_factor", name)
    return PersistentAllreduce(name, dict(op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                          process_set=process_set, priority=priority))


def allreduce(tensor, op=Average, name: str | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, algorithm: str | None = None,
              compression: WireCodec | None = Compression.none, process_set=None) -> np.ndarray:
    """Reduce ``tensor`` across ranks; returns a new array.

    Example::

        import commlib as cl, numpy as np
        cl.init()
        mean = cl.allreduce(np.full(4, cl.rank(), np.float32))   # every rank: the mean of the ranks
    """
    return synchronize(_allreduce_handle(tensor, False, op, name, prescale_factor, postscale_factor,
                                         algorithm, compression, wait=True, process_set=process_set))


def allreduce_(tensor: np.ndarray, op=Average, name: str | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, algorithm: str | None = None,
               compression: WireCodec | None = Compression.none, process_set=None) -> np.ndarray:
    """Reduce ``tensor`` across ranks in place; returns it."""
    return synchronize(_allreduce_handle(tensor, True, op, name, prescale_factor, postscale_factor,
                                         algorithm, compression, wait=True, process_set=process_set))


def _grouped(tensors: Sequence, inplace: bool, name, kwargs) -> Handle:
    tensors = validation.check_tensor_list(tensors, validation.check_name(name, "grouped_allreduce") or
                                           "grouped_allreduce")
    _, _, base = _member_and_name(kwargs.get("process_set"), name, "grouped_allreduce")
    parts = [_allreduce_handle(t, inplace, name=f"{base}.{i}", wait=False, **kwargs)
             for i, t in enumerate(tensors)]
    return Handle(base, parts=parts)


def grouped_allreduce_async(tensors: Sequence, op=Average, name: str | None = None, prescale_factor=1.0,
                            postscale_factor=1.0, algorithm=None, compression=Compression.none,
                            process_set=None) -> Handle:
    """Start allreducing a list of tensors together; ``synchronize`` returns the list of results."""
    return _grouped(tensors, False, name, dict(op=op, prescale_factor=prescale_factor,
                                               postscale_factor=postscale_factor, algorithm=algorithm,
                                               compression=compression, process_set=process_set))


def grouped_allreduce_async_(tensors: Sequence, op=Average, name: str | None = None, prescale_factor=1.0,
                             postscale_factor=1.0, algorithm=None, compression=Compression.none,
                             process_set=None, priority: int = 0) -> Handle:
    """In-place version of :func:`grouped_allreduce_async`."""
    return _grouped(tensors, True, name, dict(op=op, prescale_factor=prescale_factor,
                                              postscale_factor=postscale_factor, algorithm=algorithm,
                                              compression=compression, process_set=process_set,
                                              priority=priority))


def grouped_allreduce(tensors: Sequence, **kwargs) -> list:
    return synchronize(grouped_allreduce_async(tensors, **kwargs))


def grouped_allreduce_(tensors: Sequence, **kwargs) -> list:
    return synchronize(grouped_allreduce_async_(tensors, **kwargs))


# ---- other collectives -----------------------------------------------------------------------------------

def _plain_handle(kind: Kind, operation: str, tensor, name, inplace=False, op=Sum, root=-1,
                  splits=None, wait=False, process_set=None, prescale=1.0, postscale=1.0,
                  staged: device.Staged | None = None) -> Handle:
    label = validation.check_name(name, operation) or operation  # type errors: before any auto name
    prescale = validation.check_scale_factor(prescale, "prescale_factor", label)
    postscale = validation.check_scale_factor(postscale, "postscale_factor", label)
    if kind is Kind.BROADCAST:
        root = validation.check_rank_argument(root, "root_rank", label)
    if kind is Kind.ALLTOALL:
        splits = validation.check_splits(splits, label)
    runtime, member, name = _member_and_name(process_set, name, operation)
    if not isinstance(tensor, np.ndarray) and device.on_device(tensor):  # through pinned host memory
        staged = device.Staged(tensor, name)
        return staged.handle(_plain_handle(kind, operation, staged.host, name, True, op, root, splits, wait,
                                           process_set, prescale, postscale, staged), inplace)
    if inplace:
        array = output = _in_place(tensor, name, operation)
    else:
        array = np.ascontiguousarray(tensor)
        output = np.array(array, copy=True) if kind is Kind.BROADCAST else None
    errors = [validation.contiguous(array, name), validation.movable(array.dtype, name)]
    if inplace:
        errors.append(validation.writable(array, name))
    if kind in (Kind.ALLGATHER, Kind.REDUCESCATTER, Kind.ALLTOALL):
        errors.append(validation.first_dimension(array, operation, name))
    if kind is Kind.REDUCESCATTER:
        op, error = _op(op)
        errors += [error, validation.reduction(array.dtype, op, name),
                   validation.scaling(array.dtype, prescale, postscale, name)]
    if kind is Kind.BROADCAST:  # a world rank, as in Horovod; the set's coordinator takes its set rank
        errors.append(validation.root_rank(root, member.ranks, member.process_set_id, name))
        root = member.ranks.index(root) if root in member.ranks else -1
    if kind is Kind.ALLTOALL:
        errors.append(validation.splits(splits, array.shape[0] if array.ndim else None, member.size, name))
    if staged is not None:
        errors.append(staged.error)
    meta = Meta(name, kind, dtype_name(array.dtype), tuple(array.shape), int(op), root=root,
                prescale=float(prescale), postscale=float(postscale), error=validation.joined(*errors),
                device=staged.kind if staged else device.CPU)
    return _submit(member, meta, array, output, splits, wait=wait)


def allgather_async(tensor, name: str | None = None, process_set=None) -> Handle:
    """Start concatenating every rank's ``tensor`` along the first dimension (which may differ)."""
    return _plain_handle(Kind.ALLGATHER, "allgather", tensor, name, process_set=process_set)


def allgather(tensor, name: str | None = None, process_set=None) -> np.ndarray:
    return synchronize(_plain_handle(Kind.ALLGATHER, "allgather", tensor, name, wait=True,
                                     process_set=process_set))


def broadcast_async(tensor, root_rank: int, name: str | None = None, process_set=None) -> Handle:
    """Start copying ``root_rank``'s ``tensor`` to every rank, into a new array. ``root_rank`` is a
    world rank, also with a ``process_set`` (as in Horovod)."""
    return _plain_handle(Kind.BROADCAST, "broadcast", tensor, name, root=root_rank, process_set=process_set)


def broadcast_async_(tensor: np.ndarray, root_rank: int, name: str | None = None, process_set=None) -> Handle:
    return _plain_handle(Kind.BROADCAST, "broadcast", tensor, name, inplace=True, root=root_rank,
                         process_set=process_set)


def broadcast(tensor, root_rank: int, name: str | None = None, process_set=None) -> np.ndarray:
    return synchronize(_plain_handle(Kind.BROADCAST, "broadcast", tensor, name, root=root_rank, wait=True,
                                     process_set=process_set))


def broadcast_(tensor: np.ndarray, root_rank: int, name: str | None = None, process_set=None) -> np.ndarray:
    return synchronize(_plain_handle(Kind.BROADCAST, "broadcast", tensor, name, inplace=True,
                                     root=root_rank, wait=True, process_set=process_set))


def reducescatter_async(tensor, op=Average, name: str | None = None, process_set=None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Start reducing ``tensor`` and giving each rank its block of the first dimension (earlier ranks
    take the extra rows, as Horovod). ``prescale_factor`` multiplies each rank's input, ``postscale_factor``
    the result; Average divides by the ranks in the postscale pass (integers truncated, as Horovod)."""
    return _plain_handle(Kind.REDUCESCATTER, "reducescatter", tensor, name, op=op, process_set=process_set,
                         prescale=prescale_factor, postscale=postscale_factor)


def reducescatter(tensor, op=Average, name: str | None = None, process_set=None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> np.ndarray:
    return synchronize(_plain_handle(Kind.REDUCESCATTER, "reducescatter", tensor, name, op=op, wait=True,
                                     process_set=process_set, prescale=prescale_factor,
                                     postscale=postscale_factor))


def grouped_reducescatter_async(tensors: Sequence, op=Average, name: str | None = None, process_set=None,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Start :func:`reducescatter` on each of ``tensors``; ``synchronize`` returns the list of results."""
    tensors = validation.check_tensor_list(tensors, validation.check_name(name, "grouped_reducescatter") or
                                           "grouped_reducescatter")
    _, _, base = _member_and_name(process_set, name, "grouped_reducescatter")
    return Handle(base, parts=[
        _plain_handle(Kind.REDUCESCATTER, "reducescatter", t, f"{base}.{i}", op=op, process_set=process_set,
                      prescale=prescale_factor, postscale=postscale_factor) for i, t in enumerate(tensors)])


def grouped_reducescatter(tensors: Sequence, **kwargs) -> list:
    return synchronize(grouped_reducescatter_async(tensors, **kwargs))


def grouped_allgather_async(tensors: Sequence, name: str | None = None, process_set=None) -> Handle:
    """Start :func:`allgather` on each of ``tensors``; ``synchronize`` returns the list of results."""
    tensors = validation.check_tensor_list(tensors, validation.check_name(name, "grouped_allgather") or
                                           "grouped_allgather")
    _, _, base = _member_and_name(process_set, name, "grouped_allgather")
    return Handle(base, parts=[_plain_handle(Kind.ALLGATHER, "allgather", t, f"{base}.{i}", process_set=process_set)
                               for i, t in enumerate(tensors)])


def grouped_allgather(tensors: Sequence, name: str | None = None, process_set=None) -> list:
    return synchronize(grouped_allgather_async(tensors, name, process_set=process_set))


def alltoall_async(tensor, splits=None, name: str | None = None, process_set=None) -> Handle:
    """Start sending ``splits[i]`` rows of ``tensor`` to rank i of the set (equal parts by default);
    ``synchronize`` returns ``(output, received_splits)``."""
    return _plain_handle(Kind.ALLTOALL, "alltoall", tensor, name, splits=splits, process_set=process_set)


def alltoall(tensor, splits=None, name: str | None = None, process_set=None):
    return synchronize(_plain_handle(Kind.ALLTOALL, "alltoall", tensor, name, splits=splits, wait=True,
                                     process_set=process_set))


def barrier(process_set=None) -> None:
    """Wait until every rank (of ``process_set``) has reached the barrier."""
    synchronize(_plain_handle(Kind.BARRIER, "barrier", np.zeros(0, np.uint8), None, wait=True,
                              process_set=process_set))


def join(process_set=None) -> int:
    """Declare that this rank has run out of data. Until every rank (of ``process_set``) has joined, its
    allreduces contribute zeros to the others'. Returns the last rank to join (a world rank)."""
    runtime, member, _ = _member_and_name(process_set, "__join__", "join")
    meta = Meta("__join__", Kind.JOIN, "uint8", ())
    return synchronize(_submit(member, meta, None, None, wait=True))


def poll(handle: Handle) -> bool:
    """True when the operation behind ``handle`` has finished (``synchronize`` will not block)."""
    return validation.check_handle(handle, "poll").done()


def synchronize(handle: Handle) -> Any:
    """Wait for ``handle`` and return its result; raises :class:`CollectiveError` if it failed."""
    validation.check_handle(handle, "synchronize")
    if not handle.done():
        handle.wait()
    return handle.result()


# ---- Python objects ------------------------------------------------------------------------------------

def broadcast_object(obj: Any = None, root_rank: int = 0, name: str | None = None, process_set=None) -> Any:
    """Broadcast a picklable object from ``root_rank`` (a world rank); every rank (of ``process_set``)
    returns it."""
    root_rank = validation.check_rank_argument(
        root_rank, "root_rank", validation.check_name(name, "broadcast_object") or "broadcast_object")
    runtime, _, name = _member_and_name(process_set, name, "broadcast_object")
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if runtime.rank == root_rank else None
    length = broadcast_(np.array([0 if payload is None else payload.size], np.int64), root_rank,
                        name=f"{name}.length", process_set=process_set)
    data = payload.copy() if payload is not None else np.empty(int(length[0]), np.uint8)
    broadcast_(data, root_rank, name=f"{name}.data", process_set=process_set)
    return pickle.loads(data.tobytes())


def allgather_object(obj: Any, name: str | None = None, process_set=None) -> list:
    """Gather a picklable object from every rank (of ``process_set``); returns the list in rank order."""
    _, _, name = _member_and_name(process_set, name, "allgather_object")
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    lengths = allgather(np.array([payload.size], np.int64), name=f"{name}.lengths", process_set=process_set)
    data = allgather(payload, name=f"{name}.data", process_set=process_set)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [pickle.loads(data[bounds[i]:bounds[i + 1]].tobytes()) for i in range(len(lengths))]


# ---- summation servers (docs/servers.md) --------------------------------------------------------------

def num_servers() -> int:
    """How many summation servers this job has (0: none; ``push_pull`` and ``algorithm="ps"`` need one)."""
    servers = _rt().servers
    return servers.num_servers if servers is not None else 0


def _push_pull_handle(tensor, inplace: bool, op, name, prescale_factor, postscale_factor,
                      compression, priority: int = 0) -> Handle:
    runtime = _rt()
    if runtime.servers is None:
        from .algorithms.ps import NO_SERVERS

        raise CommlibError(NO_SERVERS.replace("algorithm 'ps'", "push_pull"))
    from .engine import _scale_factors

    if priority:
        priority = _priority(priority, name or "push_pull")
    name = name or runtime.sets.world.auto_name("push_pull")
    op = as_op(op)
    if inplace:
        output = _in_place(tensor, name, "push_pull")
    else:
        output = np.array(np.asarray(tensor), copy=True, order="C")
    codec = None if compression is Compression.none or compression is None else compression
    lossy = None
    if codec is not None and not isinstance(codec, WireCodec):  # a lossy compressor, where one applies
        from .compression import pushed

        why = pushed.why_not(codec, output.dtype, op.name, name)
        if why:
            raise CommlibError(why)
        lossy, codec = pushed.PushEncoder(codec), None
    validation.check_contiguous(output, name)
    validation.check_reducible(output, op, name)
    validation.check_options(output.dtype, codec, prescale_factor, postscale_factor, name)
    if lossy is None and _reduces_in_hosts(runtime, output.nbytes, codec):
        # one push per host: the host's ranks meet first, so this goes through the coordinator (agreed order)
        return _allreduce_handle(output, True, op, name, prescale_factor, postscale_factor, "ps", codec,
                                 wait=False, priority=priority)
    pre, post = _scale_factors(op, codec, prescale_factor, postscale_factor, runtime.size)
    return runtime.servers.push_pull_async(output.reshape(-1), name, op.kernel_op, codec, pre, post,
                                           result=output, lossy=lossy, priority=priority)


def _reduces_in_hosts(runtime: "Runtime", nbytes: int, codec) -> bool:
    """Whether ``ps`` reduces inside each host first for a world tensor of ``nbytes`` (the rule every rank
    applies alike: commlib/algorithms/ps.py)."""
    from .algorithms import ps

    ctx = runtime.world_context
    return ps.reduces_in_hosts(ctx.cost_model, nbytes, ps.shape_of(ctx), codec)


def _through_servers(runtime: "Runtime", algorithm) -> bool:
    """Whether an allreduce runs on the summation servers (``ps`` asked for, or the configured default)."""
    return runtime.servers is not None and str(algorithm or runtime.config.algorithm).lower() == "ps"


def push_pull_async(tensor, op=Average, name: str | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, compression: WireCodec | None = Compression.none,
                    priority: int = 0) -> Handle:
    """Start reducing ``tensor`` over every worker through the summation servers, into a new array;
    ``synchronize`` returns it. No negotiation: each worker pushes as soon as it calls, the servers sum
    each partition when every worker has pushed it, so the workers may submit tensors in any order, but
    every worker must push each ``name`` alike (shape, dtype, op). ``op``: Sum or Average (default;
    Min, Max and Product also work). ``compression``: Compression.fp16/.bf16 sends float32 in half
    precision; the servers accumulate in float32. Every worker receives the same bits. ``priority``
    (an int, BytePS's argument): this worker sends the partitions of a higher-priority tensor before those
    of lower-priority tensors still waiting to go (equal priorities in submission order); it changes the
    order only, never the result."""
    return _push_pull_handle(tensor, False, op, name, prescale_factor, postscale_factor, compression, priority)


def push_pull_async_(tensor: np.ndarray, op=Average, name: str | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0,
                     compression: WireCodec | None = Compression.none, priority: int = 0) -> Handle:
    """In-place version of :func:`push_pull_async`."""
    return _push_pull_handle(tensor, True, op, name, prescale_factor, postscale_factor, compression, priority)


def push_pull(tensor, op=Average, name: str | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, compression: WireCodec | None = Compression.none,
              priority: int = 0) -> np.ndarray:
    """Reduce ``tensor`` over every worker through the summation servers; returns a new array.

    Example (``mpiexec -n 2 python this.py : -n 1 python -m commlib.server``)::

        import commlib as cl, numpy as np
        cl.init()
        total = cl.push_pull(np.full(4, cl.rank(), np.float32), op=cl.Sum, name="x")   # [1, 1, 1, 1]
    """
    return synchronize(_push_pull_handle(tensor, False, op, name, prescale_factor, postscale_factor,
                                         compression, priority))


def push_pull_(tensor: np.ndarray, op=Average, name: str | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, compression: WireCodec | None = Compression.none,
               priority: int = 0) -> np.ndarray:
    """In-place version of :func:`push_pull`."""
    return synchronize(_push_pull_handle(tensor, True, op, name, prescale_factor, postscale_factor,
                                         compression, priority))
