"""Framework-neutral rules of Horovod's API surface, read by every plug-in."""

from __future__ import annotations

import warnings
from typing import Sequence, TypeVar

import commlib as _cl

from .. import adasum as _adasum
from ..compression import collective as _compressed
from ..ops import ReduceOp, as_op

T = TypeVar("T")

#: The reduction ops every plug-in exports under Horovod's names (``hvd.Average``, ``hvd.Adasum``, ...).
Average, Sum, Min, Max, Product = _cl.Average, _cl.Sum, _cl.Min, _cl.Max, _cl.Product
Adasum = _adasum.Adasum


def resolve_op(op, average=None) -> ReduceOp:
    """Horovod's rule: ``op`` wins; the deprecated ``average`` flag maps to Average/Sum; default Average."""
    if average is not None:
        if op is not None:
            raise ValueError("pass either op or the deprecated average flag, not both")
        warnings.warn("the average argument is deprecated; use op=Average or op=Sum", DeprecationWarning,
                      stacklevel=3)
        return _cl.Average if average else _cl.Sum
    if op is None:
        return _cl.Average
    return op if op is _adasum.Adasum else as_op(op)


def set_kwargs(process_set) -> dict:
    """The ``process_set=`` argument for commlib's calls: none for the global set (the default)."""
    if process_set is None or process_set is _cl.global_process_set:
        return {}
    return {"process_set": process_set}


def excluded(process_set) -> bool:
    """True when ``process_set`` is a registered set this rank is not part of: Horovod's gradient reductions
    then pass the gradients through unchanged (the rank trains on its own)."""
    return process_set is not None and process_set is not _cl.global_process_set and not process_set.included()


def set_rank(process_set) -> int:
    """This rank's position within ``process_set`` (the world when None)."""
    return _cl.rank() if process_set is None else process_set.rank()


def set_size(process_set) -> int:
    """The number of ranks in ``process_set`` (the world when None)."""
    return _cl.size() if process_set is None else process_set.size()


# --- Horovod-style compressors: compress before the collective, decompress after ------------------------

def horovod_style(compression) -> bool:
    """A Horovod-style compressor, whose framework ``compress``/``decompress`` run in the plug-in
    (commlib's wire codecs and lossy compressors go to commlib's collective as ``compression=``)."""
    return _compressed.horovod_style(compression)


def compress(compression, tensor):
    """``(tensor to send, context)``: Horovod's order, ``compress`` before the collective, for a
    Horovod-style compressor; others leave the tensor as it is."""
    if not horovod_style(compression):
        return tensor, None
    return compression.compress(tensor)


def decompress(compression, tensor, context):
    return compression.decompress(tensor, context) if horovod_style(compression) else tensor


def wire(compression):
    """What commlib's collective gets as ``compression``: none after a Horovod-style compressor."""
    return None if horovod_style(compression) else compression


# --- gradient reduction in optimizer wrappers and tapes ------------------------------------------------

def check_predivide(op, gradient_predivide_factor: float) -> None:
    """Horovod's rule: a predivide factor other than 1 needs ``op=Average``."""
    if gradient_predivide_factor != 1.0 and op is not _cl.Average:
        raise ValueError(f"gradient_predivide_factor={gradient_predivide_factor} needs op=Average "
                         f"(got op={op!r}); leave it at 1.0 for other ops")


def predivide_factors(op, gradient_predivide_factor: float) -> tuple[float, float]:
    """``(prescale, postscale)`` for a gradient reduction: with Average, divide by the factor before the
    sum and multiply it back after (commlib's Average divides by the ranks after the sum)."""
    if op is _cl.Average:
        return 1.0 / gradient_predivide_factor, float(gradient_predivide_factor)
    return 1.0, 1.0


def split_evenly(items: Sequence[T], groups: int) -> list[list[T]]:
    """Horovod's ``groups=n``: ``items`` in order, cut into at most n consecutive groups whose sizes
    differ by one at most (the first groups take the extra items); empty groups are left out."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups should be a positive integer or a list of lists of variables, got {groups!r}")
    base, extra = divmod(len(items), groups)
    out, start = [], 0
    for g in range(groups):
        stop = start + base + (1 if g < extra else 0)
        if stop > start:
            out.append(list(items[start:stop]))
        start = stop
    return out


def local_layer_variables(local_layers) -> list:
    """The trainable variables of ``local_layers``: a Keras layer, a list of them, or None
    (the layers that keep local gradients in Horovod's Partial* wrappers)."""
    if local_layers is None:
        return []
    if not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    return [var for layer in local_layers for var in layer.trainable_weights]
