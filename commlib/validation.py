"""Every check of a request's arguments, in one place.

Two kinds of rule. Arguments whose *type* is wrong (a name that is not a string, a scale factor that is
not a finite number, a root rank that is not an integer, a handle that is not a handle, splits that are
not integers) cannot even be described in a request: ``check_argument``-style functions raise a
TypeError or ValueError on the calling rank, before anything reaches the background coordinator. Every
other rule below is about values the ranks can compare.

Each rule is a function that returns the message every rank will raise ('' when the argument is fine),
so that the API can send a local failure in the request instead of raising alone (the other ranks would
wait for it); ``check_*`` raise the same messages, for the engine and the kernels, which run after the
request was agreed or outside the coordinator. What a dtype may take comes from :mod:`commlib.dtypes`.
"""

from __future__ import annotations

import math
import numbers
import os

import numpy as np

from .coordinator.requests import Handle
from .dtypes import BY_NUMPY, FLOAT32, HALF, supported_names
from .errors import CommlibError, UnsupportedDtypeError
from .ops import ReduceOp


# ---- argument types: raise on the calling rank ---------------------------------------------------------

def _described(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def check_name(name, operation: str):
    """A tensor's name is a string (or None: commlib names it); it is what every rank matches on."""
    if name is None or type(name) is str:
        return name
    if isinstance(name, str):  # a str subclass: its plain value
        return str(name)
    raise TypeError(f"{operation}: name must be a string (or None for an automatic name), not "
                    f"{_described(name)}")


def check_scale_factor(value, argument: str, name: str) -> float:
    """prescale_factor / postscale_factor: a finite real number."""
    if type(value) is float or type(value) is int:  # the usual case, without the ABC check
        number = float(value)
    elif isinstance(value, numbers.Real) and not isinstance(value, np.ndarray):
        number = float(value)
    else:
        raise TypeError(f"{name}: {argument} must be a real number, not {_described(value)}")
    if not math.isfinite(number):
        raise ValueError(f"{name}: {argument} must be finite, got {number}; pass a finite factor "
                         "(1.0 for none)")
    return number


def check_rank_argument(value, argument: str, name: str) -> int:
    """A rank (root_rank): an integer (numpy integers too; not bool, not a float that happens to be whole)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    raise TypeError(f"{name}: {argument} must be an integer rank, not {_described(value)}")


def check_parameter(value, argument: str, owner: str, *, integer: bool = False, low: float | None = None,
                    high: float | None = None, low_open: bool = False, high_open: bool = False):
    """A numeric setting of a compressor or an optimizer wrapper: a finite number (an integer where
    ``integer``) within [low, high] (ends excluded where ``*_open``); returns it as float or int."""
    if integer:
        if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{owner}: {argument} must be an integer, not {_described(value)}")
        number = int(value)
    else:
        if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{owner}: {argument} must be a number, not {_described(value)}")
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"{owner}: {argument} must be finite, got {number}")
    below = low is not None and (number <= low if low_open else number < low)
    above = high is not None and (number >= high if high_open else number > high)
    if below or above:
        span = (f"{'(' if low_open else '['}{'-inf' if low is None else low}, "
                f"{'inf' if high is None else high}{')' if high_open or high is None else ']'}")
        raise ValueError(f"{owner}: {argument} must be in {span}, got {number}")
    return number


def check_handle(handle, function: str, kind=Handle):
    """poll/synchronize take what an ``*_async`` call returned."""
    if isinstance(handle, kind):
        return handle
    raise TypeError(f"{function}() takes a handle returned by an *_async call, not {_described(handle)}")


def check_splits(values, name: str) -> np.ndarray | None:
    """alltoall splits: None, or integers (a list, tuple or integer array), one row count per rank; the
    counts themselves are checked by :func:`splits`."""
    if values is None:
        return None
    if isinstance(values, (str, bytes, dict, set)) or np.isscalar(values):
        raise TypeError(f"{name}: splits must be a sequence of integers (one per rank), not {_described(values)}")
    try:
        array = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name}: splits must be a sequence of integers (one per rank): {exc}") from None
    if array.dtype.kind not in "iu" and not (array.size == 0 and array.dtype.kind == "f"):
        raise TypeError(f"{name}: splits must hold integers (one per rank), not {array.dtype} values "
                        f"{_described(values)}")
    return np.ascontiguousarray(array, dtype=np.int64).reshape(-1)


def check_path(path, argument: str, function: str) -> str:
    """A file path: a string or os.PathLike (an integer would be taken for an open file descriptor)."""
    if isinstance(path, str) and path:
        return path
    if hasattr(path, "__fspath__"):
        return os.fspath(path)
    raise TypeError(f"{function}: {argument} must be a file path (a non-empty string or os.PathLike), not "
                    f"{_described(path)}")


def check_tensor_list(tensors, operation: str) -> list:
    """grouped_* calls take a list (or any iterable, such as ``model.parameters()``) of tensors; a single
    tensor, a string or a mapping is a mistake, not a group."""
    if isinstance(tensors, (list, tuple)):
        return list(tensors)
    single = hasattr(tensors, "shape")
    if not (single or isinstance(tensors, (str, bytes, dict))):
        try:
            return list(tensors)
        except TypeError:
            pass
    raise TypeError(f"{operation}: tensors must be a list of tensors, not {_described(tensors)}"
                    + ("; pass [tensor] for one" if single else ""))


# ---- rules: '' or the message -------------------------------------------------------------------------

def reduction(dtype: np.dtype, op: ReduceOp, name: str) -> str:
    """Whether ``dtype`` can be reduced with ``op``."""
    row = BY_NUMPY.get(dtype)
    if row is None:
        return f"{name}: dtype {dtype} cannot be reduced; supported dtypes: {supported_names()}"
    if op is ReduceOp.AVERAGE and row.kind == "bool":
        return (f"{name}: op Average cannot take dtype bool (the mean of booleans is not a boolean); use "
                "op=Sum (a logical or) or Min (a logical and), or convert to a numeric type")
    return ""


def scaling(dtype: np.dtype, prescale: float, postscale: float, name: str) -> str:
    """Scale factors: floating and integer dtypes (integers as Horovod: float64 product, truncated)."""
    if prescale == 1.0 and postscale == 1.0:
        return ""
    row = BY_NUMPY.get(dtype)
    if row is not None and row.kind == "bool":
        return f"{name}: prescale_factor/postscale_factor need a numeric dtype, not bool"
    return ""


def codec_dtype(codec, dtype: np.dtype, name: str) -> str:
    """A wire codec compresses float32; half types already travel in half precision (the codec then
    changes nothing); no other dtype can take one."""
    dtype = np.dtype(dtype)
    if dtype == FLOAT32 or dtype in HALF:
        return ""
    return f"{name}: {codec!r} compresses float32 tensors, not {dtype}; pass compression=None"


def algorithm(value, known: tuple[str, ...]) -> str:
    """A forced algorithm must be one commlib has: ``known`` is handed by the caller (the names of
    :mod:`commlib.algorithms.spec`'s registry)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        return f"algorithm must be a string (one of: {', '.join(known)}), not {type(value).__name__} {value!r}"
    if value.strip().lower() not in known:
        return f"unknown algorithm {value!r}; use one of: {', '.join(known)}"
    return ""


def contiguous(array: np.ndarray, name: str) -> str:
    """commlib never copies behind the user's back: buffers are C-contiguous."""
    if array.flags.c_contiguous:
        return ""
    return (f"{name}: buffer is not contiguous (shape: {array.shape}, strides: {array.strides}); "
            "pass np.ascontiguousarray(x) or tensor.contiguous()")


def writable(array: np.ndarray, name: str) -> str:
    """An in-place call writes its result into the array."""
    if array.flags.writeable:
        return ""
    return (f"{name}: array is read-only; in-place operations write their result into it "
            "(pass a writable array, or use the out-of-place call)")


def movable(dtype: np.dtype, name: str) -> str:
    """Arrays of Python objects hold pointers, which mean nothing on another rank."""
    if np.dtype(dtype).kind != "O":
        return ""
    return (f"{name}: dtype object (Python objects) cannot be sent; pass a numeric array, or use "
            "broadcast_object/allgather_object for Python objects")


def first_dimension(array: np.ndarray, operation: str, name: str) -> str:
    """allgather, reducescatter and alltoall work on the first dimension."""
    if array.ndim:
        return ""
    return (f"{name}: {operation} works along the first dimension, but the tensor is a scalar; "
            "pass it with one dimension (x.reshape(1))")


def root_rank(root: int, ranks: list[int], set_id: int, name: str) -> str:
    """A broadcast's root is a (world) rank of the set."""
    if root in ranks:
        return ""
    if set_id == 0:
        return f"{name}: root_rank {root} is not a rank (0..{len(ranks) - 1})"
    return f"{name}: root_rank {root} is not in process set {set_id} (ranks {ranks})"


def splits(values, rows: int | None, size: int, name: str) -> str:
    """alltoall splits: one non-negative row count per rank, adding up to the first dimension; without
    splits, the first dimension must divide by the ranks."""
    if values is None:
        if rows is not None and rows % size:
            return (f"{name}: alltoall without splits needs the first dimension ({rows}) to be divisible by "
                    f"the number of ranks ({size}); pass splits=")
        return ""
    if values.size != size or (values < 0).any() or (rows is not None and values.sum() != rows):
        return (f"{name}: splits {values.tolist()} must have one non-negative entry per rank ({size}) "
                f"summing to the first dimension {(rows,) if rows is not None else ()}")
    return ""


def optimizer_momentum(compression, momentum: float, where: str, setting: str = "momentum") -> str:
    """A compressor that applies momentum itself (``compression.applies_momentum``) cannot feed an
    optimizer that applies momentum too: the velocity would be accelerated again, and training diverges."""
    if not getattr(compression, "applies_momentum", False) or not momentum:
        return ""
    return (f"{compression!r} applies momentum itself, but {where} has momentum too ({setting}={momentum}; "
            f"momentum applied twice diverges): set {setting}=0 in the optimizer (the compressor's momentum takes "
            "its place), or use a compressor without momentum such as Compression.topk(...)")


def joined(*messages: str) -> str:
    """The messages that are not empty, as one."""
    return "; ".join(m for m in messages if m)


# ---- the same rules, raising ---------------------------------------------------------------------------

def check_reducible(array: np.ndarray, op: ReduceOp, name: str = "tensor") -> None:
    """Raise :class:`UnsupportedDtypeError` (a TypeError) if ``array`` cannot be reduced with ``op``."""
    message = reduction(array.dtype, op, name)
    if message:
        raise UnsupportedDtypeError(message)


def check_contiguous(array: np.ndarray, name: str = "tensor") -> None:
    message = contiguous(array, name)
    if message:
        raise CommlibError(message)


def check_writable(array: np.ndarray, name: str = "tensor") -> None:
    message = writable(array, name)
    if message:
        raise CommlibError(message)


def check_options(dtype: np.dtype, codec, prescale: float, postscale: float, name: str) -> None:
    """A codec only on float32 (what the engine is handed has passed ``compression`` already, so a half
    dtype here has no codec), scale factors only on numeric dtypes."""
    if codec is not None and dtype != FLOAT32:
        raise TypeError(f"{name}: {codec!r} compresses float32 tensors, not {dtype}; pass codec=None")
    message = scaling(dtype, prescale, postscale, name)
    if message:
        raise UnsupportedDtypeError(message)
