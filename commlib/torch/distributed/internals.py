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
from ...coordinator.requests import Handle, Kind


def runtime():
    """The runtime ``commlib.init()`` created (raises commlib's "not initialized" error otherwise)."""
    return api._rt()


def config():
    """The settings of the running commlib (``Config``: COMMLIB_* variables and ``init()`` arguments)."""
    return runtime().config


def barrier(name: str, process_set=None, wait: bool = False) -> Handle:
    """A barrier over ``process_set`` (None: every rank) under ``name``; returns its handle, complete when
    ``wait`` (the calling thread drives it)."""
    return api._plain_handle(Kind.BARRIER, "barrier", np.zeros(0, np.uint8), name, wait=wait,
                             process_set=process_set)


def workers_communicator():
    """MPI's world as commlib's runtime will see it: the workers' communicator when the job has summation
    servers (the roll call commlib's ``init()`` runs, done once per process and kept), else COMM_WORLD's
    duplicate. Collective over COMM_WORLD the first time."""
    from mpi4py import MPI

    from ...config import Config
    from ...server import discovery

    return discovery.job(MPI.COMM_WORLD, discovery.WORKER, Config.load().start_timeout_s).own


def point_to_point(process_set=None):
    """A transport (:class:`commlib.transport.base.Transport`) on a private duplicate of the communicator
    of ``process_set`` (None: the world), whose waits share the runtime's deadline: a peer that stops
    answering fails a send or receive with ``PeerLostError`` as it fails a collective. Its ``rank`` and
    ``size`` are within the set. The caller frees it (``free()``)."""
    from ...transport.mpi import MPITransport

    rt = runtime()
    member = rt.sets.member(process_set, "send/recv")
    return MPITransport.duplicate(member.comm, rt.kernel_ops, rt.deadline)
