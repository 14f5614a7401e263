"""The one place commlib-bench builds commlib: an Engine on its own duplicate of the communicator.

Every algorithm, ``native`` included, runs through :class:`commlib.engine.Engine`, so the benchmark
measures what an application gets (``native`` is MPI's own allreduce called through the Engine).
"""

from __future__ import annotations

import dataclasses

from ..config import Config
from ..topology import Topology


@dataclasses.dataclass
class Lane:
    """An open Engine and the node grouping it runs on. Close it with :meth:`close`."""

    engine: object
    topology: Topology

    def close(self) -> None:
        self.engine.close()


def open_lane(comm, config: Config) -> Lane:
    """Collective over ``comm``: detect the nodes (``config.local_size`` emulates them) and start an Engine."""
    from ..engine import Engine
    from ..transport.mpi import MPITransport  # imports MPI: not before the benchmark runs (--help starts none)

    topology = Topology.detect(comm, config.local_size)
    transport = MPITransport.duplicate(comm)
    return Lane(engine=Engine(transport, topology, config), topology=topology)
