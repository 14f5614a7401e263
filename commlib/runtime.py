"""The one state object: created by ``init()``, torn down by ``shutdown()``.

It owns commlib's duplicate of the user's communicator (so commlib's traffic never collides with the
user's own MPI calls), the topology, one control channel and one engine per execution lane (each on a
further duplicate), the coordinator, and the timeline.
"""

from __future__ import annotations

import itertools

from mpi4py import MPI

from .cache import BoundedCache
from .config import Config
from .coordinator.controller import Coordinator
from .coordinator.execution import Lane
from .coordinator.requests import AUTO_NAME_MARK
from .engine import Engine
from .errors import ConfigError
from .timeline import Timeline, rank_path
from .topology import Topology
from .transport.control import ControlChannel
from .transport.mpi import MPITransport


class Runtime:
    """Everything ``init()`` creates. Build it with ``Runtime(comm, **settings)``; end it with ``close()``."""

    def __init__(self, comm: "MPI.Comm | None" = None, **settings):
        self.config = Config.load(**settings)
        thread_level = MPI.Query_thread()
        if thread_level < MPI.THREAD_SERIALIZED:
            raise ConfigError(
                "commlib needs MPI initialized with at least MPI_THREAD_SERIALIZED (it has a background "
                "thread); do not set mpi4py.rc.thread_level below 'serialized'")
        if self.config.num_streams > 1 and thread_level < MPI.THREAD_MULTIPLE:
            raise ConfigError(
                f"COMMLIB_NUM_STREAMS={self.config.num_streams} needs MPI_THREAD_MULTIPLE, which this MPI "
                "did not provide; use COMMLIB_NUM_STREAMS=1")
        self.comm = (comm if comm is not None else MPI.COMM_WORLD).Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        try:
            Config.check_agreement(self.comm.allgather(self.config.agreed_values()))
        except ConfigError:
            self.comm.Free()
            raise
        self.topology = Topology.detect(self.comm, self.config.local_size)
        self.timeline = None
        if self.config.timeline:
            self.timeline = Timeline(rank_path(self.config.timeline, self.rank, self.size), self.rank)
        lanes = [Lane(i, Engine(MPITransport.duplicate(self.comm), self.topology, self.config), self.timeline)
                 for i in range(self.config.num_streams)]
        self.coordinator = Coordinator(ControlChannel(self.comm.Dup()), lanes, self.config, self.timeline)
        self._unnamed = {}
        self.metas = BoundedCache(4 * self.config.cache_capacity)  # request metadata by call signature

    def auto_name(self, operation: str) -> str:
        """Names for unnamed tensors, the same on every rank as long as ranks call in the same order."""
        counter = self._unnamed.setdefault(operation, itertools.count())
        return f"{operation}{AUTO_NAME_MARK}{next(counter)}"

    def start_timeline(self, path: str) -> None:
        self.stop_timeline()
        self.timeline = Timeline(rank_path(path, self.rank, self.size), self.rank)
        self.coordinator.set_timeline(self.timeline)

    def stop_timeline(self) -> None:
        if self.timeline is not None:
            self.coordinator.set_timeline(None)
            self.timeline.close()
            self.timeline = None

    def close(self) -> None:
        self.coordinator.close()
        if self.timeline is not None:
            self.timeline.close()
        self.comm.Free()
