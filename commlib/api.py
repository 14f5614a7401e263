"""commlib's public functions, named as in horovod.torch.

Every collective is asynchronous underneath: ``*_async`` submits and returns a handle; the plain names
submit and wait. Functions ending in ``_`` work in place; ``grouped_*`` take a list of tensors. Each
collective's variants are one line over one implementation, from one description (:data:`COLLECTIVES`:
its arguments and which variants it has), so that their arguments cannot drift. All of them act on the
runtime that ``init()`` created (:mod:`commlib.lifecycle`, the one owner of the process's state).
"""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

import numpy as np

from . import device
from .compression import Compression, Compressor, Encoder, Exchange, WireCodec, codec_for
from .compression import collective as _compressed
from .coordinator.requests import Entry, Handle, Kind, Meta
from . import validation
from .dtypes import BY_NUMPY, dtype_name
from .errors import CommlibError
from .lifecycle import (ABORT_GRACE_S, LOST_PEER_EXIT_STATUS, current, current_or_none,  # noqa: F401
                        global_process_set, init, is_initialized, shutdown)
from .ops import Average, ReduceOp, Sum, as_op
from .process_sets import ProcessSet, check_process_set

if TYPE_CHECKING:  # runtime.py imports MPI: init() imports it, so that `import commlib` does not
    from .process_sets import Member
    from .runtime import Runtime

_rt = current  # the runtime init() built, or the error that says to call init()


# ---- topology ------------------------------------------------------------------------------------------

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

def add_process_set(process_set: ProcessSet | Sequence[int], members_only: bool = False) -> ProcessSet:
    """Register a process set (a ProcessSet or a list of world ranks) and return it, with its
    ``process_set_id``. Collective: every rank calls it, with the same ranks, in the same order. Raises
    a ValueError (:class:`ProcessSetError`) for a set already registered or ranks that differ between
    ranks. ``members_only=True``: only the set's ranks call it (in the same order among themselves), while
    the others need not; its id comes from a separate space and is known to its members only
    (docs/process_sets.md)."""
    return _rt().add_process_set(process_set, members_only)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` (every rank calls it; for a members-only set, its ranks); its pending
    operations fail. False for the global set or a set that is not registered."""
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
    if not isinstance(tensor, np.ndarray) and device.on_device(tensor):
        if not _compressed.is_special(compression):  # the device path (docs/gpu.md)
            return _device_allreduce(member, tensor, inplace, op, name, prescale_factor, postscale_factor,
                                     algorithm, compression, wait, priority)
        staged = device.Staged(tensor, name)  # a lossy compressor works on the host: the tensor goes there whole
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
    if not isinstance(tensor, np.ndarray) and device.on_device(tensor):  # the device path (docs/gpu.md)
        return _device_plain(kind, operation, member, tensor, name, inplace, op, root, splits, wait, prescale,
                             postscale)
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


# ---- device tensors (docs/gpu.md) --------------------------------------------------------------------------

def _device_tensor(tensor, name: str) -> tuple[device.DeviceTensor | None, np.dtype, tuple, str, str]:
    """(the DeviceTensor of ``tensor`` as submitted now, its dtype, shape, device kind, '' or why it cannot
    be communicated). A tensor that cannot (no CuPy, no GPU, not contiguous, an unknown device) still makes
    a request, whose error every rank then raises."""
    kind, index = device.UNSUPPORTED, -1
    try:
        kind, index = device.placement(tensor)
        if not _is_contiguous(tensor):
            raise device.DeviceSupportError(
                f"buffer is not contiguous (shape: {tuple(tensor.shape)}); pass cupy.ascontiguousarray(x) or "
                "tensor.contiguous()")
        submitted = device.DeviceTensor.submitted(tensor, _device_streams(index))
        return submitted, submitted.dtype, submitted.shape, kind, ""
    except (device.DeviceSupportError, ImportError, TypeError, ValueError, RuntimeError) as exc:
        try:
            dtype, shape = device.declared_layout(tensor)
        except (AttributeError, TypeError, ValueError):
            dtype, shape = np.dtype(np.uint8), (0,)
        where = f"{kind}:{index}" if index >= 0 else kind
        return None, np.dtype(dtype), tuple(shape), kind, f"{name}: the tensor lives on {where} and cannot be " \
                                                         f"communicated: {exc}"


def _device_streams(index: int):
    """The stream interface of CUDA device ``index`` (-1: CuPy's current device)."""
    from .transport.streams import cuda_streams

    if index < 0:
        index = device.cupy_module().cuda.runtime.getDevice()
    return cuda_streams(index)


def _is_contiguous(tensor) -> bool:
    is_contiguous = getattr(tensor, "is_contiguous", None)  # torch
    if callable(is_contiguous):
        return bool(is_contiguous())
    flags = getattr(tensor, "flags", None)  # CuPy
    return bool(getattr(flags, "c_contiguous", True))


def _device_allreduce(member: "Member", tensor, inplace: bool, op, name: str, prescale: float, postscale: float,
                      algorithm, compression, wait: bool, priority: int) -> Handle:
    """An allreduce of a device tensor, handed to the coordinator as it is (its lane packs, reduces and
    unpacks on the GPU, ordered after the stream that produced the tensor)."""
    submitted, dtype, shape, kind, error = _device_tensor(tensor, name)
    if compression is Compression.none:
        compression = None
    op, op_error = _op(op)
    errors = validation.joined(error, op_error, validation.reduction(dtype, op, name),
                               _codec_error(compression, dtype, name), _algorithm_error(algorithm),
                               validation.scaling(dtype, prescale, postscale, name))
    output = submitted.like() if submitted is not None and not inplace and not errors else submitted
    meta = Meta(name, Kind.ALLREDUCE, dtype_name(dtype), shape, int(op), prescale=float(prescale),
                postscale=float(postscale), compression=compression.name if compression is not None else "none",
                algorithm=(algorithm or "").lower() if not errors else "", error=errors, device=kind,
                priority=priority)
    return device.DeviceHandle(_submit(member, meta, submitted, output, wait=wait))


def _device_plain(kind: Kind, operation: str, member: "Member", tensor, name: str, inplace: bool, op, root: int,
                  splits, wait: bool, prescale: float, postscale: float) -> Handle:
    """allgather, broadcast, reducescatter or alltoall of a device tensor, handed to the coordinator as it is."""
    submitted, dtype, shape, where, error = _device_tensor(tensor, name)
    errors = [error, validation.movable(dtype, name)]
    ndim = len(shape)
    if kind in (Kind.ALLGATHER, Kind.REDUCESCATTER, Kind.ALLTOALL):
        errors.append(validation.first_dimension(np.empty(shape, np.uint8) if not ndim else np.empty(1, np.uint8),
                                                 operation, name))
    if kind is Kind.REDUCESCATTER:
        op, op_error = _op(op)
        errors += [op_error, validation.reduction(dtype, op, name), validation.scaling(dtype, prescale, postscale, name)]
    if kind is Kind.BROADCAST:
        errors.append(validation.root_rank(root, member.ranks, member.process_set_id, name))
        root = member.ranks.index(root) if root in member.ranks else -1
    if kind is Kind.ALLTOALL:
        errors.append(validation.splits(splits, shape[0] if ndim else None, member.size, name))
    errors = validation.joined(*errors)
    output = submitted
    if kind is Kind.BROADCAST and submitted is not None and not inplace and not errors:
        output = submitted.like()
    meta = Meta(name, kind, dtype_name(dtype), shape, int(op), root=root, prescale=float(prescale),
                postscale=float(postscale), error=errors, device=where)
    return device.DeviceHandle(_submit(member, meta, submitted, output, splits, wait=wait))


def _push_pull_handle(tensor, inplace: bool, op, name, prescale_factor, postscale_factor,
                      compression, priority: int = 0) -> Handle:
    runtime = _rt()
    if runtime.servers is None:
        from .algorithms.ps import no_servers

        raise CommlibError(no_servers("push_pull"))
    from .engine import scale_factors

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
    pre, post = scale_factors(op, codec, prescale_factor, postscale_factor, runtime.size)
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


# ---- each collective: one implementation, one description, its variants ----------------------------------

class Form(NamedTuple):
    """How a variant runs its collective: in place (the ``_`` names), and whether the caller gets the
    result (the plain names: the calling thread drives the collective) or a handle (``_async``)."""

    in_place: bool
    blocking: bool


_ASYNC, _ASYNC_, _BLOCKING, _BLOCKING_ = Form(False, False), Form(True, False), Form(False, True), Form(True, True)


def _finish(form: Form, handle: Handle):
    if not form.blocking:
        return handle
    return handle.result() if handle.done() else synchronize(handle)  # (usually done: this thread drove it)


def _allreduce(form: Form, tensor, op, name, prescale_factor, postscale_factor, algorithm, compression,
               process_set, priority):
    if (type(name) is str and type(tensor) is np.ndarray and type(op) is ReduceOp and algorithm is None
            and process_set is None and not priority and type(prescale_factor) is float
            and type(postscale_factor) is float and (compression is Compression.none or compression is None)):
        # a training loop's repeated call: a request seen before (runtime.metas holds validated ones only)
        runtime = _rt()
        output = tensor if form.in_place else np.array(tensor, copy=True, order="C")
        meta = runtime.metas.get((name, output.dtype, output.shape, op, prescale_factor, postscale_factor, 0))
        if meta is not None:
            flags = output.flags
            if flags.c_contiguous and flags.writeable:
                entry = Entry(meta, tensor, output, Handle(name))
                coordinator = runtime.coordinator
                return coordinator.run(entry).result() if form.blocking else coordinator.submit(entry)
    return _finish(form, _allreduce_handle(tensor, form.in_place, op, name, prescale_factor, postscale_factor,
                                           algorithm, compression, wait=form.blocking, process_set=process_set,
                                           priority=priority))


def _allgather(form: Form, tensor, name, process_set):
    return _finish(form, _plain_handle(Kind.ALLGATHER, "allgather", tensor, name, inplace=form.in_place,
                                       wait=form.blocking, process_set=process_set))


def _broadcast(form: Form, tensor, root_rank, name, process_set):
    return _finish(form, _plain_handle(Kind.BROADCAST, "broadcast", tensor, name, inplace=form.in_place,
                                       root=root_rank, wait=form.blocking, process_set=process_set))


def _reducescatter(form: Form, tensor, op, name, process_set, prescale_factor, postscale_factor):
    return _finish(form, _plain_handle(Kind.REDUCESCATTER, "reducescatter", tensor, name, inplace=form.in_place,
                                       op=op, wait=form.blocking, process_set=process_set,
                                       prescale=prescale_factor, postscale=postscale_factor))


def _alltoall(form: Form, tensor, splits, name, process_set):
    return _finish(form, _plain_handle(Kind.ALLTOALL, "alltoall", tensor, name, inplace=form.in_place,
                                       splits=splits, wait=form.blocking, process_set=process_set))


def _push_pull(form: Form, tensor, op, name, prescale_factor, postscale_factor, compression, priority):
    return _finish(form, _push_pull_handle(tensor, form.in_place, op, name, prescale_factor, postscale_factor,
                                           compression, priority))


def _one_device_kind(tensors: list, label: str) -> None:
    """A grouped call's tensors all live on the host or all on a device: they are fused and run as one."""
    on = [device.on_device(t) for t in tensors]
    if any(on) and not all(on):
        where = ", ".join(f"{i}: {'device' if o else 'host'}" for i, o in enumerate(on))
        raise CommlibError(f"{label}: a grouped call takes tensors on one kind of device, all on the host or all "
                           f"on GPUs, but got {where}; group them separately")


REQUIRED = inspect.Parameter.empty  # an argument without a default


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective as every variant of it takes it. ``arguments``: (name, default) after the tensor,
    in order; ``run(form, tensor, *arguments)`` does it; ``in_place``: it has the ``_`` forms;
    ``grouped``: the ``grouped_`` forms (a list of tensors, one handle). The variants are the one-line
    functions below; tests/core/test_api_variants.py checks each against this description."""

    name: str
    run: Callable
    arguments: tuple[tuple[str, Any], ...]
    in_place: bool = False
    grouped: bool = False

    @property
    def argument_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.arguments)

    def variants(self) -> dict[str, tuple[Form, bool]]:
        """Every variant's name -> (its form, whether it is grouped)."""
        forms = {"_async": _ASYNC, "": _BLOCKING}
        if self.in_place:
            forms.update({"_async_": _ASYNC_, "_": _BLOCKING_})
        found = {f"{self.name}{suffix}": (form, False) for suffix, form in forms.items()}
        if self.grouped:
            found.update({f"grouped_{self.name}{suffix}": (form, True) for suffix, form in forms.items()})
        return found


def _grouped(form: Form, collective: Collective, tensors, *arguments):
    """``collective`` on each of ``tensors`` (named ``<name>.<i>``), each submitted at once; one handle over
    them all, whose result is the list of results (the blocking forms wait on it)."""
    operation = f"grouped_{collective.name}"
    values = dict(zip(collective.argument_names, arguments))
    tensors = validation.check_tensor_list(tensors, validation.check_name(values["name"], operation) or operation)
    _one_device_kind(tensors, values["name"] or operation)
    _, _, base = _member_and_name(values.get("process_set"), values["name"], operation)
    part = Form(form.in_place, False)
    handle = Handle(base, parts=[collective.run(part, tensor, **{**values, "name": f"{base}.{i}"})
                                 for i, tensor in enumerate(tensors)])
    return _finish(form, handle)


ALLREDUCE = Collective("allreduce", _allreduce, (
    ("op", Average), ("name", None), ("prescale_factor", 1.0), ("postscale_factor", 1.0), ("algorithm", None),
    ("compression", Compression.none), ("process_set", None), ("priority", 0)), in_place=True, grouped=True)
ALLGATHER = Collective("allgather", _allgather, (("name", None), ("process_set", None)), grouped=True)
BROADCAST = Collective("broadcast", _broadcast, (("root_rank", REQUIRED), ("name", None), ("process_set", None)),
                       in_place=True)
REDUCESCATTER = Collective("reducescatter", _reducescatter, (
    ("op", Average), ("name", None), ("process_set", None), ("prescale_factor", 1.0), ("postscale_factor", 1.0)),
    grouped=True)
ALLTOALL = Collective("alltoall", _alltoall, (("splits", None), ("name", None), ("process_set", None)))
PUSH_PULL = Collective("push_pull", _push_pull, (
    ("op", Average), ("name", None), ("prescale_factor", 1.0), ("postscale_factor", 1.0),
    ("compression", Compression.none), ("priority", 0)), in_place=True)

#: The one description of every collective's variants.
COLLECTIVES = (ALLREDUCE, ALLGATHER, BROADCAST, REDUCESCATTER, ALLTOALL, PUSH_PULL)


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
    return _allreduce(_ASYNC, tensor, op, name, prescale_factor, postscale_factor, algorithm, compression,
                      process_set, priority)


def allreduce_async_(tensor: np.ndarray, op=Average, name: str | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0, algorithm: str | None = None,
                     compression: WireCodec | None = Compression.none, process_set=None,
                     priority: int = 0) -> Handle:
    """In-place version of :func:`allreduce_async`."""
    return _allreduce(_ASYNC_, tensor, op, name, prescale_factor, postscale_factor, algorithm, compression,
                      process_set, priority)


def allreduce(tensor, op=Average, name: str | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, algorithm: str | None = None,
              compression: WireCodec | None = Compression.none, process_set=None, priority: int = 0) -> np.ndarray:
    """Reduce ``tensor`` across ranks; returns a new array (the arguments: :func:`allreduce_async`).

    Example::

        import commlib as cl, numpy as np
        cl.init()
        mean = cl.allreduce(np.full(4, cl.rank(), np.float32))   # every rank: the mean of the ranks
    """
    return _allreduce(_BLOCKING, tensor, op, name, prescale_factor, postscale_factor, algorithm, compression,
                      process_set, priority)


def allreduce_(tensor: np.ndarray, op=Average, name: str | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, algorithm: str | None = None,
               compression: WireCodec | None = Compression.none, process_set=None,
               priority: int = 0) -> np.ndarray:
    """Reduce ``tensor`` across ranks in place; returns it."""
    return _allreduce(_BLOCKING_, tensor, op, name, prescale_factor, postscale_factor, algorithm, compression,
                      process_set, priority)


def grouped_allreduce_async(tensors: Sequence, op=Average, name: str | None = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, algorithm: str | None = None,
                            compression: WireCodec | None = Compression.none, process_set=None,
                            priority: int = 0) -> Handle:
    """Start allreducing a list of tensors together; ``synchronize`` returns the list of results."""
    return _grouped(_ASYNC, ALLREDUCE, tensors, op, name, prescale_factor, postscale_factor, algorithm,
                    compression, process_set, priority)


def grouped_allreduce_async_(tensors: Sequence, op=Average, name: str | None = None, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0, algorithm: str | None = None,
                             compression: WireCodec | None = Compression.none, process_set=None,
                             priority: int = 0) -> Handle:
    """In-place version of :func:`grouped_allreduce_async`."""
    return _grouped(_ASYNC_, ALLREDUCE, tensors, op, name, prescale_factor, postscale_factor, algorithm,
                    compression, process_set, priority)


def grouped_allreduce(tensors: Sequence, op=Average, name: str | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, algorithm: str | None = None,
                      compression: WireCodec | None = Compression.none, process_set=None,
                      priority: int = 0) -> list:
    """Allreduce a list of tensors together; returns the list of results."""
    return _grouped(_BLOCKING, ALLREDUCE, tensors, op, name, prescale_factor, postscale_factor, algorithm,
                    compression, process_set, priority)


def grouped_allreduce_(tensors: Sequence, op=Average, name: str | None = None, prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0, algorithm: str | None = None,
                       compression: WireCodec | None = Compression.none, process_set=None,
                       priority: int = 0) -> list:
    """In-place version of :func:`grouped_allreduce`."""
    return _grouped(_BLOCKING_, ALLREDUCE, tensors, op, name, prescale_factor, postscale_factor, algorithm,
                    compression, process_set, priority)


# ---- allgather, broadcast, reducescatter, alltoall --------------------------------------------------------

def allgather_async(tensor, name: str | None = None, process_set=None) -> Handle:
    """Start concatenating every rank's ``tensor`` along the first dimension (which may differ)."""
    return _allgather(_ASYNC, tensor, name, process_set)


def allgather(tensor, name: str | None = None, process_set=None) -> np.ndarray:
    """Concatenate every rank's ``tensor`` along the first dimension; returns a new array."""
    return _allgather(_BLOCKING, tensor, name, process_set)


def grouped_allgather_async(tensors: Sequence, name: str | None = None, process_set=None) -> Handle:
    """Start :func:`allgather` on each of ``tensors``; ``synchronize`` returns the list of results."""
    return _grouped(_ASYNC, ALLGATHER, tensors, name, process_set)


def grouped_allgather(tensors: Sequence, name: str | None = None, process_set=None) -> list:
    """:func:`allgather` on each of ``tensors``; returns the list of results."""
    return _grouped(_BLOCKING, ALLGATHER, tensors, name, process_set)


def broadcast_async(tensor, root_rank: int, name: str | None = None, process_set=None) -> Handle:
    """Start copying ``root_rank``'s ``tensor`` to every rank, into a new array. ``root_rank`` is a
    world rank, also with a ``process_set`` (as in Horovod)."""
    return _broadcast(_ASYNC, tensor, root_rank, name, process_set)


def broadcast_async_(tensor: np.ndarray, root_rank: int, name: str | None = None, process_set=None) -> Handle:
    """In-place version of :func:`broadcast_async`."""
    return _broadcast(_ASYNC_, tensor, root_rank, name, process_set)


def broadcast(tensor, root_rank: int, name: str | None = None, process_set=None) -> np.ndarray:
    """Copy ``root_rank``'s ``tensor`` to every rank; returns a new array."""
    return _broadcast(_BLOCKING, tensor, root_rank, name, process_set)


def broadcast_(tensor: np.ndarray, root_rank: int, name: str | None = None, process_set=None) -> np.ndarray:
    """In-place version of :func:`broadcast`."""
    return _broadcast(_BLOCKING_, tensor, root_rank, name, process_set)


def reducescatter_async(tensor, op=Average, name: str | None = None, process_set=None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Start reducing ``tensor`` and giving each rank its block of the first dimension (earlier ranks
    take the extra rows, as Horovod). ``prescale_factor`` multiplies each rank's input, ``postscale_factor``
    the result; Average divides by the ranks in the postscale pass (integers truncated, as Horovod)."""
    return _reducescatter(_ASYNC, tensor, op, name, process_set, prescale_factor, postscale_factor)


def reducescatter(tensor, op=Average, name: str | None = None, process_set=None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> np.ndarray:
    """Reduce ``tensor``; returns this rank's block of the first dimension (:func:`reducescatter_async`)."""
    return _reducescatter(_BLOCKING, tensor, op, name, process_set, prescale_factor, postscale_factor)


def grouped_reducescatter_async(tensors: Sequence, op=Average, name: str | None = None, process_set=None,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Start :func:`reducescatter` on each of ``tensors``; ``synchronize`` returns the list of results."""
    return _grouped(_ASYNC, REDUCESCATTER, tensors, op, name, process_set, prescale_factor, postscale_factor)


def grouped_reducescatter(tensors: Sequence, op=Average, name: str | None = None, process_set=None,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> list:
    """:func:`reducescatter` on each of ``tensors``; returns the list of results."""
    return _grouped(_BLOCKING, REDUCESCATTER, tensors, op, name, process_set, prescale_factor, postscale_factor)


def alltoall_async(tensor, splits=None, name: str | None = None, process_set=None) -> Handle:
    """Start sending ``splits[i]`` rows of ``tensor`` to rank i of the set (equal parts by default);
    ``synchronize`` returns ``(output, received_splits)``."""
    return _alltoall(_ASYNC, tensor, splits, name, process_set)


def alltoall(tensor, splits=None, name: str | None = None, process_set=None):
    """:func:`alltoall_async` and wait: returns ``(output, received_splits)``."""
    return _alltoall(_BLOCKING, tensor, splits, name, process_set)


# ---- persistent allreduce ---------------------------------------------------------------------------

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
        runtime = current_or_none()
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
        runtime = current_or_none()
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



# ---- barrier, join, handles ----------------------------------------------------------------------------

def barrier(process_set=None, name: str | None = None) -> None:
    """Wait until every rank (of ``process_set``) has reached the barrier."""
    synchronize(_plain_handle(Kind.BARRIER, "barrier", np.zeros(0, np.uint8), name, wait=True,
                              process_set=process_set))


def barrier_async(process_set=None, name: str | None = None) -> Handle:
    """Start a barrier; its handle is done once every rank (of ``process_set``) has reached it (what a
    torch.distributed ``barrier(async_op=True)`` needs)."""
    return _plain_handle(Kind.BARRIER, "barrier", np.zeros(0, np.uint8), name, process_set=process_set)


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
    return _push_pull(_ASYNC, tensor, op, name, prescale_factor, postscale_factor, compression, priority)


def push_pull_async_(tensor: np.ndarray, op=Average, name: str | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0,
                     compression: WireCodec | None = Compression.none, priority: int = 0) -> Handle:
    """In-place version of :func:`push_pull_async`."""
    return _push_pull(_ASYNC_, tensor, op, name, prescale_factor, postscale_factor, compression, priority)


def push_pull(tensor, op=Average, name: str | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, compression: WireCodec | None = Compression.none,
              priority: int = 0) -> np.ndarray:
    """Reduce ``tensor`` over every worker through the summation servers; returns a new array.

    Example (``mpiexec -n 2 python this.py : -n 1 python -m commlib.server``)::

        import commlib as cl, numpy as np
        cl.init()
        total = cl.push_pull(np.full(4, cl.rank(), np.float32), op=cl.Sum, name="x")   # [1, 1, 1, 1]
    """
    return _push_pull(_BLOCKING, tensor, op, name, prescale_factor, postscale_factor, compression, priority)


def push_pull_(tensor: np.ndarray, op=Average, name: str | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, compression: WireCodec | None = Compression.none,
               priority: int = 0) -> np.ndarray:
    """In-place version of :func:`push_pull`."""
    return _push_pull(_BLOCKING_, tensor, op, name, prescale_factor, postscale_factor, compression, priority)
