"""The element types commlib reduces, and the checks every buffer passes before it is communicated."""

import ml_dtypes
import numpy as np

from .errors import CommlibError
from .ops import ReduceOp

FLOAT16 = np.dtype(np.float16)
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

#: Types the reduction kernels support, by numpy dtype.
REDUCIBLE = (
    FLOAT16,
    BFLOAT16,
    np.dtype(np.float32),
    np.dtype(np.float64),
    np.dtype(np.int8),
    np.dtype(np.uint8),
    np.dtype(np.int32),
    np.dtype(np.int64),
)

_REDUCIBLE_SET = frozenset(REDUCIBLE)
_NAMES = {d: d.name for d in REDUCIBLE}


def dtype_name(dtype: np.dtype) -> str:
    """``dtype.name`` (which numpy recomputes on every access), looked up for the common types."""
    return _NAMES.get(dtype) or dtype.name


class UnsupportedDtypeError(CommlibError, TypeError):
    """The array's element type cannot take part in the requested operation."""


def check_reducible(array: np.ndarray, op: ReduceOp, name: str = "tensor") -> None:
    """Raise a clear error if ``array`` cannot be reduced with ``op``."""
    if array.dtype not in _REDUCIBLE_SET:
        supported = ", ".join(str(d) for d in REDUCIBLE)
        raise UnsupportedDtypeError(
            f"{name}: dtype {array.dtype} cannot be reduced; supported dtypes: {supported}"
        )
    if op is ReduceOp.AVERAGE and array.dtype.kind in "iu":
        raise UnsupportedDtypeError(
            f"{name}: op Average cannot take integer dtype {array.dtype} (the mean is not an integer); "
            "use op=Sum and divide, or convert to a floating type"
        )


def check_contiguous(array: np.ndarray, name: str = "tensor") -> None:
    """Raise a clear error if ``array`` is not C-contiguous (commlib never copies behind your back)."""
    if not array.flags.c_contiguous:
        raise CommlibError(
            f"{name}: buffer is not contiguous (shape: {array.shape}, strides: {array.strides}); "
            "pass np.ascontiguousarray(x) or tensor.contiguous()"
        )


def check_writable(array: np.ndarray, name: str = "tensor") -> None:
    """Raise a clear error if an in-place operation cannot write into ``array``."""
    if not array.flags.writeable:
        raise CommlibError(f"{name}: array is read-only; in-place operations write their result into it "
                           "(pass a writable array, or use the out-of-place call)")
