"""Geo-SGD for torch: a local optimizer whose parameters are merged asynchronously through the servers.

``GeoSGD(optimizer, named_parameters, k=4, staleness=None)`` is a ``torch.optim.Optimizer``: ``step()``
runs the wrapped (local) optimizer, and every ``k`` steps pushes the parameters' change since the last
exchange to the summation servers and continues with the merged parameters they send back, without
waiting for the other workers (:class:`commlib.geo.GeoSGD`, docs/servers.md). CPU parameters only (they
share their memory with the arrays the exchange reads and writes).

Example (``mpiexec -n 4 python train.py : -n 2 python -m commlib.server``)::

    opt = hvd.GeoSGD(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), k=4)
    for x, y in loader:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
    opt.close()   # pushes what is left; the servers stop waiting for this worker
"""

from __future__ import annotations

import torch

from ..geo import FROM_CONFIG, GeoSGD as _GeoCore
from .local_optimizer import LocalOptimizerWrapper
from .bridge import DeviceNotSupportedError


class GeoSGD(LocalOptimizerWrapper):
    """Wraps a local ``optimizer`` (a plain ``torch.optim`` one, not a DistributedOptimizer).

    ``named_parameters``: ``model.named_parameters()`` (default: the optimizer's parameters, named by
    position), the same on every worker; worker 0's values are broadcast at creation. ``k``,
    ``staleness``, ``average``, ``overlap``, ``name``: as :class:`commlib.geo.GeoSGD` (defaults
    ``COMMLIB_GEO_STEPS``, ``COMMLIB_GEO_STALENESS``, average the deltas, overlap the exchange with the
    next steps). ``synchronize()`` waits for the exchange in flight, ``pull()`` fetches the merged
    parameters, ``close()`` ends this worker's part.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters=None, k: int | None = None,
                 staleness=FROM_CONFIG, average: bool = True, overlap: bool = True, name: str = "geo"):
        super().__init__(optimizer, "would also average the gradients every step, synchronously")
        if named_parameters is None:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            named = [(f"param{i}", p) for i, p in enumerate(params)]
        else:
            named = list(named_parameters)
        arrays = []
        for n, p in named:
            if p.device.type != "cpu":
                raise DeviceNotSupportedError(f"GeoSGD: parameter {n!r} is on {p.device}; Geo-SGD exchanges CPU "
                                              "parameters (train on the CPU, or keep a CPU copy of the model)")
            if not p.data.is_contiguous():
                raise ValueError(f"GeoSGD: parameter {n!r} is not contiguous")
            arrays.append((n, p.data.numpy()))  # shares the parameter's memory
        self.geo = _GeoCore(arrays, k=k, staleness=staleness, average=average, overlap=overlap, name=name)

    def __repr__(self):
        return f"GeoSGD({self.optim!r}, k={self.geo.k}, staleness={self.geo.staleness})"

    def state_dict(self):
        return self.optim.state_dict()

    def load_state_dict(self, state_dict):
        self.optim.load_state_dict(state_dict)

    @torch.no_grad()
    def _after_step(self):
        self.geo.step()

    def step(self, closure=None):
        loss = self.optim.step(closure) if closure is not None else self.optim.step()
        self._after_step()
        return loss

    def zero_grad(self, set_to_none: bool = True):
        self.optim.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        raise ValueError("GeoSGD exchanges the parameters it was created with; create it after adding every "
                         "parameter group")

    def synchronize(self) -> None:
        """Wait for the exchange in flight and apply the merged parameters."""
        self.geo.synchronize()

    def pull(self) -> None:
        """Fetch the merged parameters now (local steps not yet pushed are kept on top)."""
        self.geo.pull()

    def close(self) -> None:
        """Push the steps not yet pushed, apply the answer, and leave (other workers stop waiting for this
        one)."""
        self.geo.close()

    @property
    def rounds(self) -> int:
        """Exchanges pushed so far."""
        return self.geo.rounds
