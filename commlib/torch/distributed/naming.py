"""Naming scopes: the calls of the backend's own worker threads count in a sequence of their own.

A group names its k-th call ``<group>.<scope><k mod 64>`` (:mod:`.process_group`). Calls from one thread come
in the same order on every rank; calls from two threads running at once may interleave differently on each
rank, so a thread of the backend that issues calls alongside the program's, in an order of its own that is
the same on every rank (the DDP hooks' worker, the compression worker), names them in a scope of its own.
"""

from __future__ import annotations

import contextlib
import threading

_local = threading.local()  # .label: this thread's scope ("" for the program's threads)


def scope() -> str:
    return getattr(_local, "label", "")


def enter(label: str) -> None:
    """This thread names its calls in scope ``label`` from now on (a thread of the backend's own)."""
    _local.label = label


@contextlib.contextmanager
def naming_scope(label: str):
    """Inside the block, this thread's calls on any commlib group are named in scope ``label``. Every rank
    must issue a scope's calls in the same order."""
    before = scope()
    _local.label = label
    try:
        yield
    finally:
        _local.label = before
