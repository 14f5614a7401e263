"""The helpers Horovod scripts and tests import from ``horovod.common.util``, served by commlib.

A ``horovod`` shim package maps ``horovod.common.util`` here (scripts/horovod_compat.py builds one). The
build queries answer for commlib (MPI yes, Gloo/oneCCL/DDL no); ``env`` sets environment variables for the
duration of a ``with`` block, which is how Horovod's tests pass ``HOROVOD_*`` settings to ``init()``.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Iterator

from .basics import ccl_built, ddl_built, gloo_built, mpi_built, nccl_built  # noqa: F401 (Horovod's names)


@contextlib.contextmanager
def env(**variables: str | None) -> Iterator[None]:
    """Set ``variables`` in ``os.environ`` inside the block (a None value is skipped) and put back what was
    there before, also when the block raises."""
    given = {name: value for name, value in variables.items() if value is not None}
    before = {name: os.environ.get(name) for name in given}
    os.environ.update(given)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def extension_available(ext_base_name: str, verbose: bool = False) -> bool:
    """True for ``horovod.torch`` (commlib.torch is importable here), False for any other framework."""
    return ext_base_name.rsplit(".", 1)[-1] == "torch"


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether CUDA tensors can be communicated (see :func:`commlib.torch.cuda_built`)."""
    from .basics import cuda_built

    return extension_available(ext_base_name) and cuda_built()


def num_rank_is_power_2(num_rank: int) -> bool:
    """True for 1, 2, 4, 8, ... ranks (what Horovod's Adasum requires)."""
    return num_rank > 0 and num_rank & (num_rank - 1) == 0


def split_list(items: list, n: int) -> list[list]:
    """``items`` cut into ``n`` consecutive parts whose lengths differ by at most one, the longer first."""
    base, extra = divmod(len(items), n)
    bounds = [i * base + min(i, extra) for i in range(n + 1)]
    return [items[bounds[i]:bounds[i + 1]] for i in range(n)]


def is_iterable(x) -> bool:
    """Whether ``iter(x)`` works."""
    try:
        iter(x)
    except TypeError:
        return False
    return True


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """``ver >= target`` for dotted versions (``"2.13.0" >= "1.5"``); what follows the numbers
    (``+cpu``, ``rc1``) is ignored."""
    def numbers(text: str) -> tuple[int, ...]:
        match = re.match(r"\d+(?:\.\d+)*", str(text).strip())
        if not match:
            raise ValueError(f"{text!r} is not a version")
        parts = [int(p) for p in match.group(0).split(".")]
        while len(parts) > 1 and parts[-1] == 0:
            parts.pop()
        return tuple(parts)

    return numbers(ver) >= numbers(target)
