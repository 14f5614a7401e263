"""The element types commlib communicates: one table that everything reads.

Each row names a dtype as numpy, torch and MPI know it, and the code of commlib's C kernels (the codes
are numbered once, in ``csrc/kernels.h``, and exported by ``commlib._kernels``). What each kind may take
(commlib/validation.py applies it):

- floating (float16, bfloat16, float32, float64): every op, scale factors, Average;
- integer (uint8, int8, int16, int32, int64): every op; Average and scale factors as Horovod on the CPU
  (the product in float64, truncated toward zero; an Average is a Sum times 1/size so);
- bool: Sum and Max are a logical or, Product and Min a logical and (as numpy reduces bools); no Average
  and no scale factors.

These are the dtypes of Horovod's torch binding, plus bfloat16, and bool (which commlib.torch refuses, as
Horovod's torch binding does). Any fixed-size dtype can still be moved (allgather, broadcast, alltoall move
bytes); only reductions need a row here.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

from . import _kernels
from .errors import UnsupportedDtypeError  # noqa: F401  (re-exported: raised for a dtype outside the table)

FLOAT16 = np.dtype(np.float16)
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT32 = np.dtype(np.float32)


@dataclasses.dataclass(frozen=True)
class DType:
    """One element type. ``mpi``: the mpi4py datatype whose arithmetic MPI's own reduction uses, or None
    when commlib's kernels reduce it inside MPI (a user-defined MPI op: half types and bool)."""

    numpy: np.dtype
    code: int
    torch: str
    mpi: str | None
    kind: str   # "float", "int" or "bool"

    @property
    def name(self) -> str:
        return self.numpy.name


TABLE: tuple[DType, ...] = (
    DType(FLOAT16, _kernels.FLOAT16, "float16", None, "float"),
    DType(BFLOAT16, _kernels.BFLOAT16, "bfloat16", None, "float"),
    DType(FLOAT32, _kernels.FLOAT32, "float32", "FLOAT", "float"),
    DType(np.dtype(np.float64), _kernels.FLOAT64, "float64", "DOUBLE", "float"),
    DType(np.dtype(np.uint8), _kernels.UINT8, "uint8", "UINT8_T", "int"),
    DType(np.dtype(np.int8), _kernels.INT8, "int8", "INT8_T", "int"),
    DType(np.dtype(np.int16), _kernels.INT16, "int16", "INT16_T", "int"),
    DType(np.dtype(np.int32), _kernels.INT32, "int32", "INT32_T", "int"),
    DType(np.dtype(np.int64), _kernels.INT64, "int64", "INT64_T", "int"),
    DType(np.dtype(np.bool_), _kernels.BOOL, "bool", None, "bool"),
)

BY_NUMPY: dict[np.dtype, DType] = {row.numpy: row for row in TABLE}

#: The dtypes commlib reduces, in table order.
REDUCIBLE: tuple[np.dtype, ...] = tuple(row.numpy for row in TABLE)
#: The C kernels' code for each reducible dtype.
CODES: dict[np.dtype, int] = {row.numpy: row.code for row in TABLE}
#: Floating dtypes (scale factors keep their fraction) and the half types (accumulated in float32).
FLOATING = frozenset(row.numpy for row in TABLE if row.kind == "float")
HALF = frozenset((FLOAT16, BFLOAT16))

_NAMES = {row.numpy: row.name for row in TABLE}


def dtype_name(dtype: np.dtype) -> str:
    """``dtype.name`` (which numpy recomputes on every access), looked up for the common types."""
    return _NAMES.get(dtype) or dtype.name


def supported_names() -> str:
    return ", ".join(row.name for row in TABLE)
