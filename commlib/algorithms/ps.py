"""``ps``: the allreduce through the summation servers (push_pull, :mod:`commlib.server`).

Not a schedule among the ranks: each rank pushes its buffer's partitions to the servers and receives the
sums. It runs where the context has a server lane (``ctx.servers``, set by the runtime when the job has
servers; this module does not import MPI). ``auto`` does not choose it: the cost model does not know the
servers' links yet, so its predicted time is infinite (docs/servers.md).
"""

from __future__ import annotations

import numpy as np

from ..ops import ReduceOp
from .cost import INF

NO_SERVERS = ("algorithm 'ps' needs summation servers, and this job has none: launch them as extra ranks "
              "of the job, e.g. mpiexec -n 4 python train.py : -n 2 python -m commlib.server "
              "(docs/servers.md)")


def requires(ctx, codec) -> str | None:
    return None if getattr(ctx, "servers", None) is not None else NO_SERVERS


def allreduce(ctx, buf: np.ndarray, op: ReduceOp, codec=None, *, prescale: float = 1.0,
              postscale: float = 1.0) -> int:
    """``buf = postscale * reduce(prescale * buf)`` through the servers; the same bits on every rank."""
    ctx.servers.reduce_(buf, op, codec, prescale, postscale)
    return 0  # the client warns about fp16 overflow itself, naming the key


def cost(model, nbytes: float, shape, codec=None, seg: int = 0) -> float:
    """Unknown to the model (the servers' links are not calibrated): never chosen by ``auto``."""
    return 0.0 if nbytes <= 0 else INF
