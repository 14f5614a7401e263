"""What the ``commlib`` backend needs from commlib beyond its public API, in one place: the runtime's
settings and process sets, the job's workers, and a transport for point-to-point messages.

All of it goes through commlib's internal interface (docs/architecture.md, "Internal interface":
:mod:`commlib.lifecycle` and the Runtime's documented fields); ``send``/``recv`` have no collective to
negotiate, so they run on a transport of the group's own.
"""

from __future__ import annotations

from ... import lifecycle


def config():
    """The settings in force (``Config``: COMMLIB_* variables and ``init()`` arguments; before ``init()``,
    the environment's)."""
    return lifecycle.config()


def workers_communicator():
    """MPI's world as commlib's runtime will see it: the workers' communicator when the job has summation
    servers (the roll call commlib's ``init()`` runs, done once per process and kept), else COMM_WORLD's
    duplicate. Collective over COMM_WORLD the first time."""
    from mpi4py import MPI

    return lifecycle.job_layout(MPI.COMM_WORLD).own


def point_to_point(process_set=None):
    """A transport (:class:`commlib.transport.base.Transport`) on a private duplicate of the communicator
    of ``process_set`` (None: the world), whose waits share the runtime's deadline: a peer that stops
    answering fails a send or receive with ``PeerLostError`` as it fails a collective. Its ``rank`` and
    ``size`` are within the set. The caller frees it (``free()``)."""
    from ...transport.mpi import MPITransport

    runtime = lifecycle.current()
    member = runtime.sets.member(process_set, "send/recv")
    return MPITransport.duplicate(member.comm, deadline=runtime.deadline)
