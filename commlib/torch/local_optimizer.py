"""The base of optimizers that wrap a local ``torch.optim`` optimizer and exchange parameters themselves
(LocalSGD's :class:`~commlib.torch.averagers.LocalSGDOptimizer`, Geo-SGD's :class:`~commlib.torch.geo.GeoSGD`):
one check of what they may wrap, and the wrapped optimizer's groups, state and defaults seen through them."""

from __future__ import annotations

import torch


class LocalOptimizerWrapper(torch.optim.Optimizer):
    """Holds ``optimizer`` as ``self.optim``; refuses what is not a plain local optimizer, naming
    ``why_not_distributed`` (why a DistributedOptimizer inside would be wrong)."""

    def __init__(self, optimizer: torch.optim.Optimizer, why_not_distributed: str):
        kind = type(self).__name__
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"{kind} wraps a torch.optim.Optimizer, not {type(optimizer).__name__}")
        if type(optimizer).__name__ == "DistributedOptimizer":
            raise TypeError(f"{kind} wraps a local optimizer; a DistributedOptimizer {why_not_distributed}")
        self.optim = optimizer

    @property
    def param_groups(self):
        return self.optim.param_groups

    @property
    def state(self):
        return self.optim.state

    @property
    def defaults(self):
        return self.optim.defaults
