"""AlgorithmContext: what an allreduce schedule may use - the transport, the node topology, scratch
buffers, the configuration, and sub-groups (node, shard and torus groups) created once and reused."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

import numpy as np

from ..buffers import ScratchPool
from ..cache import BoundedCache
from .cost import DEFAULTS, CostModel, Shape, model_from_profile, profile_path, read_profile
from ..errors import ConfigError
from ..topology import Topology
from ..transport.base import UNDEFINED, Transport
from ..transport.peer_memory import PeerMemory

if TYPE_CHECKING:  # the modules that fill these fields; the context itself runs none of them
    from .cma import ShareSplit
    from .learn import Learner
    from .persist import Kept


@dataclasses.dataclass(frozen=True)
class TorusGrid:
    """The torus2d grid: ``rows`` holds the X ranks of this rank's row (this rank is ``rows.rank``),
    ``cols`` the Y ranks of its column."""

    shape: tuple[int, int]
    rows: Transport
    cols: Transport


class AlgorithmContext:
    """Everything a schedule needs besides the buffer. One per execution lane; not thread-safe.

    :meth:`create` is collective: on one node (and unless COMMLIB_CMA=0) it probes cross-memory attach.

    ``config`` is the settings object (:class:`commlib.config.Config`), handed down by the engine: the
    configuration sits above the algorithms (it knows their names), so nothing here imports it.

    Sub-groups are created by collective ``split`` calls the first time an algorithm needs them. Every
    rank runs the same algorithm on the same call, so every rank reaches those splits together.
    """

    def __init__(self, transport: Transport, topology: Topology, config,
                 scratch: ScratchPool | None = None, peer_memory: PeerMemory | None = None,
                 peer_memory_reason: str = "not probed", cost_model: CostModel | None = None):
        self.transport = transport
        self.topology = topology
        self.config = config
        self.scratch = scratch if scratch is not None else ScratchPool()
        #: cross-memory attach to every rank of the group (the cma algorithm), or None and why not
        self.peer_memory = peer_memory
        self.peer_memory_reason = "" if peer_memory is not None else peer_memory_reason
        # What the algorithms remember across calls, each made on first use by the module named; equal on
        # every rank (made from equal inputs). None: not made yet, or forgotten (close, a new cost model).
        #: the cost model's view of this context (:func:`.select.shape_of`)
        self.shape: Shape | None = None
        #: each (size, codec)'s ranking of the algorithms by predicted time (:func:`.select.ranked`)
        self.rankings: BoundedCache | None = None
        #: the fusion limit the model predicts (:func:`.select.inplace_limit`)
        self.inplace_limit: int | None = None
        #: what ``auto`` learns from measured calls (:func:`.select.learner`)
        self.learner: Learner | None = None
        #: what earlier jobs of this layout settled, read by rank 0 and broadcast (:func:`.select.recall`);
        #: None: not recalled (nothing is read, nothing kept)
        self.kept: Kept | None = None
        #: what ``ps`` reads of the context to decide on reducing inside hosts (:func:`.ps.shape_of`)
        self.server_shape: Shape | None = None
        #: cma's balanced shares per buffer layout (:func:`.cma.allreduce_many`)
        self.cma_shares: ShareSplit | None = None
        #: the cost model ``auto`` minimises; equal on every rank (``create`` broadcasts rank 0's profile)
        self.cost_model: CostModel = cost_model if cost_model is not None else DEFAULTS
        #: pipeline segment of the segmented schedules, bytes of data; ``auto`` sets it per call
        self.segment_bytes: int = config.ring_segment_bytes
        #: this lane's way to the summation servers (``commlib.server.client.ServerLane``), or None: the job
        #: has none (the ``ps`` algorithm needs it; the runtime sets it)
        self.servers = None
        self._intra: Transport | None = None
        self._shard_groups: list[Transport | None] | None = None
        self._torus: TorusGrid | None = None

    @classmethod
    def create(cls, transport: Transport, topology: Topology, config) -> "AlgorithmContext":
        if (topology.rank, topology.size) != (transport.rank, transport.size):
            raise ValueError(
                f"topology of rank {topology.rank}/{topology.size} does not describe transport rank "
                f"{transport.rank}/{transport.size}; detect the topology on the communicator the transport "
                "was made from"
            )
        peers, reason = None, "COMMLIB_CMA=0"
        if config.cma:
            if topology.cross_size == 1:
                peers, reason = PeerMemory.probe(transport)  # collective, like this constructor
            else:
                reason = f"the ranks are on {topology.cross_size} nodes, not one"
        return cls(transport, topology, config, peer_memory=peers, peer_memory_reason=reason,
                   cost_model=shared_cost_model(transport, config))

    @property
    def rank(self) -> int:
        return self.transport.rank

    @property
    def size(self) -> int:
        return self.transport.size

    def intra(self) -> Transport:
        """The ranks of this rank's node, in local-rank order."""
        if self._intra is None:
            self._intra = self.transport.split(self.topology.cross_rank, self.rank)
        return self._intra

    def shard_groups(self) -> list[Transport | None]:
        """For each of the L = max-ranks-per-node shards of the hierarchical algorithm, the group of
        ranks (one per node, in node order) holding that shard, or None if this rank does not hold it.

        On a node of k ranks, local rank r holds shards ``partition.offsets(L, k)[r:r + 2]``."""
        if self._shard_groups is None:
            from .partition import offsets  # local: keeps the context free of algorithm imports at load

            topo = self.topology
            width = topo.max_local_size
            if topo.uniform:  # one shard per rank: one split, by local rank
                group = self.transport.split(topo.local_rank, topo.cross_rank)
                self._shard_groups = [group if j == topo.local_rank else None for j in range(width)]
            else:
                held = offsets(width, topo.local_size)
                first, last = held[topo.local_rank], held[topo.local_rank + 1]
                self._shard_groups = [
                    self.transport.split(0 if first <= j < last else UNDEFINED, topo.cross_rank)
                    for j in range(width)
                ]
        return self._shard_groups

    def torus(self) -> TorusGrid:
        """The X-by-Y grid of torus2d: ``config.torus_shape``, else X = ranks per node, Y = nodes."""
        if self._torus is None:
            (nx, ny), (x, y) = torus_layout(self.topology, self.config)
            rows = self.transport.split(y, x)
            cols = self.transport.split(x, y)
            self._torus = TorusGrid((nx, ny), rows, cols)
        return self._torus

    def close(self) -> None:
        """Free the sub-groups (the transport itself belongs to the caller) and the scratch memory."""
        groups: list[Transport | None] = [self._intra]
        groups += self._shard_groups or []
        if self._torus is not None:
            groups += [self._torus.rows, self._torus.cols]
        for group in groups:
            if group is not None:
                group.free()
        self._intra, self._shard_groups, self._torus = None, None, None
        self.scratch.clear()
        self.shape = self.rankings = self.inplace_limit = self.learner = self.kept = None
        self.server_shape = self.cma_shares = None


def torus_layout(topology: Topology, config) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((X, Y), (x, y))``: the torus2d grid and this rank's place in it, without communicating; a
    ConfigError says why there is no grid (a shape that does not fit, nodes of unequal size)."""
    size, rank = topology.size, topology.rank
    if config.torus_shape is not None:
        nx, ny = config.torus_shape
        if nx * ny != size:
            raise ConfigError(
                f"COMMLIB_TORUS_SHAPE={nx}x{ny} has {nx * ny} positions but there are {size} ranks; "
                f"choose X and Y with X*Y = {size}"
            )
        return (nx, ny), (rank % nx, rank // nx)
    if not topology.uniform:
        raise ConfigError(
            f"torus2d needs nodes of equal size by default, but they have {list(topology.node_sizes)} "
            "ranks; set COMMLIB_TORUS_SHAPE=XxY or use algorithm 'hierarchical'"
        )
    return (topology.local_size, topology.cross_size), (topology.local_rank, topology.cross_rank)


def broadcast_bytes(transport: Transport, data: bytes) -> bytes:
    """Collective: rank 0's ``data`` on every rank (the others' ``data`` is not read)."""
    if transport.size == 1:
        return data
    length = np.array([len(data)], _I64)
    transport.bcast_(length, 0)
    payload = np.frombuffer(data, _U8).copy() if transport.rank == 0 else np.empty(int(length[0]), _U8)
    if payload.size:
        transport.bcast_(payload, 0)
    return payload.tobytes()


_U8 = np.dtype(np.uint8)
_I64 = np.dtype(np.int64)


def shared_cost_model(transport: Transport, config) -> CostModel:
    """Collective: rank 0 loads the tuning profile (``config.tuning_file``, else the default location) and
    broadcasts it, so that every rank's ``auto`` decides from the same numbers. A profile that cannot be
    used is an error on every rank, naming the file."""
    text = b""
    if transport.rank == 0:
        try:
            path = profile_path(config.tuning_file)
            if path is not None:
                data = read_profile(path)
                model_from_profile(data, str(path))  # validate here, so the error is rank 0's too
                text = json.dumps({"source": str(path), "profile": data}).encode()
        except ConfigError as exc:
            text = json.dumps({"error": str(exc)}).encode()
    text = broadcast_bytes(transport, text)
    if not text:
        return DEFAULTS
    shared = json.loads(text)
    if "error" in shared:
        raise ConfigError(shared["error"] + (" (on rank 0, whose profile every rank uses)"
                                             if transport.rank else ""))
    return model_from_profile(shared["profile"], shared["source"])
