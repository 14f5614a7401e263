"""Crossing from torch into commlib's numpy API: tensors <-> numpy arrays without copies, and the checks a
tensor passes before it is communicated.

commlib's collectives work on C-contiguous numpy arrays on the host. A contiguous CPU tensor *is* such an
array (``tensor.detach().numpy()`` shares its memory), so nothing is copied in either direction. bfloat16
has no numpy type in torch's bridge; it travels as its 16-bit pattern viewed as ``ml_dtypes.bfloat16``.
"""

from __future__ import annotations

import numpy as np
import torch

from ..device import INSTALL_HINT, cuda_built
from ..dtypes import BFLOAT16, TABLE
from ..errors import CommlibError
from .. import validation

#: torch dtype -> numpy dtype of the same bytes, for every type commlib can communicate (commlib/dtypes.py),
#: except bool, which Horovod's torch binding refuses too.
NUMPY_DTYPES = {getattr(torch, row.torch): row.numpy for row in TABLE if row.kind != "bool"}


class DeviceNotSupportedError(CommlibError, ValueError):
    """The tensor lives on a device commlib has no backend for (only CPU tensors are supported)."""


def check_tensor(tensor, name: str | None, what: str) -> None:
    """Raise a clear error unless ``tensor`` is a contiguous CPU tensor of a supported dtype (and ``name``
    a string or None)."""
    validation.check_name(name, what)
    label = f"{what} of tensor {name!r}" if name else what
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{label}: expected a torch.Tensor, got {type(tensor).__name__}")
    # CUDA tensors go to commlib's API as they are: the coordinator's device path (docs/gpu.md); the
    # torch.distributed backend reaches it through as_array too
    if tensor.device.type != "cpu" and not (tensor.device.type == "cuda" and cuda_built()):
        if tensor.device.type == "cuda":
            raise DeviceNotSupportedError(
                f"{label}: the tensor is on {tensor.device}, but commlib cannot reach CUDA here (cuda_built() is "
                f"False: no CuPy or no visible GPU); {INSTALL_HINT}, or move it to the CPU with tensor.cpu()")
        raise DeviceNotSupportedError(
            f"{label}: the tensor is on device {tensor.device}; commlib.torch only communicates CPU tensors")
    if tensor.is_sparse:
        raise TypeError(f"{label}: sparse tensors cannot be communicated; pass tensor.to_dense()")
    if tensor.dtype not in NUMPY_DTYPES:
        supported = ", ".join(str(d).replace("torch.", "") for d in NUMPY_DTYPES)
        raise TypeError(f"{label}: dtype {tensor.dtype} is not supported; supported dtypes: {supported}")
    if not tensor.is_contiguous():
        raise ValueError(
            f"{label}: the tensor is not contiguous (shape: {tuple(tensor.shape)}, strides: {tensor.stride()}); "
            "commlib communicates tensors in place and never copies behind your back: pass tensor.contiguous()")


def as_array(tensor: torch.Tensor, name: str | None = None, what: str = "collective") -> np.ndarray:
    """The numpy array sharing ``tensor``'s memory, after :func:`check_tensor`."""
    check_tensor(tensor, name, what)
    data = tensor.detach() if tensor.requires_grad else tensor  # (detach costs a GIL release)
    if data.is_cuda:  # commlib's API takes device tensors as they are
        return data
    if data.dtype is torch.bfloat16:
        return data.view(torch.int16).numpy().view(BFLOAT16)
    return data.numpy()


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """The torch tensor sharing ``array``'s memory (the inverse of :func:`as_array`)."""
    if isinstance(array, torch.Tensor):  # a CUDA result comes back as a tensor already
        return array
    if array.dtype == BFLOAT16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
