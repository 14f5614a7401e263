"""Tensor fusion: which ready allreduces share one buffer (packed into it by :func:`commlib.buffers.pack`).

Policy (measured on this machine, see docs/coordinator.md): a copy costs as much as ~1/3 of the
transfer it saves, and a per-call overhead of tens to hundreds of microseconds is paid per collective.
Ready allreduces that agree on everything that must agree (dtype, op, scale factors, compression,
algorithm, joined ranks) form one group. In a group, tensors under ``fusion_inplace_bytes`` are packed
into one reused buffer of at most ``fusion_threshold_bytes`` (their copies are cheap, the calls they save
are not); larger ones are never copied: the group is reduced in one pass over the packed buffer and the
large tensors in place (``Engine.allreduce_many_``, with the ring or cma algorithm). Where the group runs
cma, whose one pass costs little more per buffer, only tensors whose copies cost less than that are packed
(``Engine.group_inplace_bytes``). The threshold bounds
the fusion buffer, so in-place tensors do not count against it: gradients all ready at once run as one
group rather than several (docs/results/design_choices.md).
Device tensors fuse only with device tensors, and every one of them is packed (on the device, in one
kernel: :mod:`.device_path`), so the threshold bounds the whole of a device group.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from .requests import Kind, Meta, Response


def fuse(responses: list[Response], threshold_bytes: int, inplace_bytes: int,
         apart: Callable[[Meta], bool] = lambda meta: False) -> list[Response]:
    """Merge compatible allreduce responses into groups whose packed tensors (those under
    ``inplace_bytes``) hold at most ``threshold_bytes``; keep everything else as it is, in order, and
    so the tensors ``apart`` names (eager ones: their data has arrived already). A threshold of 0 turns
    fusion off."""
    if len(responses) < 2:
        return responses
    out: list[Response] = []
    open_groups: dict[tuple, list] = {}   # key -> [group's response, packed bytes, its index in out]
    for response in responses:
        if (response.kind is not Kind.ALLREDUCE or response.error or len(response.metas) != 1
                or apart(response.metas[0])):
            out.append(response)
            continue
        meta = response.metas[0]
        # bytes it adds to the fusion buffer (a device group packs every tensor: the threshold bounds all)
        nbytes = meta.nbytes if meta.nbytes < inplace_bytes or meta.device != "cpu" else 0
        if threshold_bytes <= 0 or nbytes > threshold_bytes:
            out.append(response)
            continue
        key = meta.fusion_key() + (response.joined,)
        group = open_groups.get(key)
        if group is not None and group[1] + nbytes <= threshold_bytes:
            if len(group[0].metas) == 1:  # a new object: the ready table hands out shared responses
                group[0] = out[group[2]] = dataclasses.replace(group[0], metas=list(group[0].metas))
            group[0].metas.append(meta)
            group[1] += nbytes
        else:
            open_groups[key] = [response, nbytes, len(out)]
            out.append(response)
    return out
