"""The summation server: receives partitions, sums them, answers every contributor once per round.

Protocol: :mod:`.protocol`. Per key (a tensor name and partition) a round starts with its first push and
ends when every contributor has pushed; then the server sends the sum to each of them (no separate pull)
and forgets the key. The first push's buffer becomes the accumulator (no copy); each later one is added
with commlib's C kernels (which release the GIL). Half-precision partitions (float16, bfloat16) accumulate
in a float32 buffer and are rounded once for the answer, so every worker receives the same bits.

Memory is the rounds in flight: per open round one accumulator plus the pushes received but not yet added,
and answers until they are sent. Buffers are reused through a small pool.

One thread drives everything with non-blocking MPI: a matched probe for headers, ``Testsome`` over the
receives and sends. While transfers are under way it only yields the core between polls (MPI moves a
large message's data only while it is polled: 1 ms sleeps there cost push_pull a third of its rate);
idle, it yields, then sleeps (``coordinator.backoff``).
"""

from __future__ import annotations

import logging
import time

import numpy as np
from mpi4py import MPI

from .. import kernels
from ..compression import pushed
from ..coordinator.backoff import Backoff, yield_core
from ..dtypes import BFLOAT16, HALF
from ..ops import ReduceOp
from . import protocol
from .discovery import Job
from .geo import GeoStore

log = logging.getLogger("commlib.server")

_WIRE = {np.dtype(t).name: np.dtype(t) for t in (np.float16, np.float32, np.float64, np.uint8, np.int8,
                                                 np.int16, np.int32, np.int64)}
_WIRE[BFLOAT16.name] = BFLOAT16
_F32 = np.dtype(np.float32)
_U8 = np.dtype(np.uint8)


class _Pool:
    """Free buffers by (dtype, count), at most ``per_shape`` of each."""

    def __init__(self, per_shape: int = 8):
        self.free: dict[tuple, list[np.ndarray]] = {}
        self.per_shape = per_shape

    def take(self, dtype: np.dtype, count: int) -> np.ndarray:
        stack = self.free.get((dtype, count))
        return stack.pop() if stack else np.empty(count, dtype)

    def give(self, buf: np.ndarray) -> None:
        stack = self.free.setdefault((buf.dtype, buf.size), [])
        if len(stack) < self.per_shape:
            stack.append(buf)


class _Round:
    """One key's open round."""

    __slots__ = ("first", "acc", "pushed", "slots", "error", "arrived", "most")

    def __init__(self, first: protocol.Push):
        self.first = first
        self.acc: np.ndarray | None = None
        self.pushed: dict[int, int] = {}  # worker -> slot
        self.arrived = 0  # pushes whose data has been added
        self.error = ""
        self.most = first.contributors  # the most contributors any push declared: a refused round waits for them


class Server:
    """The loop of one summation server on ``job`` (this process is one of ``job.servers``)."""

    def __init__(self, job: Job, max_sleep_s: float = 1e-3):
        self.job = job
        self.comm = job.full
        self.index = job.servers.index(self.comm.Get_rank())
        self.worker_of_rank = {r: i for i, r in enumerate(job.workers)}
        self.rounds: dict[tuple[str, int], _Round] = {}
        self.receiving: list[tuple[MPI.Request, protocol.Push, np.ndarray, bool]] = []
        self.sending: list[tuple[MPI.Request, list | None]] = []
        self.pool = _Pool()
        self.byes = [0] * len(job.workers)
        self.exits: set[int] = set()
        self.backoff = Backoff(max_sleep_s)
        self.rounds_done = 0
        self.status = MPI.Status()
        self.geo = GeoStore(job, self.index)  # Geo-SGD's tables (docs/servers.md)
        #: ``None``, or a list that receives ``(time, event, worker, key, part)`` ("header", "received",
        #: "answer", "answered"): scripts/bench_servers.py --trace sets it.
        self.trace: list | None = None

    # -- the loop ---------------------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until every worker's process has said it is exiting."""
        last = time.monotonic()
        while len(self.exits) < len(self.job.workers) or self.sending or self.geo.busy:
            moved = self._control() | self._headers() | self._received() | self._sent() | self.geo.progress()
            now = time.monotonic()
            if moved:
                last = now
            elif self.receiving or self.sending or self.geo.busy:
                yield_core()  # transfers under way progress only while MPI is polled: never sleep then
            else:
                self.backoff.pause(now - last)
        log.info("commlib server %d: every worker exited after %d rounds", self.index, self.rounds_done)

    def _headers(self) -> bool:
        moved = False
        while True:
            message = self.comm.improbe(MPI.ANY_SOURCE, protocol.TAG_PUSH, self.status)
            if message is None:
                return moved
            source = self.status.Get_source()
            push = message.recv()
            moved = True
            self._start(push, source)

    def _control(self) -> bool:
        moved = False
        for tag in (protocol.TAG_BYE, protocol.TAG_EXIT):
            while True:
                message = self.comm.improbe(MPI.ANY_SOURCE, tag, self.status)
                if message is None:
                    break
                source = self.status.Get_source()
                message.recv()
                moved = True
                worker = self.worker_of_rank[source]
                if tag == protocol.TAG_BYE:
                    self._bye(worker)
                else:
                    self.exits.add(worker)
                    self.geo.exit(worker)
        return moved

    # -- pushes -----------------------------------------------------------------------------------------
    def _start(self, push: protocol.Push, source: int) -> None:
        """A header arrived: post the receive of its data (always: the worker's send must complete)."""
        key = (push.key, push.part)
        buf = self.pool.take(_U8 if push.codec else _WIRE[push.wire], push.nbytes if push.codec else push.count)
        request = self.comm.Irecv(buf.view(np.uint8), source=source, tag=push.slot)
        rnd = self.rounds.get(key)
        if rnd is None:
            rnd = self.rounds[key] = _Round(push)
        worker = self.worker_of_rank[source]
        if self.trace is not None:
            self.trace.append((time.monotonic(), "header", worker, push.key, push.part))
        if worker in rnd.pushed:  # its data is received and dropped
            self.receiving.append((request, push, buf, False))
            self._answer_error([(source, push.slot)], (
                f"push_pull {push.key!r} partition {push.part}: worker {worker} pushed it again before every "
                f"worker had pushed the previous round; the workers declare this key differently (sizes) "
                f"or one of them stopped pushing it"))
            return
        self.receiving.append((request, push, buf, True))
        rnd.pushed[worker] = push.slot
        rnd.most = max(rnd.most, push.contributors)
        if push.declaration() != rnd.first.declaration() and not rnd.error:
            rnd.error = (f"push_pull {push.key!r} partition {push.part}: worker {worker} declared "
                         f"{push.describe()}, worker {rnd.first.worker} declared {rnd.first.describe()}; "
                         "declare every key alike on every worker")

    def _received(self) -> bool:
        if not self.receiving:
            return False
        done = MPI.Request.Testsome([r for r, *_ in self.receiving])
        if not done:
            return False
        finished = [self.receiving[i] for i in done]
        keep = set(done)
        self.receiving = [item for i, item in enumerate(self.receiving) if i not in keep]
        for _, push, buf, counted in finished:
            if self.trace is not None:
                self.trace.append((time.monotonic(), "received", push.worker, push.key, push.part))
            if counted:
                self._add(push, buf)
            else:
                self.pool.give(buf)
        return True

    def _add(self, push: protocol.Push, buf: np.ndarray) -> None:
        key = (push.key, push.part)
        rnd = self.rounds.get(key)
        if rnd is None:  # dropped when the workers shut down
            self.pool.give(buf)
            return
        if push.codec and not rnd.error:  # a lossy compressor's push: decoded to float32 first
            buf = self._decoded(push, buf, rnd)
        if not rnd.error:
            if rnd.acc is None:
                if buf.dtype in HALF:  # accumulate in float32, round once for the answer
                    rnd.acc = self.pool.take(_F32, buf.size)
                    kernels.from_half(buf, rnd.acc)
                    self.pool.give(buf)
                else:
                    rnd.acc = buf  # the first push is the accumulator
            else:
                op = ReduceOp(push.op)
                if buf.dtype in HALF:
                    kernels.reduce_widened_(rnd.acc, buf, op)
                else:
                    kernels.reduce_(rnd.acc, buf, op)
                self.pool.give(buf)
        else:
            self.pool.give(buf)
        rnd.arrived += 1
        if rnd.arrived == (rnd.most if rnd.error else rnd.first.contributors):
            del self.rounds[key]
            self._finish(rnd)

    def _decoded(self, push: protocol.Push, data: np.ndarray, rnd: _Round) -> np.ndarray:
        """The float32 values of a compressed push (:mod:`commlib.compression.pushed`); a payload that does
        not decode refuses the round, naming the worker."""
        values = self.pool.take(_F32, push.count)
        try:
            pushed.decode_into(push.codec, data, values, add=False)
        except ValueError as exc:
            rnd.error = (f"push_pull {push.key!r} partition {push.part}: worker {push.worker}'s {push.codec} "
                         f"push of {push.nbytes} bytes does not decode: {exc}")
        self.pool.give(data)
        return values

    def _finish(self, rnd: _Round) -> None:
        """Every contributor has pushed: send each the sum (or the error)."""
        destinations = [(self.job.workers[w], slot) for w, slot in rnd.pushed.items()]
        if rnd.error:
            if rnd.acc is not None:
                self.pool.give(rnd.acc)
            self._answer_error(destinations, rnd.error)
            return
        self.rounds_done += 1
        answer = rnd.acc
        wire = _WIRE[rnd.first.wire]
        if wire in HALF:
            answer = self.pool.take(wire, rnd.acc.size)
            kernels.to_half(rnd.acc, answer)
            self.pool.give(rnd.acc)
        holder = [answer, len(destinations)]  # back to the pool when its last send completes
        if self.trace is not None:
            self.trace.append((time.monotonic(), "answer", -1, rnd.first.key, rnd.first.part))
        for rank, slot in destinations:
            self.sending.append((self.comm.Isend(answer.view(np.uint8), dest=rank, tag=slot), holder))

    def _answer_error(self, destinations, text: str) -> None:
        log.warning("commlib server %d: %s", self.index, text)
        for rank, slot in destinations:
            self.sending.append((self.comm.isend((slot, text), dest=rank, tag=protocol.TAG_ERROR), None))

    def _sent(self) -> bool:
        if not self.sending:
            return False
        done = MPI.Request.Testsome([r for r, _ in self.sending])
        if not done:
            return False
        finished = set(done)
        for i in done:
            holder = self.sending[i][1]
            if holder is not None:
                holder[1] -= 1
                if holder[1] == 0:
                    self.pool.give(holder[0])
        self.sending = [item for i, item in enumerate(self.sending) if i not in finished]
        return True

    def _bye(self, worker: int) -> None:
        """A worker's runtime shut down; once every worker has, drop the rounds still open (their
        contributors left)."""
        self.byes[worker] += 1
        if min(self.byes) == max(self.byes) and self.rounds:
            log.warning("commlib server %d: the workers shut down with %d rounds open; dropping them",
                        self.index, len(self.rounds))
            self.rounds.clear()
