"""Geo-SGD at the summation servers: parameter deltas merged as they arrive, bounded staleness.

A Geo-SGD *table* is one flat vector of parameters (a model's, flattened by the worker), cut into
partitions and placed on the servers by the same rule as push_pull (:func:`.protocol.partitions`,
:func:`.protocol.server_of`). Per partition a server keeps the parameters' values and, per worker, the last
round it pushed (its *clock*).

Messages (:class:`.protocol.GeoMessage` headers on ``TAG_GEO``, their values on ``TAG_GEO_DATA``; MPI
keeps one sender's messages on one tag in order, so a server matches each header's values by posting
their receive right after reading the header):

- ``open`` (worker 0 only, with the initial values): the partition's starting point and declaration;
- ``push`` (with a delta): ``values += delta``, the worker's clock becomes ``round``; the server answers
  with the merged values once the worker is at most ``staleness`` rounds ahead of the slowest worker that
  has not left (at once when the staleness is unbounded); until then it holds the answer, telling the
  worker every ``HEARTBEAT_S`` that it is alive and whom it waits for;
- ``pull`` (no values): answered at once with the merged values;
- ``leave`` (no values): the worker is done with the table; the slowest is then found among the others.
  A worker's process that exits (``TAG_EXIT``) leaves every table. A partition every worker left is
  forgotten.

Answers: a :class:`.protocol.GeoReply` on ``TAG_GEO_REPLY`` (``values``, then the values on
``TAG_GEO_VALUES``; ``waiting``; or ``error``, when the push's declaration differs from the table's).

Nothing a worker sends is trusted: a header from a rank that is not a worker, or naming another worker,
or that does not decode within its bounds, is dropped with a log line; values that are not as long as
their header said are refused, naming the worker. Only worker 0 opens a table.

Pushes that arrive before worker 0's ``open`` (another worker is faster) wait for it. Nothing here is
started at import; the server loop (:mod:`.loop`) calls :meth:`GeoStore.progress` and
:meth:`GeoStore.exited`.
"""

from __future__ import annotations

import logging
import time

import numpy as np
from mpi4py import MPI

from .. import kernels
from ..ops import ReduceOp
from . import mpi_messages, protocol
from .discovery import Job
from .protocol import GeoMessage, GeoReply

log = logging.getLogger("commlib.server")

#: How often a server tells a worker whose answer it holds (staleness bound) that it is alive: the
#: worker's COMMLIB_SERVER_TIMEOUT then catches a dead or stopped server, not a slow worker.
HEARTBEAT_S = 1.0
#: Values dtypes a table may have.
DTYPES = {name: np.dtype(name) for name in protocol.GEO_DTYPES}


class _Partition:
    __slots__ = ("values", "declared", "clock", "left", "held", "early", "workers")

    def __init__(self, workers: int):
        self.values: np.ndarray | None = None  # until worker 0's open is in
        self.declared: GeoMessage | None = None
        self.clock = [0] * workers
        self.left: set[int] = set()
        self.held: list[tuple[int, int]] = []  # (worker, round) answers held by the staleness bound
        self.early: list[tuple[GeoMessage, np.ndarray | None]] = []  # before the open's values
        self.workers = workers

    def slowest(self) -> int:
        """The lowest clock among the workers still in (a very large number when none is)."""
        active = [c for w, c in enumerate(self.clock) if w not in self.left]
        return min(active) if active else 1 << 62

    def lagging(self, limit: int) -> list[int]:
        return [w for w, c in enumerate(self.clock) if w not in self.left and c < limit]


class GeoStore:
    """The Geo-SGD tables one server owns partitions of, driven by the server's loop."""

    def __init__(self, job: Job, index: int):
        self.job = job
        self.comm = job.full
        self.index = index
        self.worker_of_rank = {r: i for i, r in enumerate(job.workers)}
        self.parts: dict[tuple[str, int], _Partition] = {}
        self.receiving: list[tuple[MPI.Request, GeoMessage, np.ndarray]] = []
        self.dropped = 0  # malformed messages dropped (the log says what each was)
        self.sending: list[tuple[MPI.Request, int]] = []  # (request, worker)
        self.exited: set[int] = set()
        self.status = MPI.Status()
        self.beat = time.monotonic()
        self.merged = 0

    @property
    def busy(self) -> bool:
        """Transfers with live workers under way (the loop must keep polling MPI and must not exit; one
        with a worker whose process exited never completes and must not hold the server)."""
        return any(m.worker not in self.exited for _, m, _ in self.receiving) or \
            any(w not in self.exited for _, w in self.sending)

    # -- driven by the loop -----------------------------------------------------------------------------
    def progress(self) -> bool:
        moved = self._headers() | self._received() | self._sent()
        now = time.monotonic()
        if now - self.beat > HEARTBEAT_S:
            self.beat = now
            self._heartbeat()
        return moved

    def exit(self, worker: int) -> None:
        """``worker``'s process exited: it leaves every table."""
        self.exited.add(worker)
        for key in list(self.parts):
            self._leave(key, worker)

    # -- messages -----------------------------------------------------------------------------------------
    def _headers(self) -> bool:
        moved = False
        for source, msg in mpi_messages.arrived(self.comm, protocol.TAG_GEO, self.status, GeoMessage):
            moved = True
            try:
                msg = self._admit(source, msg)
            except protocol.ProtocolError as exc:
                self.dropped += 1
                log.error("commlib server %d: dropped a malformed Geo-SGD message from rank %d: %s", self.index,
                          source, exc)
                continue
            key = (msg.key, msg.part)
            if msg.kind in ("open", "push"):  # post the values' receive now: the next on TAG_GEO_DATA
                buf = np.empty(msg.count, DTYPES[msg.dtype])  # the worker sends float32 or float64 only
                request = self.comm.Irecv(buf.view(np.uint8), source=source, tag=protocol.TAG_GEO_DATA)
                self.receiving.append((request, msg, buf))
            elif msg.kind == "pull":
                part = self.parts.get(key)
                if part is None or part.values is None:
                    self._part(key).early.append((msg, None))
                else:
                    self._answer(msg.key, msg.part, part, [(msg.worker, 0)])
            elif msg.kind == "leave":
                self._leave(key, msg.worker)
        return moved

    def _admit(self, source: int, msg: GeoMessage | protocol.ProtocolError) -> GeoMessage:
        """``msg`` (as decoded) from rank ``source``, if the protocol allows it from there."""
        worker = self.worker_of_rank.get(source)
        if worker is None:
            raise protocol.ProtocolError("a Geo-SGD message from a rank that is not a worker")
        if isinstance(msg, protocol.ProtocolError):
            raise msg
        if msg.worker != worker or (msg.kind == "open" and worker != 0):
            raise protocol.ProtocolError(f"a Geo-SGD {msg.kind} of {msg.key!r} naming worker {msg.worker} from "
                                         f"worker {worker} (only worker 0 opens a table)")
        return msg

    def _part(self, key: tuple[str, int]) -> _Partition:
        part = self.parts.get(key)
        if part is None:
            part = self.parts[key] = _Partition(len(self.job.workers))
            part.left |= self.exited
        return part

    def _received(self) -> bool:
        if not self.receiving:
            return False
        done = mpi_messages.test_some([r for r, *_ in self.receiving])
        if not done:
            return False
        finished = [self.receiving[i] + (nbytes,) for i, nbytes in sorted(done)]
        gone = {i for i, _ in done}
        self.receiving = [item for i, item in enumerate(self.receiving) if i not in gone]
        for _, msg, buf, nbytes in finished:
            key = (msg.key, msg.part)
            if nbytes != buf.nbytes:
                self._refuse(msg, f"Geo-SGD table {msg.key!r} partition {msg.part}: worker {msg.worker}'s {msg.kind} "
                                  f"carried {nbytes if nbytes >= 0 else 'more'} bytes of values, its header declared "
                                  f"{buf.nbytes}")
                continue
            part = self._part(key)
            if msg.kind == "open":
                if part.values is not None:
                    self._refuse(msg, f"Geo-SGD table {msg.key!r} partition {msg.part} opened twice")
                    continue
                part.declared = msg
                part.values = buf
                early, part.early = part.early, []
                for waiting, data in early:
                    self._take(key, part, waiting, data)
            elif part.values is None:
                part.early.append((msg, buf))
            else:
                self._take(key, part, msg, buf)
        return True

    def _take(self, key: tuple[str, int], part: _Partition, msg: GeoMessage, buf: np.ndarray | None) -> None:
        """A push's delta (or a pull) for a partition whose values are in."""
        if msg.kind == "pull":
            self._answer(msg.key, msg.part, part, [(msg.worker, 0)])
            return
        if msg.declaration() != part.declared.declaration():
            self._refuse(msg, f"Geo-SGD table {msg.key!r} partition {msg.part}: worker {msg.worker} declared "
                              f"{msg.describe()}, worker {part.declared.worker} declared "
                              f"{part.declared.describe()}; create the GeoSGD alike on every worker")
            return
        kernels.reduce_(part.values, buf, ReduceOp.SUM)
        self.merged += 1
        part.clock[msg.worker] = max(part.clock[msg.worker], msg.round)
        part.held.append((msg.worker, msg.round))
        self._release(key, part)

    def _release(self, key: tuple[str, int], part: _Partition) -> None:
        """Answer every held push now within the bound (all of them, one snapshot: the workers released
        together see the same values)."""
        if not part.held:
            return
        bound = part.declared.staleness
        slowest = part.slowest()
        ready = [(w, r) for w, r in part.held if bound < 0 or r - slowest <= bound]
        if ready:
            part.held = [h for h in part.held if h not in ready]
            self._answer(key[0], key[1], part, ready)

    def _answer(self, name: str, index: int, part: _Partition, to: list[tuple[int, int]]) -> None:
        snapshot = part.values.copy()  # later pushes change the values while these sends read them
        slowest = min(part.slowest(), 1 << 31)
        for worker, rnd in to:
            if worker in self.exited:
                continue
            rank = self.job.workers[worker]
            reply = GeoReply("values", name, index, rnd, slowest, nbytes=snapshot.nbytes).encode()
            self.sending.append((mpi_messages.post(self.comm, reply, rank, protocol.TAG_GEO_REPLY), worker))
            self.sending.append((self.comm.Isend(snapshot.view(np.uint8), dest=rank, tag=protocol.TAG_GEO_VALUES),
                                 worker))

    def _refuse(self, msg: GeoMessage, text: str) -> None:
        log.warning("commlib server %d: %s", self.index, text)
        if msg.worker in self.exited:
            return
        reply = GeoReply("error", msg.key, msg.part, msg.round, 0, protocol.cut(text)).encode()
        self.sending.append((mpi_messages.post(self.comm, reply, self.job.workers[msg.worker], protocol.TAG_GEO_REPLY),
                             msg.worker))

    def _leave(self, key: tuple[str, int], worker: int) -> None:
        part = self._part(key)
        part.left.add(worker)
        part.held = [h for h in part.held if h[0] != worker]
        if len(part.left) == part.workers:
            del self.parts[key]
            return
        if part.values is not None:
            self._release(key, part)

    def _heartbeat(self) -> None:
        told = set()
        for (name, index), part in self.parts.items():
            for worker, rnd in part.held:
                if worker in told or worker in self.exited:
                    continue
                told.add(worker)
                bound = part.declared.staleness
                waits = part.lagging(rnd - bound)
                text = (f"round {rnd} is held until worker(s) {waits} push round {rnd - bound} "
                        f"(staleness {bound})")
                reply = GeoReply("waiting", name, index, rnd, min(part.slowest(), 1 << 31), protocol.cut(text))
                self.sending.append((mpi_messages.post(self.comm, reply.encode(), self.job.workers[worker],
                                                       protocol.TAG_GEO_REPLY), worker))

    def _sent(self) -> bool:
        if not self.sending:
            return False
        done = MPI.Request.Testsome([r for r, _ in self.sending])
        if not done:
            return False
        gone = set(done)
        self.sending = [item for i, item in enumerate(self.sending) if i not in gone]
        return True
