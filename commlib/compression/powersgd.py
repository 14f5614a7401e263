"""PowerSGD (Vogels et al. 2019) as PyTorch's ``powerSGD_hook`` defines it.

A tensor of shape (n, ...) is viewed as an n x m matrix M (m = the product of the other dimensions) and
sent as a rank-r approximation, in two allreduces of n*r and m*r values instead of n*m:

    M = grad + error                  (error feedback)
    P = M Q;  allreduce P (sum);  orthogonalize P     (Gram-Schmidt, every rank identically)
    Q = M^T P;  allreduce Q (sum)
    result = P Q^T                    (the sum over ranks of P P^T M_rank)
    error = M - result / ranks        (PyTorch's rule: the local input minus the averaged approximation)

Warm start keeps Q (averaged) for the next step, so one power iteration per step refines it. The first Q
is drawn from ``seed`` and the tensor name: the same on every rank. Like PyTorch: 1-D tensors are
allreduced dense, every tensor is allreduced dense before ``start_step`` (its steps counted per tensor;
error feedback starts at ``start_step``), and so is a matrix whose compression would not save at least
``min_compression_rate`` x the values (n*m < rate * (n+m) * r).
"""

from __future__ import annotations

import numpy as np

from ..validation import check_parameter
from .base import FLOAT32, Compressor, dense_start
from .sparse import name_seed


def orthogonalize_(matrix: np.ndarray, epsilon: float = 1e-8) -> None:
    """Gram-Schmidt on the columns of ``matrix`` in place (``epsilon`` guards vanishing columns)."""
    for i in range(matrix.shape[1]):
        col = matrix[:, i]
        col /= np.float32(np.sqrt(np.dot(col, col)) + epsilon)
        if i + 1 < matrix.shape[1]:
            rest = matrix[:, i + 1:]
            rest -= np.outer(col, col @ rest)


class PowerSGD(Compressor):
    """Rank-``rank`` PowerSGD with error feedback and warm start; see the module docstring."""

    kind = "powersgd"

    def __init__(self, rank: int = 1, start_step: int = 10, min_compression_rate: float = 2.0,
                 use_error_feedback: bool = True, warm_start: bool = True, seed: int = 0):
        super().__init__()
        self.rank = check_parameter(rank, "rank", "powersgd", integer=True, low=1)
        self.start_step = check_parameter(start_step, "start_step", "powersgd", integer=True, low=0)
        self.min_compression_rate = check_parameter(min_compression_rate, "min_compression_rate", "powersgd",
                                                    low=0.0)
        self.use_error_feedback = bool(use_error_feedback)
        self.warm_start = bool(warm_start)
        self.seed = check_parameter(seed, "seed", "powersgd", integer=True)

    def compresses(self, shape: tuple) -> bool:
        """Whether a tensor of ``shape`` is sent as a low-rank approximation (after ``start_step``)."""
        if len(shape) < 2:
            return False
        n, m = shape[0], int(np.prod(shape[1:]))
        r = min(self.rank, n, m)
        return n * m >= self.min_compression_rate * (n + m) * r and r > 0

    def start(self, name, buf, exchange):
        state = self.state_of(name)
        step = state.get("step", 0)
        state["step"] = step + 1
        if step < self.start_step or not self.compresses(buf.shape):
            return dense_start(name, buf, exchange)
        matrix = buf.reshape(buf.shape[0], -1)  # a view: buf is the scratch and the result
        m = matrix.shape[1]
        r = min(self.rank, matrix.shape[0], m)
        if self.use_error_feedback:
            error = state.get("error")
            if error is not None:
                matrix += error
            else:
                error = state["error"] = np.empty_like(matrix)
            np.copyto(error, matrix)  # M; the approximation is subtracted once known
        q = state.get("q") if self.warm_start else None
        if q is None:
            rng = np.random.default_rng([self.seed, name_seed(name)])
            q = rng.standard_normal((m, r)).astype(FLOAT32)
        handle = exchange.allreduce(matrix @ q, name)

        def finish():
            summed_p = exchange.wait(handle)
            orthogonalize_(summed_p)
            summed_q = exchange.wait(exchange.allreduce(np.ascontiguousarray(matrix.T @ summed_p), name + ".q"))
            np.matmul(summed_p, summed_q.T, out=matrix)   # the sum over ranks of P P^T M_rank
            if self.use_error_feedback:
                state["error"] -= matrix / np.float32(exchange.size)
            if self.warm_start:
                state["q"] = summed_q / np.float32(exchange.size)

        return finish

    def __repr__(self):
        return f"PowerSGD(rank={self.rank}, start_step={self.start_step})"
