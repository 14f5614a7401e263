"""What the ``commlib`` backend needs from commlib beyond its public API, in one place.

commlib's public functions cover every collective the backend runs. Three things are not public yet: the
runtime's settings (the backend reads its defaults from them), an asynchronous barrier, and a transport
for point-to-point messages on a communicator of the backend's own (``send``/``recv`` have no collective
to negotiate). They are reached here and nowhere else in the backend, so that when commlib's documented
internal interface for plug-ins lands (``commlib/lifecycle.py``) this is the one file to change.
"""

from __future__ import annotations

import numpy as np

from ... import api
from ...coordinator.requests import AUTO_NAME_MARK, Handle, Kind


def runtime():
    """The runtime ``commlib.init()`` created (raises commlib's "not initialized" error otherwise)."""
    return api._rt()


def config():
    """The settings of the running commlib (``Config``: COMMLIB_* variables and ``init()`` arguments)."""
    return runtime().config


def unique_name(prefix: str, count: int) -> str:
    """A request name used once: commlib negotiates it in full and keeps no cache entry for it."""
    return f"{prefix.rstrip('.')}{AUTO_NAME_MARK}{count}"


def barrier_async(name: str, process_set=None) -> Handle:
    """Start a barrier over ``process_set`` (None: every rank) under ``name``; returns its handle."""
    return api._plain_handle(Kind.BARRIER, "barrier", np.zeros(0, np.uint8), name, process_set=process_set)


def point_to_point(process_set=None):
    """A transport (:class:`commlib.transport.base.Transport`) on a private duplicate of the communicator
    of ``process_set`` (None: the world), whose waits share the runtime's deadline: a peer that stops
    answering fails a send or receive with ``PeerLostError`` as it fails a collective. Its ``rank`` and
    ``size`` are within the set. The caller frees it (``free()``)."""
    from ...transport.mpi import MPITransport

    rt = runtime()
    member = rt.sets.member(process_set, "send/recv")
    return MPITransport.duplicate(member.comm, rt.kernel_ops, rt.deadline)
