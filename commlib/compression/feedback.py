"""Wrappers that compose with any encoder: error feedback and momentum (BytePS's decorators).

``ErrorFeedback(c)``: each step sends ``c``'s message for ``gradient + residual`` and keeps as the new
residual what that message did not carry. Over any number of steps, what was sent plus the residual equals
the sum of the gradients fed in, so nothing is lost, only delayed (Seide et al. 2014; Karimireddy et al.
2019).

``Momentum(c, mu)``: applies momentum before compressing (``m = mu*m + g``; sends ``g + mu*m`` with
Nesterov, else ``m``): use it with an optimizer that has no momentum of its own.
"""

from __future__ import annotations

import numpy as np

from ..validation import check_parameter
from .base import Encoder


class ErrorFeedback(Encoder):
    """Error feedback around ``inner`` (an Encoder); residuals are kept per tensor name."""

    kind = "error_feedback"

    def __init__(self, inner: Encoder):
        if not isinstance(inner, Encoder):
            raise TypeError(f"error_feedback wraps a per-tensor encoder (topk, randomk, onebit, momentum), "
                            f"not {inner!r}")
        super().__init__(inner.min_elements)
        self.inner = inner

    def encode(self, name, flat):
        state = self.state_of(name)
        residual = state.get("residual")
        if residual is not None:
            if residual.size != flat.size:
                raise ValueError(f"{name}: error feedback holds a residual of {residual.size} elements, the "
                                 f"tensor has {flat.size}; call reset() when a tensor changes shape")
            flat += residual
        else:
            residual = state["residual"] = np.empty_like(flat)
        message = self.inner.encode(name, flat)
        np.copyto(residual, flat)
        message.subtract_from(residual)
        return message

    def inner_encoders(self):
        return [self.inner]

    def __repr__(self):
        return f"ErrorFeedback({self.inner!r})"


class Momentum(Encoder):
    """Momentum applied before ``inner`` compresses (per tensor name)."""

    kind = "momentum"
    applies_momentum = True

    def __init__(self, inner: Encoder, mu: float = 0.9, nesterov: bool = False):
        if not isinstance(inner, Encoder):
            raise TypeError(f"momentum wraps a per-tensor encoder, not {inner!r}")
        super().__init__(inner.min_elements)
        self.inner = inner
        self.mu = check_parameter(mu, "mu", "momentum", low=0.0, high=1.0, high_open=True)
        self.nesterov = bool(nesterov)

    def encode(self, name, flat):
        state = self.state_of(name)
        m = state.get("momentum")
        if m is None:
            m = state["momentum"] = np.zeros_like(flat)
        m *= self.mu
        m += flat
        if self.nesterov:
            flat += self.mu * m
        else:
            np.copyto(flat, m)
        return self.inner.encode(name, flat)

    def inner_encoders(self):
        return [self.inner]

    def __repr__(self):
        return f"Momentum({self.inner!r}, mu={self.mu}, nesterov={self.nesterov})"
