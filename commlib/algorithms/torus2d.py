"""2-D torus allreduce: ranks form an X-by-Y grid; reduce-scatter along rows, allreduce along columns,
allgather along rows (each dimension a ring).

Cost: 2(X-1) alpha + 2(X-1)/X n beta_row + 2(Y-1) alpha + 2(Y-1)/Y (n/X) beta_col.

Grid (``AlgorithmContext.torus``): ``config.torus_shape`` (COMMLIB_TORUS_SHAPE=XxY, rank = y*X + x), else
X = ranks per node and Y = nodes (rows are nodes; needs nodes of equal size). With a codec every phase
carries the wire format (see ring.py).
"""

from __future__ import annotations

import numpy as np

from ..compression import WireCodec
from ..ops import ReduceOp
from ..errors import ConfigError
from . import partition, ring
from .context import torus_layout


def requires(ctx, codec: WireCodec | None = None) -> str | None:
    """Why the grid cannot be formed here (a bad COMMLIB_TORUS_SHAPE, nodes of unequal size), or None."""
    try:
        torus_layout(ctx.topology, ctx.config)
    except ConfigError as exc:
        return str(exc)
    return None


def allreduce(ctx, buf: np.ndarray, op: ReduceOp, codec: WireCodec | None = None, transport=None) -> int:
    if transport is not None and transport is not ctx.transport:
        raise ValueError("torus2d runs on the context's own transport")
    grid = ctx.torus()  # validates the shape even when there is nothing to reduce
    if ctx.size == 1 or buf.size == 0:
        return 0
    nx = grid.shape[0]
    offs = partition.offsets(buf.size, nx)
    x = grid.rows.rank
    overflow = ring.reduce_scatter_(ctx, grid.rows, buf, op, offs, codec)
    overflow += ring.allreduce(ctx, buf[offs[x]:offs[x + 1]], op, codec, transport=grid.cols)
    return overflow + ring.allgather_(ctx, grid.rows, buf, offs, codec)
