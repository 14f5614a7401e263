"""Adasum, as Horovod defines it: gradients combined pairwise, recursively, instead of summed.

Two vectors combine as ``(1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b`` (a coefficient is 1 when
its vector's squared norm is below sqrt(DBL_MIN), as in Horovod's ``adasum.h``); dot products and norms
accumulate in float64 and the combination is computed in float64, then stored in the tensor's dtype. For
orthogonal gradients this is their sum, for equal ones their average.

Order of combination (the result depends on it). For ``2^k`` ranks it is Horovod's tree: level 0
combines ranks (0,1), (2,3), ...; level 1 combines the pairs ((0,1),(2,3)), ...; up to one vector.
Horovod refuses other rank counts (issue #3400). Here, with ``n = 2^k + m`` ranks (``0 < m < 2^k``),
rank ``2^k + i`` is first combined into rank ``i`` (for ``i < m``), then the ``2^k`` results go through
the tree: every rank takes part, with one extra pairwise step, as Rabenseifner's allreduce folds
surplus ranks. On 3 ranks the result is ``adasum(adasum(g0, g2), g1)``.

Communication: every rank allgathers the flattened tensors and evaluates the same tree locally, in the
same order, so all ranks hold bit-identical results. That costs ``size x`` the tensor's bytes of traffic
and memory per rank (Horovod's vector-halving exchange costs about 2x): exact and simple, not fast.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from . import api, validation
from .errors import CommlibError

_TINY = math.sqrt(sys.float_info.min)  # Horovod's sqrt(DBL_MIN)


class AdasumOp:
    """The ``Adasum`` reduction: pass ``op=Adasum`` to ``commlib.torch.allreduce`` (or call
    :func:`allreduce` here). It is not an elementwise op: reducescatter and the kernels refuse it."""

    name = "ADASUM"

    def __repr__(self) -> str:
        return "Adasum"

    def __reduce__(self):
        return "Adasum"


Adasum = AdasumOp()


def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The pairwise Adasum of two vectors of the same shape, in float64."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    dot = float(np.dot(a.ravel(), b.ravel()))
    anormsq = float(np.dot(a.ravel(), a.ravel()))
    bnormsq = float(np.dot(b.ravel(), b.ravel()))
    acoeff = 1.0 - dot / anormsq * 0.5 if anormsq >= _TINY else 1.0
    bcoeff = 1.0 - dot / bnormsq * 0.5 if bnormsq >= _TINY else 1.0
    return acoeff * a + bcoeff * b


def reduce(vectors, dtype=None) -> np.ndarray:
    """Adasum of ``vectors`` (one per rank, in rank order), in the order described above. Each step's
    result is stored in ``dtype`` (default: the first vector's), as a rank would hold it."""
    vectors = list(vectors)
    if not vectors:
        raise ValueError("Adasum needs at least one vector")
    dtype = np.dtype(dtype or np.asarray(vectors[0]).dtype)
    level = [np.asarray(v) for v in vectors]
    power = 1 << (len(level).bit_length() - 1)
    for i in range(len(level) - power):  # fold the ranks beyond the largest power of two
        level[i] = combine(level[i], level[power + i]).astype(dtype)
    level = level[:power]
    while len(level) > 1:
        level = [combine(level[j], level[j + 1]).astype(dtype) for j in range(0, len(level), 2)]
    return level[0].astype(dtype, copy=False)


def check_dtype(dtype: np.dtype, name: str) -> None:
    """Adasum is defined for floating tensors only (Horovod: float16, float32, float64)."""
    if np.dtype(dtype).kind != "f":
        raise CommlibError(f"{name}: Adasum needs a floating dtype (float16, float32, float64), not {dtype}")


def prepare(array: np.ndarray, name: str, prescale_factor: float = 1.0,
            postscale_factor: float = 1.0) -> np.ndarray:
    """What a rank contributes to the allgather: its tensor flattened to one row, prescaled (both factors
    are checked here, before anything is sent)."""
    prescale_factor = validation.check_scale_factor(prescale_factor, "prescale_factor", name)
    validation.check_scale_factor(postscale_factor, "postscale_factor", name)
    check_dtype(array.dtype, name)
    flat = array.reshape(1, -1)
    if prescale_factor != 1.0:
        flat = (flat.astype(np.float64) * prescale_factor).astype(array.dtype)
    return flat


def finish(gathered: np.ndarray, like: np.ndarray, postscale_factor: float = 1.0) -> np.ndarray:
    """Every rank's row combined (:func:`reduce`), postscaled, in ``like``'s shape and dtype."""
    result = reduce(gathered, like.dtype)
    if postscale_factor != 1.0:
        result = (result.astype(np.float64) * postscale_factor).astype(like.dtype)
    return result.reshape(like.shape)


def allreduce(array, name: str | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              **kwargs) -> np.ndarray:
    """Adasum of ``array`` over the ranks (a new array of the same shape and dtype). ``kwargs`` (e.g.
    ``process_set``) go to the allgather underneath."""
    array = np.ascontiguousarray(array)
    flat = prepare(array, validation.check_name(name, "adasum") or "adasum", prescale_factor, postscale_factor)
    gathered = api.allgather(flat, name=None if name is None else f"{name}.adasum", **kwargs)
    return finish(gathered, array, postscale_factor)
