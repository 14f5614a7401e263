"""commlib's collectives on ``jax.Array``s, eagerly and inside ``jit``, with their gradients.

Each public function checks its arguments, then runs a ``custom_vjp`` whose forward pass crosses into
commlib's numpy API (:mod:`.bridge`) and whose backward pass is the adjoint collective:

=================  ====================================================================
collective         gradient (cotangent ``ct`` of the output, on every rank)
=================  ====================================================================
allreduce Sum      allreduce Sum of ``ct`` (same prescale/postscale); Average likewise
grouped_allreduce  the same, on the pytree of cotangents, as one grouped request
allgather          reducescatter Sum of ``ct``
reducescatter      allgather of ``ct`` (divided by the ranks for Average)
broadcast          allreduce Sum of ``ct`` on the root, zeros elsewhere
alltoall           alltoall of ``ct`` (equal splits)
=================  ====================================================================

Min, Max and Product have no gradient here: differentiating through them raises.

Inside ``jit`` every output shape must be known when tracing, so allgather and alltoall need the same
first dimension on every rank (alltoall: equal splits); a rank whose shape differs fails on every rank,
naming the tensor. Eagerly they take any first dimension, as the numpy API does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import api as _cl
from ..compression import Compression, NoCompression, WireCodec
from ..errors import CommlibError
from ..ops import Average, ReduceOp, Sum, as_op
from . import bridge


# ---- process sets and arguments ------------------------------------------------------------------------

def set_kwargs(process_set) -> dict:
    """The ``process_set=`` argument for commlib's calls (none for the world)."""
    return {} if process_set is None else {"process_set": process_set}


def set_size(process_set) -> int:
    """The ranks in ``process_set`` (the world when None); an unregistered set is an error."""
    size = _cl.size() if process_set is None else process_set.size()
    if size is None:
        raise CommlibError(f"{process_set} is not registered; call commlib.jax.add_process_set first")
    return size


def _set_rank(process_set) -> int:
    return _cl.rank() if process_set is None else process_set.rank()


def reduce_op(op) -> ReduceOp:
    """``op`` as a ReduceOp (Adasum is not one commlib.jax runs)."""
    if getattr(op, "name", None) == "Adasum" and not isinstance(op, ReduceOp):
        raise ValueError("op=Adasum is not available in commlib.jax; use Sum or Average")
    return as_op(op)


def _grad_name(name):
    return None if name is None else f"{name}.grad"


def _shape_of(x) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x))


def _first_dim(x, operation: str, name) -> int:
    if np.ndim(x) == 0:
        raise ValueError(f"{name or operation}: {operation} needs at least one dimension, got a scalar")
    return np.shape(x)[0]


def _with_gradient(forward, backward):
    """``forward`` with ``backward(ct)`` (a tuple, one cotangent per argument) as its VJP."""
    f = jax.custom_vjp(forward)
    f.defvjp(lambda *args: (forward(*args), None), lambda _, ct: backward(ct))
    return f


def _no_gradient(what: str):
    def backward(ct):
        raise TypeError(f"{what} has no gradient in commlib.jax; differentiate through Sum or Average "
                        "instead, or wrap the input in jax.lax.stop_gradient")
    return backward


# ---- allreduce -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Reduce:
    op: ReduceOp
    name: str | None
    prescale: float
    postscale: float
    compression: Any
    process_set: Any

    def kwargs(self) -> dict:
        return dict(op=self.op, name=self.name, prescale_factor=self.prescale, postscale_factor=self.postscale,
                    compression=self.compression, **set_kwargs(self.process_set))

    def backward(self) -> "_Reduce":
        """The reduction the gradient runs: the same, under the name's ``.grad``, without a lossy
        compressor's per-tensor state (its error feedback belongs to the forward tensors)."""
        codec = self.compression if isinstance(self.compression, type(Compression.fp16)) else Compression.none
        return replace(self, name=_grad_name(self.name), compression=codec)


def _grouped_raw(arrays: list, spec: _Reduce) -> list:
    """One grouped request for ``arrays`` (the coordinator fuses them), without a gradient rule."""
    if not arrays:
        return []

    def host(*xs):
        if len(xs) == 1:
            return [np.asarray(_cl.allreduce(xs[0], **spec.kwargs()))]
        return [np.asarray(r) for r in _cl.grouped_allreduce(list(xs), **spec.kwargs())]

    def batched(xs, in_batched):  # elementwise: the batch is one more axis of each tensor
        return _grouped_raw(xs, spec), in_batched

    return bridge.call(host, [_shape_of(x) for x in arrays], arrays, batched)


def _grouped_differentiable(arrays: list, spec: _Reduce) -> list:
    if spec.op in (Sum, Average):
        back = spec.backward()
        f = _with_gradient(lambda *xs: tuple(_grouped_raw(list(xs), spec)),
                           lambda ct: tuple(_grouped_raw(list(ct), back)))
    else:
        f = _with_gradient(lambda *xs: tuple(_grouped_raw(list(xs), spec)),
                           _no_gradient(f"allreduce with op={spec.op.name}"))
    return list(f(*arrays))


def allreduce(tensor, op=Average, name: str | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, compression=Compression.none, process_set=None) -> jax.Array:
    """Reduce ``tensor`` across ranks (``op``: Average (default), Sum, Min, Max, Product).

    ``prescale_factor``/``postscale_factor`` multiply before/after the reduction; ``compression``: any of
    commlib's (``Compression.fp16``, ``.bf16``, lossy ones such as ``Compression.topk(0.01)``, whose state
    is kept per ``name``); ``process_set``: reduce among that set's ranks. Works eagerly and under ``jit``;
    ``jax.grad`` through Sum/Average is the same allreduce of the cotangent.

    Example::

        import commlib.jax as cj, jax, jax.numpy as jnp
        cj.init()
        mean = jax.jit(lambda x: cj.allreduce(x))(jnp.full(4, cj.rank(), jnp.float32))
    """
    spec = _Reduce(reduce_op(op), name, float(prescale_factor), float(postscale_factor), compression, process_set)
    return _grouped_differentiable([jnp.asarray(tensor)], spec)[0]


def grouped_allreduce(tensors, op=Average, name: str | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, compression=Compression.none, process_set=None):
    """Reduce every array of the pytree ``tensors`` (a list, tuple, dict, ...) as one grouped request: the
    coordinator fuses them into as few buffers as its fusion threshold allows. Returns the same structure.
    Arguments as :func:`allreduce`; the arrays are named ``name.0``, ``name.1``, ... in leaf order."""
    leaves, treedef = jax.tree_util.tree_flatten(tensors)
    spec = _Reduce(reduce_op(op), name, float(prescale_factor), float(postscale_factor), compression, process_set)
    return jax.tree_util.tree_unflatten(treedef, _grouped_differentiable([jnp.asarray(x) for x in leaves], spec))


# ---- allgather and reducescatter -----------------------------------------------------------------------

def _allgather_raw(x, name, process_set):
    if bridge.concrete(x):  # eagerly the first dimension may differ between ranks
        return jnp.asarray(np.asarray(_cl.allgather(np.asarray(x), name=name, **set_kwargs(process_set))))
    n, size = _first_dim(x, "allgather", name), set_size(process_set)
    out = jax.ShapeDtypeStruct((n * size,) + tuple(np.shape(x)[1:]), jnp.result_type(x))

    def host(a):
        # Every rank's row count travels with the rows, so that every rank sees a count that differs
        # (the total alone can match by chance) and fails, naming the ranks.
        result, counts = _cl.grouped_allgather([a, np.array([n], np.int64)], name=name,
                                               **set_kwargs(process_set))
        if np.any(counts != n):
            raise CommlibError(f"{name or 'allgather'}: inside jit every rank must gather the same first "
                               f"dimension; rows by rank: {counts.tolist()}. Gather outside jit for "
                               "differing sizes")
        return [np.asarray(result)]

    def batched(xs, in_batched):  # move the batch behind the gathered axis and back
        return [jnp.moveaxis(_allgather_raw(jnp.moveaxis(xs[0], 0, 1), name, process_set), 1, 0)], [True]

    return bridge.call(host, [out], [x], batched)[0]


def _rows(n: int, size: int, rank: int) -> int:
    """Rows of rank ``rank``'s block when ``n`` rows are split over ``size`` ranks (earlier ranks take more)."""
    return n // size + (1 if rank < n % size else 0)


def _reducescatter_raw(x, spec: _Reduce):
    n, size = _first_dim(x, "reducescatter", spec.name), set_size(spec.process_set)
    out = jax.ShapeDtypeStruct((_rows(n, size, _set_rank(spec.process_set)),) + tuple(np.shape(x)[1:]),
                               jnp.result_type(x))

    def host(a):
        return [np.asarray(_cl.reducescatter(a, op=spec.op, name=spec.name, prescale_factor=spec.prescale,
                                             postscale_factor=spec.postscale, **set_kwargs(spec.process_set)))]

    def batched(xs, in_batched):
        return [jnp.moveaxis(_reducescatter_raw(jnp.moveaxis(xs[0], 0, 1), spec), 1, 0)], [True]

    return bridge.call(host, [out], [x], batched)[0]


def allgather(tensor, name: str | None = None, process_set=None) -> jax.Array:
    """Concatenate every rank's ``tensor`` along the first dimension. Eagerly the first dimension may
    differ between ranks; inside ``jit`` it must be the same on every rank. Gradient: the reducescatter
    (Sum) of the cotangent."""
    x = jnp.asarray(tensor)
    _first_dim(x, "allgather", name)

    def backward(ct):
        return (_reducescatter_raw(ct, _Reduce(Sum, _grad_name(name), 1.0, 1.0, None, process_set)),)

    return _with_gradient(lambda a: _allgather_raw(a, name, process_set), backward)(x)


def reducescatter(tensor, op=Average, name: str | None = None, process_set=None, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> jax.Array:
    """Reduce ``tensor`` across ranks and keep this rank's block of the first dimension (earlier ranks take
    the extra rows). Gradient (Sum/Average, first dimension divisible by the ranks): the allgather of the
    cotangent, scaled as the forward pass scaled."""
    x = jnp.asarray(tensor)
    spec = _Reduce(reduce_op(op), name, float(prescale_factor), float(postscale_factor), None, process_set)
    n, size = _first_dim(x, "reducescatter", name), set_size(process_set)

    def backward(ct):
        if spec.op not in (Sum, Average):
            _no_gradient(f"reducescatter with op={spec.op.name}")(ct)
        if n % size:
            raise ValueError(f"{name or 'reducescatter'}: the gradient needs a first dimension divisible by the "
                             f"ranks ({n} rows over {size} ranks)")
        scale = spec.prescale * spec.postscale / (size if spec.op is Average else 1)
        return (_allgather_raw(ct, _grad_name(name), process_set) * jnp.asarray(scale, ct.dtype),)

    return _with_gradient(lambda a: _reducescatter_raw(a, spec), backward)(x)


# ---- broadcast and alltoall ----------------------------------------------------------------------------

def _broadcast_raw(x, root_rank: int, name, process_set):
    def host(a):
        return [np.asarray(_cl.broadcast(a, root_rank, name=name, **set_kwargs(process_set)))]

    def batched(xs, in_batched):
        return [_broadcast_raw(xs[0], root_rank, name, process_set)], in_batched

    return bridge.call(host, [_shape_of(x)], [x], batched)[0]


def broadcast(tensor, root_rank: int, name: str | None = None, process_set=None) -> jax.Array:
    """Return ``root_rank``'s ``tensor`` (a world rank, also with a ``process_set``) on every rank.
    Gradient: the sum of every rank's cotangent on the root, zeros elsewhere."""
    x, root_rank = jnp.asarray(tensor), int(root_rank)

    def backward(ct):
        total = _grouped_raw([ct], _Reduce(Sum, _grad_name(name), 1.0, 1.0, None, process_set))[0]
        return (total if _cl.rank() == root_rank else jnp.zeros_like(ct),)

    return _with_gradient(lambda a: _broadcast_raw(a, root_rank, name, process_set), backward)(x)


def _alltoall_raw(x, name, process_set):
    def host(a):
        output, _ = _cl.alltoall(a, name=name, **set_kwargs(process_set))
        return [np.asarray(output)]

    def batched(xs, in_batched):
        return [jnp.moveaxis(_alltoall_raw(jnp.moveaxis(xs[0], 0, 1), name, process_set), 1, 0)], [True]

    return bridge.call(host, [_shape_of(x)], [x], batched)[0]


def alltoall(tensor, splits=None, name: str | None = None, process_set=None):
    """Send block i of ``tensor``'s first dimension to rank i of the set; return what every rank sent
    here, in rank order. ``splits`` (eagerly only): rows for each rank; then returns ``(output,
    received_splits)``. Without it the first dimension is split equally (and must divide by the ranks).
    Gradient (equal splits): the alltoall of the cotangent."""
    x = jnp.asarray(tensor)
    n, size = _first_dim(x, "alltoall", name), set_size(process_set)
    if splits is not None:
        if not bridge.concrete(x, *jax.tree_util.tree_leaves(splits)):
            raise ValueError(f"{name or 'alltoall'}: splits= needs concrete arrays (call it outside jit): the "
                             "received sizes decide the output shape, which jit must know when tracing")
        output, received = _cl.alltoall(np.asarray(x), splits=np.asarray(splits), name=name,
                                        **set_kwargs(process_set))
        return jnp.asarray(output), jnp.asarray(received)
    if n % size:
        raise ValueError(f"{name or 'alltoall'}: a first dimension of {n} rows does not split equally over "
                         f"{size} ranks; pass splits= (outside jit)")
    return _with_gradient(lambda a: _alltoall_raw(a, name, process_set),
                          lambda ct: (_alltoall_raw(ct, _grad_name(name), process_set),))(x)


def barrier(process_set=None) -> None:
    """Wait until every rank (of ``process_set``) gets here; inside ``jit``, in program order."""
    def host():
        _cl.barrier(**set_kwargs(process_set))
        return []

    bridge.call(host, [], [])


# ---- asynchronous allreduce ----------------------------------------------------------------------------

class _Pending:
    """Requests started inside ``jit`` and not yet synchronized, by the id their start returned."""

    def __init__(self):
        self._handles: dict[int, Any] = {}
        self._next = 0

    def put(self, handle) -> np.int32:
        self._next = (self._next + 1) % (2 ** 31 - 1)
        self._handles[self._next] = handle
        return np.int32(self._next)

    def pop(self, key) -> Any:
        try:
            return self._handles.pop(int(key))
        except KeyError:
            raise CommlibError(f"no pending commlib.jax request with id {int(key)}: each handle is "
                               "synchronized once, in the same jitted function that started it") from None


_pending = _Pending()


class Handle:
    """A started :func:`grouped_allreduce_async`; pass it to :func:`synchronize` once. Inside ``jit`` it
    holds the traced request id and the results' shapes."""

    def __init__(self, request, treedef, results):
        self.request, self.treedef, self.results = request, treedef, results


def grouped_allreduce_async(tensors, op=Average, name: str | None = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, compression=Compression.none,
                            process_set=None) -> Handle:
    """Start :func:`grouped_allreduce` on the pytree ``tensors`` and return at once; :func:`synchronize`
    returns the result. Between the two, this rank may start other collectives, so ranks may start
    *named* requests in different orders (the coordinator matches them by name), also inside ``jit``,
    where the start and the synchronize are two ordered crossings. No gradient flows through it."""
    leaves, treedef = jax.tree_util.tree_flatten(tensors)
    leaves = [jnp.asarray(x) for x in leaves]
    spec = _Reduce(reduce_op(op), name, float(prescale_factor), float(postscale_factor), compression, process_set)

    def start(*xs):
        return _cl.grouped_allreduce_async([np.array(x, order="C") for x in xs], **spec.kwargs())

    results = [_shape_of(x) for x in leaves]
    if bridge.concrete(*leaves):
        return Handle(start(*bridge.host_arrays(leaves)), treedef, results)
    key = bridge.callback(lambda *xs: [_pending.put(start(*xs))], [jax.ShapeDtypeStruct((), jnp.int32)],
                          leaves)[0]
    return Handle(key, treedef, results)


def overlapped_allreduce(tensors, name: str, op=Average, prescale_factor: float = 1.0,
                         postscale_factor: float = 1.0, compression=Compression.none, process_set=None,
                         bucket_bytes: int = 4 << 20):
    """:func:`grouped_allreduce` without a gradient rule that, inside ``jit``, overlaps communication with
    the computation still to come: the arrays go in buckets of about ``bucket_bytes`` (whole arrays, in
    reverse leaf order), each bucket's allreduce starts as an ordered crossing that returns at once, and
    each bucket's results come back in a crossing of their own after all the starts.

    XLA runs a start as soon as its bucket's arrays are computed, so the coordinator sends the last
    layers' gradients while the backward pass is still computing the first layers'; a pytree of layers
    lists the first layer first and the backward pass yields it last, hence the reverse order (a start
    never waits for a later array). The results' crossings come back in the same order, so XLA copies and
    uses the first buckets' results while the last ones are still on the wire. Buckets keep the
    crossings few for models with many small arrays (each crossing costs about 0.1 ms).

    Eagerly, and with a lossy compressor (whose state and exchanges belong to one grouped request):
    :func:`grouped_allreduce` without a gradient. Arrays are named ``name.0``, ``name.1``, ... in leaf
    order, as :func:`grouped_allreduce` names them; ``name`` is required, since the requests of one call
    are in flight together under it."""
    leaves, treedef = jax.tree_util.tree_flatten(tensors)
    leaves = [jnp.asarray(x) for x in leaves]
    spec = _Reduce(reduce_op(op), name, float(prescale_factor), float(postscale_factor), compression, process_set)
    wire_only = compression is None or isinstance(compression, (NoCompression, WireCodec))
    if not leaves or bridge.concrete(*leaves) or not wire_only:
        return jax.tree_util.tree_unflatten(treedef, _grouped_raw(leaves, spec))
    kwargs = spec.kwargs()
    buckets, current, filled = [], [], 0
    for i in reversed(range(len(leaves))):
        current.append(i)
        filled += leaves[i].size * leaves[i].dtype.itemsize
        if filled >= bucket_bytes:
            buckets.append(current)
            current, filled = [], 0
    if current:
        buckets.append(current)

    def start(bucket):
        def host(*xs):  # in place on this crossing's own copies: XLA's buffers are only lent for the call
            return [_pending.put([_cl.allreduce_async_(np.array(x, order="C"), **{**kwargs, "name": f"{spec.name}.{i}"})
                                  for i, x in zip(bucket, xs)])]
        return host

    def finish(key):
        return [np.asarray(_cl.synchronize(h)) for h in _pending.pop(key)]

    keys = [bridge.callback(start(b), [jax.ShapeDtypeStruct((), jnp.int32)], [leaves[i] for i in b])[0]
            for b in buckets]
    outs = [None] * len(leaves)
    for bucket, key in zip(buckets, keys):
        for i, result in zip(bucket, bridge.callback(finish, [_shape_of(leaves[i]) for i in bucket], [key])):
            outs[i] = result
    return jax.tree_util.tree_unflatten(treedef, outs)


def allreduce_async(tensor, op=Average, name: str | None = None, **kwargs) -> Handle:
    """Start :func:`allreduce`; see :func:`grouped_allreduce_async`."""
    return grouped_allreduce_async(tensor, op=op, name=name, **kwargs)


def synchronize(handle: Handle):
    """Wait for ``handle`` and return its result (the pytree it was started with)."""
    if not isinstance(handle, Handle):
        raise TypeError(f"synchronize takes a commlib.jax Handle, not {type(handle).__name__}")
    if not handle.results:
        return jax.tree_util.tree_unflatten(handle.treedef, [])

    def finish(request):
        return [np.asarray(r) for r in _cl.synchronize(request)]

    if isinstance(handle.request, jax.core.Tracer):
        outs = bridge.callback(lambda key: finish(_pending.pop(key)), handle.results, [handle.request])
    else:
        outs = [jnp.asarray(r) for r in finish(handle.request)]
    return jax.tree_util.tree_unflatten(handle.treedef, outs)
