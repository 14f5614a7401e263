"""Tensor fusion: which ready allreduces share one buffer, and packing them into it.

Policy (measured on this machine, see docs/coordinator.md): a copy costs as much as ~1/3 of the
transfer it saves, and a per-call overhead of tens to hundreds of microseconds is paid per collective.
Ready allreduces that agree on everything that must agree (dtype, op, scale factors, compression,
algorithm, joined ranks) form one group of at most ``fusion_threshold_bytes``. In a group, tensors under
``fusion_inplace_bytes`` are packed into one reused buffer (their copies are cheap, the calls they save
are not); larger ones are never copied: the group is reduced in one ring pass over the packed buffer and
the large tensors in place (``Engine.allreduce_many_``).
"""

from __future__ import annotations

import numpy as np

from .requests import Kind, Response


def fuse(responses: list[Response], threshold_bytes: int) -> list[Response]:
    """Merge compatible allreduce responses into groups; keep everything else as it is, in order."""
    out: list[Response] = []
    open_groups: dict[tuple, tuple[Response, int]] = {}
    for response in responses:
        if response.kind is not Kind.ALLREDUCE or response.error or len(response.metas) != 1:
            out.append(response)
            continue
        meta = response.metas[0]
        nbytes = meta.nbytes
        if threshold_bytes <= 0 or nbytes > threshold_bytes:
            out.append(response)
            continue
        key = meta.fusion_key() + (response.joined,)
        group = open_groups.get(key)
        if group is not None and group[1] + nbytes <= threshold_bytes:
            fused, used = group
            fused.metas.append(meta)
            fused.cache_ids = fused.cache_ids + response.cache_ids
            open_groups[key] = (fused, used + nbytes)
        else:
            open_groups[key] = (response, nbytes)
            out.append(response)
    return out


def pack(arrays: list[np.ndarray], buffer: np.ndarray) -> None:
    """Copy ``arrays`` one after another into the flat ``buffer``."""
    offset = 0
    for array in arrays:
        count = array.size
        buffer[offset:offset + count] = array.reshape(-1)
        offset += count


def unpack(buffer: np.ndarray, arrays: list[np.ndarray]) -> None:
    """Copy the flat ``buffer`` back into ``arrays`` (the inverse of :func:`pack`)."""
    offset = 0
    for array in arrays:
        count = array.size
        array.reshape(-1)[...] = buffer[offset:offset + count]
        offset += count
