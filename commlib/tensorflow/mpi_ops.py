"""horovod.tensorflow's collectives on ``tf.Tensor``: eager and graph forms, with their gradients.

Each op hands its tensors' values to commlib's numpy API through :mod:`.bridge`, so the coordinator,
fusion, the algorithms and the compressors are commlib's. Gradients (``tf.custom_gradient``) follow
Horovod's: an allreduce's is the allreduce of the output gradient with the same op and factors; an
allgather's is the Average allreduce of the gradient, sliced back to this rank's rows; a broadcast's is
the Average allreduce on the root and zeros elsewhere; an alltoall's is the alltoall back; a
reducescatter's is the allgather of the (scaled) gradient.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

import commlib as _cl

from .. import adasum as _adasum
from .. import lifecycle
from ..frameworks import set_kwargs, set_rank, set_size
from .bridge import executing_eagerly, numpy_dtype, op_name, run

from ..frameworks import Adasum, Average, Max, Min, Product, Sum  # noqa: F401  (Horovod's names)

_DIFFERENTIABLE_REDUCTIONS = (Sum, Average, Adasum)


def check_set(process_set, operation: str) -> None:
    """An unregistered process set is a ValueError at once, where the op is built (as Horovod's); a set
    this rank is not in fails when the op runs (InvalidArgumentError)."""
    if process_set is None or process_set is _cl.global_process_set:
        return
    try:
        lifecycle.current().sets.member(process_set, operation)
    except _cl.ProcessSetError as exc:
        if "not registered" in str(exc) or "must be a ProcessSet" in str(exc):
            raise


def _tensor(value) -> tf.Tensor:
    if isinstance(value, tf.IndexedSlices):
        raise TypeError("this collective takes dense tensors; an IndexedSlices goes to allreduce or "
                        "grouped_allreduce, or pass tf.convert_to_tensor(slices)")
    return tf.convert_to_tensor(value)


def _rest(shape: tf.TensorShape) -> list:
    """A shape whose first dimension is unknown (allgather, alltoall, reducescatter outputs)."""
    dims = shape.as_list() if shape.rank is not None else None
    return None if dims is None or not dims else [None] + dims[1:]


def _grad_name(name: str | None, suffix: str) -> str | None:
    return None if name is None else f"{name}.{suffix}"


# --- allreduce ------------------------------------------------------------------------------------------

def _reduce_arrays(arrays, op, name, prescale_factor, postscale_factor, compression, process_set):
    """One commlib call for a list of arrays (Adasum: an allgather each, combined here)."""
    kwargs = set_kwargs(process_set)
    if op is Adasum:
        return [_adasum.allreduce(a, name=None if name is None else f"{name}.{i}",
                                  prescale_factor=prescale_factor, postscale_factor=postscale_factor, **kwargs)
                for i, a in enumerate(arrays)]
    wire = {} if compression is None else {"compression": compression}
    if len(arrays) == 1:
        return [_cl.allreduce(arrays[0], op=op, name=name, prescale_factor=prescale_factor,
                              postscale_factor=postscale_factor, **wire, **kwargs)]
    return _cl.grouped_allreduce(list(arrays), op=op, name=name, prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor, **wire, **kwargs)


def grouped_allreduce_op(tensors: Sequence, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=None, compression=None, ignore_name_scope=False) -> list:
    """Allreduce dense tensors together (one collective, one graph op); differentiable for Sum, Average
    and Adasum."""
    check_set(process_set, "allreduce")
    tensors = [_tensor(t) for t in tensors]
    if not tensors:
        return []
    name = op_name(name, "grouped_allreduce" if len(tensors) > 1 else "allreduce")
    if op is Adasum and process_set is not None and process_set is not _cl.global_process_set \
            and process_set.process_set_id != 0:
        raise NotImplementedError("Adasum does not support non-global process sets yet (as in Horovod)")

    @tf.custom_gradient
    def reduce(*xs):
        outs = run(lambda *arrays: _reduce_arrays(arrays, op, name, prescale_factor, postscale_factor,
                                                  compression, process_set),
                   xs, [x.dtype for x in xs], [x.shape for x in xs], "CommlibAllreduce", name)

        def grad(*dys):
            if op not in _DIFFERENTIABLE_REDUCTIONS:
                raise NotImplementedError(f"the gradient of an allreduce with op={op!r} is not defined; "
                                          "only Sum, Average and Adasum are differentiable")
            dys = [tf.zeros_like(x) if dy is None else tf.convert_to_tensor(dy) for dy, x in zip(dys, xs)]
            return grouped_allreduce_op(dys, _grad_name(name, "grad"), op, prescale_factor, postscale_factor,
                                      process_set)
        return outs, grad

    return list(reduce(*tensors))


def allreduce_op(tensor, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0, process_set=None,
               compression=None, ignore_name_scope=False) -> tf.Tensor:
    return grouped_allreduce_op([tensor], name, op, prescale_factor, postscale_factor, process_set, compression)[0]


# --- allgather ------------------------------------------------------------------------------------------

def grouped_allgather(tensors: Sequence, name=None, ignore_name_scope=False, process_set=None) -> list:
    """Concatenate every rank's tensors along the first dimension (which may differ between ranks)."""
    check_set(process_set, "allgather")
    tensors = [_tensor(t) for t in tensors]
    if not tensors:
        return []
    name = op_name(name, "grouped_allgather" if len(tensors) > 1 else "allgather")
    kwargs = set_kwargs(process_set)

    def gather(*arrays):
        if len(arrays) == 1:
            return [_cl.allgather(arrays[0], name=name, **kwargs)]
        return _cl.grouped_allgather(list(arrays), name=name, **kwargs)

    @tf.custom_gradient
    def forward(*xs):
        outs = run(gather, xs, [x.dtype for x in xs], [_rest(x.shape) for x in xs], "CommlibAllgather", name)

        def grad(*dys):
            dys = [tf.zeros_like(o) if dy is None else tf.convert_to_tensor(dy) for dy, o in zip(dys, outs)]
            reduced = [allreduce_op(dy, _grad_name(name, f"grad{i}"), Average, process_set=process_set)
                       for i, dy in enumerate(dys)]
            counts = grouped_allgather([tf.shape(x, out_type=tf.int64)[:1] for x in xs],
                                       _grad_name(name, "grad_rows"), process_set=process_set)
            me, ranks = set_rank(process_set), set_size(process_set)
            return [tf.split(r, tf.reshape(c, [ranks]), num=ranks, axis=0)[me] for r, c in zip(reduced, counts)]
        return outs, grad

    return list(forward(*tensors))


def allgather(tensor, name=None, ignore_name_scope=False, process_set=None) -> tf.Tensor:
    return grouped_allgather([tensor], name, ignore_name_scope, process_set)[0]


# --- broadcast ------------------------------------------------------------------------------------------

def grouped_broadcast_op(tensors: Sequence, root_rank: int, name=None, process_set=None) -> list:
    check_set(process_set, "broadcast")
    tensors = [_tensor(t) for t in tensors]
    name = op_name(name, "broadcast")
    kwargs = set_kwargs(process_set)

    def cast(*arrays):
        if len(arrays) == 1:
            return [_cl.broadcast(arrays[0], root_rank, name=name, **kwargs)]
        handles = [_cl.broadcast_async(a, root_rank, name=f"{name}.{i}", **kwargs) for i, a in enumerate(arrays)]
        return [np.reshape(_cl.synchronize(h), np.shape(a)) for h, a in zip(handles, arrays)]  # 0-d stays 0-d

    @tf.custom_gradient
    def forward(*xs):
        outs = run(cast, xs, [x.dtype for x in xs], [x.shape for x in xs], "CommlibBroadcast", name)

        def grad(*dys):
            dys = [tf.zeros_like(x) if dy is None else tf.convert_to_tensor(dy) for dy, x in zip(dys, xs)]
            reduced = grouped_allreduce_op(dys, _grad_name(name, "grad"), Average, process_set=process_set)
            if _cl.rank() != root_rank:
                return [r * 0 for r in reduced]
            return reduced
        return outs, grad

    return list(forward(*tensors))


def broadcast(tensor, root_rank: int, name=None, ignore_name_scope=False, process_set=None) -> tf.Tensor:
    """``root_rank``'s ``tensor`` on every rank (``root_rank`` is a world rank, also with a process set)."""
    return grouped_broadcast_op([tensor], int(root_rank), name, process_set)[0]


def broadcast_(variables, root_rank: int, name=None, process_set=None) -> list:
    """Overwrite ``variables`` (a variable or a list) with ``root_rank``'s values, in place; returns the
    updated values."""
    single = not isinstance(variables, (list, tuple))
    variables = [variables] if single else list(variables)
    values = grouped_broadcast_op([v.read_value() if hasattr(v, "read_value") else v for v in variables],
                                int(root_rank), name, process_set) if variables else []
    assigned = [v.assign(x) for v, x in zip(variables, values)]
    if executing_eagerly():
        assigned = [tf.convert_to_tensor(v) for v in variables]
    return assigned[0] if single else assigned


# --- alltoall -------------------------------------------------------------------------------------------

def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=None):
    """Send ``splits[i]`` rows of ``tensor`` to rank i of the set (equal parts by default). Returns the
    received tensor, and with ``splits`` given ``(received, received_splits)`` (as Horovod)."""
    check_set(process_set, "alltoall")
    tensor = _tensor(tensor)
    name = op_name(name, "alltoall")
    kwargs = set_kwargs(process_set)
    split_tensor = tf.zeros([0], tf.int32) if splits is None else tf.cast(tf.convert_to_tensor(splits), tf.int32)
    given = splits is not None

    def exchange(array, split_array):
        out, received = _cl.alltoall(array, splits=split_array if given else None, name=name, **kwargs)
        return [out, np.asarray(received, np.int32)]

    @tf.custom_gradient
    def forward(x):
        out, received = run(exchange, [x, split_tensor], [x.dtype, tf.int32],
                            [_rest(x.shape), [set_size(process_set)]], "CommlibAlltoall", name)

        def grad(dy, _dsplits=None):
            dy = tf.zeros_like(out) if dy is None else tf.convert_to_tensor(dy)
            back, _ = alltoall(dy, splits=received, name=_grad_name(name, "grad"), process_set=process_set)
            return back
        return (out, received), grad

    out, received = forward(tensor)
    return (out, received) if given else out


# --- reducescatter --------------------------------------------------------------------------------------

def grouped_reducescatter_op(tensors: Sequence, name=None, op=Sum, ignore_name_scope=False, process_set=None,
                           prescale_factor=1.0, postscale_factor=1.0) -> list:
    check_set(process_set, "reducescatter")
    tensors = [_tensor(t) for t in tensors]
    if not tensors:
        return []
    name = op_name(name, "reducescatter")
    kwargs = set_kwargs(process_set)
    if op is Adasum:
        raise NotImplementedError("reducescatter does not support Adasum; use op=Sum or op=Average")

    def scatter(*arrays):
        if len(arrays) == 1:
            return [_cl.reducescatter(arrays[0], op=op, name=name, prescale_factor=prescale_factor,
                                      postscale_factor=postscale_factor, **kwargs)]
        return _cl.grouped_reducescatter(list(arrays), op=op, name=name, prescale_factor=prescale_factor,
                                         postscale_factor=postscale_factor, **kwargs)

    @tf.custom_gradient
    def forward(*xs):
        for x in xs:
            if x.shape.rank == 0:
                raise tf.errors.InvalidArgumentError(
                    None, None, f"reducescatter of tensor {name!r}: a scalar has no first dimension to scatter")
        outs = run(scatter, xs, [x.dtype for x in xs], [_rest(x.shape) for x in xs], "CommlibReducescatter", name)

        def grad(*dys):
            if op not in (Sum, Average):
                raise NotImplementedError(f"the gradient of a reducescatter with op={op!r} is not defined")
            scale = prescale_factor * postscale_factor * (set_size(process_set) if op is Sum else 1)
            dys = [tf.zeros_like(o) if dy is None else tf.convert_to_tensor(dy) for dy, o in zip(dys, outs)]
            dys = [dy * tf.cast(scale, dy.dtype) if scale != 1 else dy for dy in dys]
            return grouped_allgather(dys, _grad_name(name, "grad"), process_set=process_set)
        return outs, grad

    return list(forward(*tensors))


def reducescatter_op(tensor, name=None, op=Sum, ignore_name_scope=False, process_set=None, prescale_factor=1.0,
                   postscale_factor=1.0) -> tf.Tensor:
    return grouped_reducescatter_op([tensor], name, op, ignore_name_scope, process_set, prescale_factor,
                                  postscale_factor)[0]


# --- join and barrier -----------------------------------------------------------------------------------

def join(process_set=None) -> tf.Tensor:
    """This rank has no more data: until every rank joined, its allreduces contribute zeros. Returns the
    last rank to join (a tensor, as Horovod's)."""
    kwargs = set_kwargs(process_set)
    return run(lambda: [np.int32(_cl.join(**kwargs))], [], [tf.int32], [[]], "CommlibJoin")[0]


def barrier(process_set=None) -> None:
    """Wait until every rank (of ``process_set``) reached the barrier."""
    kwargs = set_kwargs(process_set)
    if executing_eagerly():
        _cl.barrier(**kwargs)
        return None
    return run(lambda: [np.int32(_cl.barrier(**kwargs) or 0)], [], [tf.int32], [[]], "CommlibBarrier")[0]


__all__ = ["Average", "Sum", "Min", "Max", "Product", "Adasum", "numpy_dtype"]


# Horovod's names for the raw ops (horovod.tensorflow.mpi_ops; horovod.tensorflow re-exports some); commlib's
# own modules call the public names above
_allreduce, _grouped_allreduce, _reducescatter, _grouped_reducescatter, _grouped_broadcast = (
    allreduce_op, grouped_allreduce_op, reducescatter_op, grouped_reducescatter_op, grouped_broadcast_op)
