"""Differentiable collectives, with the gradients Horovod defines.

- allreduce: the gradient is an allreduce of the gradient with the same op and scale factors.
- grouped_allreduce: the same, per tensor, as one grouped operation.
- allgather: every rank's gradient is averaged over ranks and each rank keeps its own rows.
- broadcast: the gradient is averaged over ranks and kept on the root rank; the others get zeros.
- alltoall: the gradient travels back with the reverse alltoall (the received splits become the sent ones).
- reducescatter: the gradient is an allgather of the gradient, times the pre/postscale factors and, for
  Sum, the number of ranks (Horovod's rule: like allgather's, it treats the loss as the mean of the
  ranks' losses, so Average's gradient carries no 1/size).
- grouped_allgather, grouped_reducescatter: the same, per tensor.

Horovod averages in the gradients of allgather and broadcast (it treats the loss as the mean of the ranks'
losses); we keep that so numbers match when porting a training script. Gradients arriving in backward may
be non-contiguous (e.g. from ``expand``); they are made contiguous here, which is the only copy.
"""

from __future__ import annotations

import torch

import commlib as _cl

from . import collectives as C
from .. import validation
from .collectives import Average, Compression, Sum, resolve_op, set_rank, set_size
from .bridge import check_tensor


def _checked(tensor, name, what):
    """A clear TypeError for what is not a tensor, before autograd or the tensor's own methods see it."""
    if not isinstance(tensor, torch.Tensor):
        check_tensor(tensor, name, what)
    return tensor


def _checked_list(tensors, name, what):
    return [_checked(t, name, f"{what} (tensor {i})") for i, t in enumerate(validation.check_tensor_list(tensors, what))]


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, compression, process_set):
        ctx.op, ctx.prescale, ctx.postscale, ctx.process_set = op, prescale_factor, postscale_factor, process_set
        return C.allreduce_now(tensor, name=name, op=op, prescale_factor=prescale_factor,
                               postscale_factor=postscale_factor, compression=compression,
                               process_set=process_set)

    @staticmethod
    def backward(ctx, grad):
        return (allreduce(grad.contiguous(), op=ctx.op, prescale_factor=ctx.prescale,
                          postscale_factor=ctx.postscale, process_set=ctx.process_set),
                None, None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """Reduce ``tensor`` over the ranks (of ``process_set``) into a new tensor (differentiable).

    Example::

        total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum)
    """
    op = resolve_op(op, average)
    return _Allreduce.apply(_checked(tensor, name, "allreduce"), name, op, prescale_factor, postscale_factor, compression, process_set)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, compression, process_set, *tensors):
        ctx.op, ctx.prescale, ctx.postscale, ctx.process_set = op, prescale_factor, postscale_factor, process_set
        return tuple(C.synchronize(C.grouped_allreduce_async(
            list(tensors), name=name, op=op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, compression=compression, process_set=process_set)))

    @staticmethod
    def backward(ctx, *grads):
        reduced = grouped_allreduce([g.contiguous() for g in grads], op=ctx.op, prescale_factor=ctx.prescale,
                                    postscale_factor=ctx.postscale, process_set=ctx.process_set)
        return (None, None, None, None, None, None, *reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """Reduce a list of tensors as one operation into new tensors (differentiable); returns a list."""
    op = resolve_op(op, average)
    return list(_GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, compression, process_set,
                                        *_checked_list(tensors, name, "grouped_allreduce")))


def _own_rows(grads, rows, process_set):
    """Average ``grads`` (gathered tensors' gradients) over the set and keep this rank's rows of each."""
    reduced = C.synchronize(C.grouped_allreduce_async([g.contiguous() for g in grads], op=Average,
                                                      process_set=process_set))
    counts = C.synchronize(C.grouped_allgather_async([torch.tensor([n], dtype=torch.int64) for n in rows],
                                                     process_set=process_set))
    me = set_rank(process_set)
    return [r.narrow(0, int(c[:me].sum()), n) for r, c, n in zip(reduced, counts, rows)]


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows, ctx.process_set = tensor.shape[0] if tensor.dim() else 0, process_set
        return C.allgather_now(tensor, name=name, process_set=process_set)

    @staticmethod
    def backward(ctx, grad):
        return _own_rows([grad], [ctx.rows], ctx.process_set)[0], None, None


def allgather(tensor, name=None, process_set=None):
    """Concatenate every rank's ``tensor`` along the first dimension (differentiable)."""
    return _Allgather.apply(_checked(tensor, name, "allgather"), name, process_set)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.rows, ctx.process_set = [t.shape[0] if t.dim() else 0 for t in tensors], process_set
        return tuple(C.synchronize(C.grouped_allgather_async(list(tensors), name=name, process_set=process_set)))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *_own_rows(grads, ctx.rows, ctx.process_set))


def grouped_allgather(tensors, name=None, process_set=None):
    """Allgather a list of tensors as one call (differentiable); returns the list of gathered tensors."""
    return list(_GroupedAllgather.apply(name, process_set, *_checked_list(tensors, name, "grouped_allgather")))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return C.broadcast_now(tensor, root_rank, name=name, process_set=process_set)

    @staticmethod
    def backward(ctx, grad):
        reduced = C.allreduce_now(grad.contiguous(), op=Average, process_set=ctx.process_set)
        if _cl.rank() != ctx.root_rank:
            reduced.zero_()
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=None):
    """Return ``root_rank``'s ``tensor`` on every rank as a new tensor (differentiable)."""
    return _Broadcast.apply(_checked(tensor, name, "broadcast"), root_rank, name, process_set)


def _scatter_grads(ctx, grads):
    """Horovod's reducescatter gradient: the gradients times the scale factors (and the set's size for
    Sum), allgathered."""
    if ctx.op not in (Sum, Average):
        raise NotImplementedError(f"the gradient of reducescatter with op {ctx.op!r} is not defined; "
                                  "use op=Sum or op=Average")
    scale = ctx.prescale * ctx.postscale * (set_size(ctx.process_set) if ctx.op is Sum else 1)
    grads = [g.contiguous() if scale == 1.0 else g * scale for g in grads]
    return C.synchronize(C.grouped_allgather_async(grads, process_set=ctx.process_set))


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, compression, op, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.prescale, ctx.postscale, ctx.process_set = op, prescale_factor, postscale_factor, process_set
        return C.synchronize(C.reducescatter_async(tensor, name=name, compression=compression, op=op,
                                                   prescale_factor=prescale_factor,
                                                   postscale_factor=postscale_factor, process_set=process_set))

    @staticmethod
    def backward(ctx, grad):
        return _scatter_grads(ctx, [grad])[0], None, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduce ``tensor`` over the ranks; return this rank's block of the first dimension (differentiable)."""
    return _Reducescatter.apply(_checked(tensor, name, "reducescatter"), name, compression, resolve_op(op), prescale_factor, postscale_factor,
                                process_set)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, compression, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.op, ctx.prescale, ctx.postscale, ctx.process_set = op, prescale_factor, postscale_factor, process_set
        return tuple(C.synchronize(C.grouped_reducescatter_async(
            list(tensors), name=name, compression=compression, op=op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, process_set=process_set)))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, None, None, None, None, *_scatter_grads(ctx, grads))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average, process_set=None,
                          prescale_factor=1.0, postscale_factor=1.0):
    """Reducescatter a list of tensors as one call (differentiable); returns the list of blocks."""
    return list(_GroupedReducescatter.apply(name, compression, resolve_op(op), prescale_factor, postscale_factor,
                                            process_set, *_checked_list(tensors, name, "grouped_reducescatter")))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = C.synchronize(C.alltoall_async(tensor, splits=splits, name=name,
                                                          process_set=process_set))
        ctx.received, ctx.process_set = received, process_set
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, *_unused):
        returned, _ = C.synchronize(C.alltoall_async(grad.contiguous(), splits=ctx.received,
                                                     process_set=ctx.process_set))
        return returned, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Send block ``i`` of ``tensor``'s first dimension to rank ``i`` (differentiable).

    Returns the received tensor, or ``(tensor, received_splits)`` when ``splits`` is given (as Horovod).
    """
    return _Alltoall.apply(_checked(tensor, name, "alltoall"), splits, name, process_set)
