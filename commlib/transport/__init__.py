"""Transports: how bytes move between ranks. Algorithms see only :class:`Transport`."""

from .base import UNDEFINED, Transport

__all__ = ["Transport", "UNDEFINED", "MPITransport"]


def __getattr__(name):
    # Imported on demand so that `commlib.transport` itself never initializes MPI.
    if name == "MPITransport":
        from .mpi import MPITransport

        return MPITransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
