"""SyncBatchNorm: batch normalization with statistics over the batches of all ranks (of a process set).

Forward (training): each rank computes its count, mean and sum of squared deviations per channel; one
allgather brings every rank's triple, combined with Chan's parallel formula (stable where
``E[x^2] - E[x]^2`` cancels), so batch sizes may differ between ranks (a rank may even have none). The
running statistics are updated with the unbiased variance of the combined batch, as BatchNorm does.

Backward: one allreduce (Sum) of the per-channel ``sum(dy)`` and ``sum(dy * xhat)`` gives the input
gradient of the sum of every rank's loss; the weight and bias gradients stay local (the optimizer's
allreduce combines them), as in Horovod and torch.nn.SyncBatchNorm.

In evaluation mode, and on one rank, it is plain batch normalization (no communication).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from . import collectives as C
from .collectives import Sum, set_size


def _channels_view(x):
    """``x`` as (channels, values): every dimension but the second is reduced over."""
    return x.transpose(0, 1).reshape(x.shape[1], -1)


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, process_set):
        values = _channels_view(x).double()
        count = values.shape[1]
        mean = values.mean(dim=1) if count else torch.zeros(values.shape[0], dtype=torch.float64)
        m2 = ((values - mean[:, None]) ** 2).sum(dim=1)
        local = torch.cat([torch.tensor([float(count)], dtype=torch.float64), mean, m2]).reshape(1, -1)
        stats = C.synchronize(C.allgather_async(local, name=None, process_set=process_set))
        counts, means, m2s = stats[:, 0], stats[:, 1:1 + mean.numel()], stats[:, 1 + mean.numel():]
        total = counts.sum()
        if total < 2:
            raise ValueError(f"SyncBatchNorm: expected more than 1 value per channel in training, got {int(total)} "
                             "over all ranks")
        global_mean = (counts[:, None] * means).sum(dim=0) / total
        global_m2 = (m2s + counts[:, None] * (means - global_mean) ** 2).sum(dim=0)
        var = global_m2 / total
        invstd = (var + eps).rsqrt()
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(global_mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_((global_m2 / (total - 1)).to(running_var.dtype),
                                                    alpha=momentum)
        shape = [1, -1] + [1] * (x.dim() - 2)
        xhat = (x.double() - global_mean.view(shape)) * invstd.view(shape)
        out = xhat
        if weight is not None:
            out = out * weight.double().view(shape) + bias.double().view(shape)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.total, ctx.process_set, ctx.shape = total, process_set, shape
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        xhat, invstd, weight = ctx.saved_tensors
        dy = grad.double()
        sum_dy = _channels_view(dy).sum(dim=1)
        sum_dy_xhat = _channels_view(dy * xhat).sum(dim=1)
        local = torch.cat([sum_dy, sum_dy_xhat])
        summed = C.allreduce_now(local, op=Sum, process_set=ctx.process_set)
        channels = sum_dy.numel()
        mean_dy = (summed[:channels] / ctx.total).view(ctx.shape)
        mean_dy_xhat = (summed[channels:] / ctx.total).view(ctx.shape)
        scale = invstd.view(ctx.shape)
        if weight is not None:
            scale = scale * weight.double().view(ctx.shape)
        grad_input = (dy - mean_dy - xhat * mean_dy_xhat) * scale
        grad_weight = grad_bias = None
        if weight is not None:
            grad_weight, grad_bias = sum_dy_xhat.to(weight.dtype), sum_dy.to(weight.dtype)
        return grad_input.to(grad.dtype), grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """BatchNorm whose training statistics cover the batches of every rank (of ``process_set``).

    A drop-in for ``torch.nn.BatchNorm1d/2d/3d`` (any input of shape ``(N, C, ...)``); Horovod's
    ``hvd.SyncBatchNorm``. Batch sizes may differ between ranks.

    Example::

        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), hvd.SyncBatchNorm(8), torch.nn.ReLU())
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_set=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects an input of shape (N, C, ...), got {input.dim()}D input")

    def forward(self, input):
        self._check_input_dim(input)
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked)
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats or set_size(self.process_set) == 1:
            return F.batch_norm(input, self.running_mean if not self.training or self.track_running_stats else None,
                                self.running_var if not self.training or self.track_running_stats else None,
                                self.weight, self.bias, use_batch_stats, momentum, self.eps)
        running = self.track_running_stats
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias,
                                            self.running_mean if running else None,
                                            self.running_var if running else None,
                                            self.eps, momentum, self.process_set)
