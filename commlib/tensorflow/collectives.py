"""horovod.tensorflow's public collectives: ``op``/``average`` resolution, compression around the
collective, ``tf.IndexedSlices`` (two allgathers, as Horovod), and the ``process_set`` a rank is not in."""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

import commlib as _cl

from ..frameworks import resolve_op, set_size
from . import mpi_ops as M
from .compression import Compression, split

Average, Sum, Min, Max, Product, Adasum = M.Average, M.Sum, M.Min, M.Max, M.Product, M.Adasum


def _sparse_op(op) -> None:
    if op is Adasum:
        raise NotImplementedError("The Adasum reduction does not support sparse tensors; pass "
                                  "sparse_as_dense=True to DistributedOptimizer / DistributedGradientTape")
    if op is not Sum and op is not Average:
        raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")


def _sparse(slices: Sequence[tf.IndexedSlices], op, prescale_factor, postscale_factor, name, process_set):
    """IndexedSlices reduced as Horovod does: allgather the values and the indices (one grouped call)."""
    _sparse_op(op)
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")
    gathered = M.grouped_allgather([s.values for s in slices] + [s.indices for s in slices], name=name,
                                   process_set=process_set)
    values, indices = gathered[:len(slices)], gathered[len(slices):]
    if op is Average:
        ranks = set_size(process_set)
        values = [v / tf.cast(ranks, v.dtype) if v.dtype.is_floating else v / ranks for v in values]
    return [tf.IndexedSlices(v, i, dense_shape=s.dense_shape) for v, i, s in zip(values, indices, slices)]


def _dense(tensors: Sequence, op, prescale_factor, postscale_factor, name, process_set, compression) -> list:
    """Dense tensors reduced in as few calls as the compression allows (one, usually)."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    plans = [split(compression, t.dtype) for t in tensors]
    sent, contexts = [], []
    for t, (around, _) in zip(tensors, plans):
        value, ctx = around.compress(t) if around is not None else (t, None)
        sent.append(value)
        contexts.append(ctx)
    by_wire: dict[int, list[int]] = {}
    wires = {}
    for i, (_, wire) in enumerate(plans):
        by_wire.setdefault(id(wire), []).append(i)
        wires[id(wire)] = wire
    out = [None] * len(tensors)
    for n, (key, members) in enumerate(by_wire.items()):
        part_name = name if len(by_wire) == 1 or name is None else f"{name}.{n}"
        reduced = M.grouped_allreduce_op([sent[i] for i in members], part_name, op, prescale_factor,
                                       postscale_factor, process_set, wires[key])
        for i, r in zip(members, reduced):
            around = plans[i][0]
            out[i] = around.decompress(r, contexts[i]) if around is not None else r
    return out


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=_cl.global_process_set,
                      ignore_name_scope=False, name=None) -> list:
    """Reduce a list of ``tf.Tensor``/``tf.Variable``/``tf.IndexedSlices`` across ranks together.

    Dense tensors travel in one collective (one graph op); IndexedSlices are allgathered (values and
    indices). ``op``: Average (default), Sum, Min, Max, Product, Adasum."""
    if not tensors:
        return list(tensors)
    op = resolve_op(op, average)
    tensors = list(tensors)
    out = [None] * len(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    if sparse:
        reduced = _sparse([tensors[i] for i in sparse], op, prescale_factor, postscale_factor,
                          None if name is None else f"{name}.sparse", process_set)
        for i, r in zip(sparse, reduced):
            out[i] = r
    if dense:
        reduced = _dense([tensors[i] for i in dense], op, prescale_factor, postscale_factor, name, process_set,
                         compression)
        for i, r in zip(dense, reduced):
            out[i] = r
    return out


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=_cl.global_process_set,
              ignore_name_scope=False):
    """Reduce ``tensor`` (a ``tf.Tensor``, ``tf.Variable`` or ``tf.IndexedSlices``) across ranks.

    Example::

        import tensorflow as tf, commlib.tensorflow as hvd
        hvd.init()
        total = hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum)
    """
    return grouped_allreduce([tensor], average, device_dense, device_sparse, compression, op, prescale_factor,
                             postscale_factor, process_set, ignore_name_scope, name)[0]


def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=_cl.global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduce ``tensor`` and give each rank its block of the first dimension (earlier ranks take the
    extra rows)."""
    return grouped_reducescatter([tensor], device_dense, compression, op, name, process_set, ignore_name_scope,
                                 prescale_factor, postscale_factor)[0]


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average, name=None,
                          process_set=_cl.global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                          postscale_factor=1.0) -> list:
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    plans = [split(compression, t.dtype)[0] for t in tensors]
    sent = [a.compress(t) if a is not None else (t, None) for t, a in zip(tensors, plans)]
    out = M.grouped_reducescatter_op([s for s, _ in sent], name, resolve_op(op), ignore_name_scope, process_set,
                                   prescale_factor, postscale_factor)
    return [a.decompress(o, ctx) if a is not None else o for o, a, (_, ctx) in zip(out, plans, sent)]


allgather = M.allgather
grouped_allgather = M.grouped_allgather
broadcast = M.broadcast
broadcast_ = M.broadcast_
alltoall = M.alltoall
join = M.join
barrier = M.barrier
