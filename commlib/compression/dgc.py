"""Deep Gradient Compression (Lin et al. 2018; Paddle's DGCMomentumOptimizer).

Per tensor and rank, with momentum ``m``, each step (``g`` the local gradient):

1. local gradient clipping (optional): ``g`` is scaled down to norm ``clip_norm / sqrt(ranks)``;
2. momentum correction: ``u = m*u + g`` and ``v = v + u`` (u and v stay on this rank);
3. the largest ``(1 - sparsity)`` share of ``|v|`` is sent (top-k, :class:`~.base.SparseMessage`);
4. momentum factor masking: ``u`` and ``v`` are zeroed where values were sent (the rest accumulates).

The result is the sum of every rank's sent ``v``: a velocity, momentum already applied. **The wrapped
optimizer must therefore run without momentum** (``torch.optim.SGD(params, lr, momentum=0)``): DGC takes
the place of the optimizer's momentum, as Paddle's DGCMomentumOptimizer does after its warm-up.

Warm-up. Before ``rampup_begin_step`` (counted per tensor) the tensor is allreduced dense and DGC applies
the same momentum to the sum (``U = m*U + sum``, identical on every rank), so the optimizer sees the same
kind of value in both phases. From ``rampup_begin_step`` on, ``sparsity`` walks through its list over
``rampup_step`` steps (each entry for ``rampup_step / len(sparsity)`` steps), then stays at the last
entry; each rank's ``u`` starts from ``U / ranks``. Tensors below ``min_elements`` stay dense with the
dense momentum throughout.
"""

from __future__ import annotations

import math

import numpy as np

from ..validation import check_parameter
from . import kernels
from .base import MIN_ELEMENTS, Compressor, DenseMessage, SparseMessage
from .sparse import count_for

#: Lin et al.'s warm-up: exponentially increasing sparsity.
DEFAULT_SPARSITY = (0.75, 0.9375, 0.984375, 0.996, 0.999)


class DGC(Compressor):
    """Deep Gradient Compression; see the module docstring. State per tensor name: step, u, v, U."""

    kind = "dgc"
    applies_momentum = True  # its result is a velocity (module docstring)

    def __init__(self, momentum: float = 0.9, sparsity=DEFAULT_SPARSITY, rampup_begin_step: int = 0,
                 rampup_step: int = 1, clip_norm: float | None = None, min_elements: int = MIN_ELEMENTS):
        super().__init__()
        if isinstance(sparsity, (str, bytes)) or not hasattr(sparsity, "__iter__"):
            raise TypeError(f"dgc: sparsity must be a list of values in [0, 1), not {sparsity!r}")
        sparsity = tuple(check_parameter(s, "sparsity", "dgc", low=0.0, high=1.0, high_open=True) for s in sparsity)
        if not sparsity:
            raise ValueError("dgc: sparsity must be a non-empty list of values in [0, 1)")
        self.momentum = check_parameter(momentum, "momentum", "dgc", low=0.0, high=1.0, high_open=True)
        self.sparsity = sparsity
        self.rampup_begin_step = check_parameter(rampup_begin_step, "rampup_begin_step", "dgc", integer=True, low=0)
        self.rampup_step = check_parameter(rampup_step, "rampup_step", "dgc", integer=True, low=1)
        self.clip_norm = (None if clip_norm is None else
                          check_parameter(clip_norm, "clip_norm", "dgc", low=0.0, low_open=True))
        self.min_elements = check_parameter(min_elements, "min_elements", "dgc", integer=True, low=0)

    def sparsity_at(self, step: int) -> float | None:
        """The sparsity of step ``step`` (0-based, per tensor); None before the warm-up begins (dense)."""
        if step < self.rampup_begin_step:
            return None
        stage = (step - self.rampup_begin_step) * len(self.sparsity) // self.rampup_step
        return self.sparsity[min(stage, len(self.sparsity) - 1)]

    def start(self, name, buf, exchange):
        state = self.state_of(name)
        step = state.get("step", 0)
        state["step"] = step + 1
        sparsity = self.sparsity_at(step)
        flat = buf.reshape(-1)
        if sparsity is None or flat.size < self.min_elements:
            finish = DenseMessage(flat).start(name, flat, exchange)

            def dense_finish():
                finish()
                self._dense_momentum(state, flat)

            return dense_finish
        if self.clip_norm is not None:
            limit = self.clip_norm / math.sqrt(exchange.size)
            norm = float(np.linalg.norm(flat))
            if norm > limit:
                flat *= np.float32(limit / norm)
        u, v = state.get("u"), state.get("v")
        if u is None:
            dense_u = state.pop("U", None)
            u = state["u"] = (dense_u / np.float32(exchange.size) if dense_u is not None else np.zeros_like(flat))
            v = state["v"] = np.zeros_like(flat)
        kernels.momentum_accumulate(u, v, flat, self.momentum)  # u = m*u + g; v += u
        idx = kernels.topk(v, count_for(1.0 - sparsity, v.size))
        message = SparseMessage(v.size, idx, v[idx])
        v[idx] = 0.0   # momentum factor masking: what was sent leaves both accumulators
        u[idx] = 0.0
        return message.start(name, flat, exchange)

    def _dense_momentum(self, state: dict, total: np.ndarray) -> None:
        """``U = m*U + total``; ``total`` becomes U (identical on every rank: total is)."""
        velocity = state.get("U")
        if velocity is None:
            state["U"] = total.copy()
        else:
            velocity *= self.momentum
            velocity += total
            np.copyto(total, velocity)

    def __repr__(self):
        return (f"DGC(momentum={self.momentum}, sparsity={self.sparsity}, rampup_begin_step="
                f"{self.rampup_begin_step}, rampup_step={self.rampup_step}, clip_norm={self.clip_norm})")
