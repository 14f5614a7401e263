"""Differentiable collectives, with the gradients Horovod defines.

- allreduce: the gradient is an allreduce of the gradient with the same op and scale factors.
- grouped_allreduce: the same, per tensor, as one grouped operation.
- allgather: every rank's gradient is averaged over ranks and each rank keeps its own rows.
- broadcast: the gradient is averaged over ranks and kept on the root rank; the others get zeros.
- alltoall: the gradient travels back with the reverse alltoall (the received splits become the sent ones).
- reducescatter: the gradient is an allgather of the gradient, times the forward's scale (1/size for
  Average, and the pre/postscale factors).

Horovod averages in the gradients of allgather and broadcast (it treats the loss as the mean of the ranks'
losses); we keep that so numbers match when porting a training script. Gradients arriving in backward may
be non-contiguous (e.g. from ``expand``); they are made contiguous here, which is the only copy.
"""

from __future__ import annotations

import numpy as np
import torch

import commlib as _cl

from . import collectives as C
from .collectives import Average, Compression, Sum, resolve_op


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, compression):
        ctx.op, ctx.prescale, ctx.postscale = op, prescale_factor, postscale_factor
        return C.allreduce_now(tensor, name=name, op=op, prescale_factor=prescale_factor,
                               postscale_factor=postscale_factor, compression=compression)

    @staticmethod
    def backward(ctx, grad):
        return (allreduce(grad.contiguous(), op=ctx.op, prescale_factor=ctx.prescale,
                          postscale_factor=ctx.postscale), None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0):
    """Reduce ``tensor`` over all ranks into a new tensor (differentiable).

    Example::

        total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum)
    """
    op = resolve_op(op, average)
    return _Allreduce.apply(tensor, name, op, prescale_factor, postscale_factor, compression)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, compression, *tensors):
        ctx.op, ctx.prescale, ctx.postscale = op, prescale_factor, postscale_factor
        return tuple(C.synchronize(C.grouped_allreduce_async(
            list(tensors), name=name, op=op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, compression=compression)))

    @staticmethod
    def backward(ctx, *grads):
        reduced = grouped_allreduce([g.contiguous() for g in grads], op=ctx.op, prescale_factor=ctx.prescale,
                                    postscale_factor=ctx.postscale)
        return (None, None, None, None, None, *reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0):
    """Reduce a list of tensors as one operation into new tensors (differentiable); returns a list."""
    op = resolve_op(op, average)
    return list(_GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, compression, *tensors))


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):
        ctx.rows = tensor.shape[0] if tensor.dim() else 0
        return C.allgather_now(tensor, name=name)

    @staticmethod
    def backward(ctx, grad):
        reduced = C.allreduce_now(grad.contiguous(), op=Average)
        rows = _cl.allgather(np.array([ctx.rows], dtype=np.int64))
        offset = int(rows[: _cl.rank()].sum())
        return reduced.narrow(0, offset, ctx.rows), None


def allgather(tensor, name=None):
    """Concatenate every rank's ``tensor`` along the first dimension (differentiable)."""
    return _Allgather.apply(tensor, name)


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank = root_rank
        return C.broadcast_now(tensor, root_rank, name=name)

    @staticmethod
    def backward(ctx, grad):
        reduced = C.allreduce_now(grad.contiguous(), op=Average)
        if _cl.rank() != ctx.root_rank:
            reduced.zero_()
        return reduced, None, None


def broadcast(tensor, root_rank, name=None):
    """Return ``root_rank``'s ``tensor`` on every rank as a new tensor (differentiable)."""
    return _Broadcast.apply(tensor, root_rank, name)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, compression, op, prescale_factor, postscale_factor):
        scale = prescale_factor * postscale_factor
        ctx.op, ctx.scale = op, scale / _cl.size() if op is Average else scale
        return C.synchronize(C.reducescatter_async(tensor, name=name, compression=compression, op=op,
                                                   prescale_factor=prescale_factor,
                                                   postscale_factor=postscale_factor))

    @staticmethod
    def backward(ctx, grad):
        if ctx.op not in (Sum, Average):
            raise NotImplementedError(f"the gradient of reducescatter with op {ctx.op.name} is not defined; "
                                      "use op=Sum or op=Average")
        gathered = C.allgather_now(grad.contiguous())
        if ctx.scale != 1.0:
            gathered.mul_(ctx.scale)
        return gathered, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduce ``tensor`` over all ranks; return this rank's block of the first dimension (differentiable)."""
    return _Reducescatter.apply(tensor, name, compression, resolve_op(op), prescale_factor, postscale_factor)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name):
        output, received = C.synchronize(C.alltoall_async(tensor, splits=splits, name=name))
        ctx.received = received
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, *_unused):
        returned, _ = C.synchronize(C.alltoall_async(grad.contiguous(), splits=ctx.received))
        return returned, None, None


def alltoall(tensor, splits=None, name=None):
    """Send block ``i`` of ``tensor``'s first dimension to rank ``i`` (differentiable).

    Returns the received tensor, or ``(tensor, received_splits)`` when ``splits`` is given (as Horovod).
    """
    return _Alltoall.apply(tensor, splits, name)
