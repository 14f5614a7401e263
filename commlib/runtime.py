"""What one ``init()`` builds: created by :mod:`commlib.lifecycle` (the one owner of the process's state),
torn down by ``shutdown()``.

It owns commlib's duplicate of the user's communicator (so commlib's traffic never collides with the
user's own MPI calls), the topology, the timeline, and the process sets (:mod:`commlib.process_sets`):
the world is the first set; each set this rank is in has its own control channel, its own engine per
execution lane (each on a further duplicate) and its own coordinator.

This module imports MPI; ``commlib`` imports it only from ``init()``, so that ``import commlib`` leaves
MPI uninitialized (``mpi4py.rc`` can still be set).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpi4py import MPI

from .cache import BoundedCache
from .config import Config
from .coordinator.controller import Coordinator
from .coordinator.execution import Lane
from .engine import Engine
from .errors import ConfigError, ProcessSetError
from .process_sets import ProcessSetTable
from .server import discovery
from .server.client import ServerLane, open_client
from .server.geo_client import GeoClient
from .timeline import Timeline, rank_path
from .topology import Topology
from .transport.control import ControlChannel
from .transport.deadline import Deadline
from .transport.mpi import KernelOps, MPITransport

if TYPE_CHECKING:
    from .algorithms.context import AlgorithmContext
    from .server.client import ServerClient


class Runtime:
    """Everything ``init()`` creates, as typed fields. Build it with ``Runtime(comm, **settings)``; end it
    with ``close()``. :mod:`commlib.lifecycle` holds the one instance (``lifecycle.current()``); the fields
    below are the internal interface plug-ins and services may read (docs/architecture.md). A service that
    keeps state per process adds a typed field here, made in ``__init__`` (or on first use) and closed in
    ``close()``, rather than a module-level variable of its own."""

    config: Config                 # the settings: init()'s over the environment (commlib.config)
    comm: MPI.Comm                 # commlib's duplicate of the user's communicator (add/remove_process_set)
    rank: int                      # this process's rank in ``comm`` (the world of commlib's ranks)
    size: int
    thread_multiple: bool          # MPI provides MPI_THREAD_MULTIPLE (process sets and servers need it)
    job: discovery.Job             # which ranks of the launch are workers and which summation servers
    topology: Topology             # the node layout of the world
    deadline: Deadline             # every wait's limit (COMMLIB_TIMEOUT) and the first lost peer
    timeline: Timeline | None      # the Chrome-trace writer, while a timeline is on
    servers: ServerClient | None   # the summation servers' client (None: the job has none)
    geo: GeoClient | None          # Geo-SGD's tables on the servers (commlib.geo; None: the job has none)
    kernel_ops: KernelOps          # the user-defined MPI ops every set's and lane's transport shares
    sets: ProcessSetTable          # the registered process sets; ``sets.world`` is the world's member
    world_context: AlgorithmContext  # the world's first lane's context (push_pull asks its cost model)
    metas: BoundedCache            # request metadata by call signature (the hot path's cache)
    coordinator: Coordinator       # the world's (``sets.world.coordinator``; an attribute: the hot path reads it)

    def __init__(self, comm: "MPI.Comm | None" = None, layouts: "dict[int, discovery.Job] | None" = None,
                 **settings):
        try:
            self.config = Config.load(**settings)
            self.thread_multiple = self._thread_multiple(self.config)
            own = None
        except Exception as exc:  # the other ranks still come to the agreement below, and learn why
            own = exc
        # workers only: summation servers launched in the same job (commlib.server) are split off here;
        # ``layouts`` (lifecycle's, by communicator) keeps the job's layout for the next runtime
        start_timeout = self.config.start_timeout_s if own is None else Config().start_timeout_s
        self.job = discovery.worker_job(comm if comm is not None else MPI.COMM_WORLD, layouts, start_timeout,
                                        meet=True)
        self.comm = self.job.own.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        reports = self.comm.allgather(("error", str(own)) if own else ("ok", self.config.agreed_values()))
        try:
            failed = {r: text for r, (kind, text) in enumerate(reports) if kind == "error"}
            if own is not None:
                raise own
            if failed:
                listing = "; ".join(f"rank {r}: {text}" for r, text in failed.items())
                raise ConfigError(f"commlib.init() failed on another rank ({listing}); fix the settings there")
            Config.check_agreement([values for _, values in reports])
        except Exception:
            self.comm.Free()
            raise
        self.topology = Topology.detect(self.comm, self.config.local_size)
        self.deadline = Deadline(self.config.wait_limit_s, self.comm.Get_group(),
                                 self.comm.allgather(MPI.Get_processor_name()))
        self.timeline = None
        if self.config.timeline:
            self.timeline = Timeline(rank_path(self.config.timeline, self.rank, self.size), self.rank,
                                     self.config.timeline_mark_cycles)
        self.servers = None
        self.geo = None
        if self.job.servers:
            if not self.thread_multiple:
                self.comm.Free()
                raise ConfigError("summation servers need MPI_THREAD_MULTIPLE (push_pull progresses in its own "
                                  "thread); do not lower mpi4py.rc.thread_level")
            self.servers = open_client(self.job, self.config.server_partition_bytes, self.config.server_timeout_s,
                                       self.config.server_tcp_congestion, self.config.server_tcp_rcvbuf)
            self.geo = GeoClient(self.job, self.config.server_partition_bytes, self.config.server_timeout_s)
        self.kernel_ops = KernelOps()  # the user-defined MPI ops, shared by every set's and lane's transport
        world = self.comm.Dup()  # the world set's own: self.comm stays for add/remove_process_set
        self.sets = ProcessSetTable(self.comm, self._build_member,
                                    self._build_member(world, list(range(self.size)), ""), self.deadline)
        self.metas = BoundedCache(4 * self.config.cache_capacity)  # request metadata by call signature
        self.coordinator = self.sets.world.coordinator  # (the world's set is built once, above)

    @staticmethod
    def _thread_multiple(config: Config) -> bool:
        """Whether MPI provides MPI_THREAD_MULTIPLE; raises if it provides too little for ``config``."""
        thread_level = MPI.Query_thread()
        if thread_level < MPI.THREAD_SERIALIZED:
            raise ConfigError(
                "commlib needs MPI initialized with at least MPI_THREAD_SERIALIZED (it has a background "
                "thread); do not set mpi4py.rc.thread_level below 'serialized'")
        if config.num_streams > 1 and thread_level < MPI.THREAD_MULTIPLE:
            raise ConfigError(
                f"COMMLIB_NUM_STREAMS={config.num_streams} needs MPI_THREAD_MULTIPLE, which this MPI "
                "did not provide; use COMMLIB_NUM_STREAMS=1")
        return thread_level == MPI.THREAD_MULTIPLE

    def _build_member(self, comm, ranks: list[int], label: str) -> tuple:
        """A set's (communicator, node layout, coordinator) on ``comm``, which holds exactly ``ranks``;
        the layout comes from the world's, so a set's algorithms follow its own shape."""
        set_rank = comm.Get_rank()
        topology = Topology.from_node_ids(set_rank, [self.topology.node_of_rank[r] for r in ranks])
        lanes = [Lane(i, Engine(MPITransport.duplicate(comm, self.kernel_ops, self.deadline), topology,
                                self.config), self.timeline) for i in range(self.config.num_streams)]
        if self.servers is not None:
            nodes = self.servers.server_nodes([self.job.workers[r] for r in ranks], topology.node_of_rank)
            for lane in lanes:
                lane.engine.context.servers = ServerLane(self.servers, f"{label}/{lane.index}", len(ranks), nodes)
        for lane in lanes:  # auto starts from what earlier jobs of this layout settled
            lane.engine.recall()
        if not label:  # the world's: push_pull asks its cost model whether to reduce inside hosts first
            self.world_context = lanes[0].engine.context
        coordinator = Coordinator(ControlChannel(comm.Dup(), self.deadline), lanes, self.config, self.timeline,
                                  world_ranks=ranks, label=label)
        return comm, topology, coordinator

    def add_process_set(self, process_set, members_only: bool = False):
        if not self.thread_multiple:
            raise ProcessSetError("process sets need MPI_THREAD_MULTIPLE (each set's coordinator calls MPI "
                                  "from its own thread); do not lower mpi4py.rc.thread_level")
        return self.sets.add(process_set, members_only)

    def start_timeline(self, path: str, mark_cycles: bool | None = None) -> None:
        self.stop_timeline()
        marks = self.config.timeline_mark_cycles if mark_cycles is None else mark_cycles
        self.timeline = Timeline(rank_path(path, self.rank, self.size), self.rank, marks)
        for member in self.sets.members():
            member.coordinator.set_timeline(self.timeline)

    def stop_timeline(self) -> None:
        if self.timeline is not None:
            for member in self.sets.members():
                member.coordinator.set_timeline(None)
            self.timeline.close()
            self.timeline = None

    @property
    def lost(self):
        """The PeerLostError this runtime met (a wait timed out, or a coordinator gave up on a silent
        peer), else None. After one, the process must not finalize MPI (its teardown would wait for the
        lost peers): see commlib.lifecycle's exit path."""
        if self.deadline.lost is not None:
            return self.deadline.lost
        for member in self.sets.members():
            lost = member.coordinator.lost
            if lost is not None:
                return lost
        return None

    def abandon(self, lost_ranks) -> None:
        """Elastic recovery leaves this runtime for one over the survivors, which leave theirs too: send
        nothing more on it (a send to a dead rank can crash the sender; the live ones were told of the loss
        when it happened), then close it without freeing its communicators (the dead ranks are in them).
        ``lost_ranks`` (ranks of this runtime's communicator) name the loss in the error of later calls."""
        for member in self.sets.members():
            member.coordinator.forget(range(self.size))
        if self.deadline.lost is None:
            from .errors import PeerLostError

            self.deadline.lose(PeerLostError(f"commlib was rebuilt without rank(s) {sorted(lost_ranks)}",
                                             ranks=sorted(lost_ranks), what="elastic recovery"))
        self.close(leaving=True)

    def close(self, leaving: bool = False) -> None:
        """Shut down every set. ``leaving``: the process is exiting without ``shutdown()``; tell the
        others and do not wait for them."""
        try:
            self.sets.close(leaving=leaving)
        finally:
            if self.geo is not None:
                self.geo.close()
            if self.servers is not None:
                self.servers.close()
            if self.timeline is not None:
                self.timeline.close()
            if self.lost is None and not MPI.Is_finalized():  # after a loss, nothing collective
                self.kernel_ops.free()
                self.comm.Free()
