"""The summation server: receives partitions, sums them, answers every contributor once per round.

Protocol: :mod:`.protocol`. Per key (a tensor name and partition) a round starts with its first push and
ends when every contributor has pushed; then the server sends the sum to each of them (no separate pull)
and forgets the key. The first push's buffer becomes the accumulator (no copy); each later one is added
with commlib's C kernels (which release the GIL). Half-precision partitions (float16, bfloat16) accumulate
in a float32 buffer and are rounded once for the answer, so every worker receives the same bits.

Memory is the rounds in flight: per open round one accumulator plus the pushes received but not yet added,
and answers until they are sent. Buffers are reused through a small pool.

With MPI as the data plane (COMMLIB_SERVER_TRANSPORT=mpi), one thread drives everything with
non-blocking MPI: a matched probe for headers, ``Testsome`` over the receives and sends. While transfers
are under way it only yields the core between polls (MPI moves a large message's data only while it is
polled: 1 ms sleeps there cost push_pull a third of its rate); idle, it yields, then sleeps
(``coordinator.backoff``). Over TCP (:mod:`.tcp`, the default), each worker's connection has a thread that
receives its pushes and adds them (under one lock, which the kernels' sums hold without the GIL), and a
thread that sends its answers; the main thread serves the control messages and Geo-SGD over MPI.

Nothing a worker sends is trusted (:mod:`.protocol`): a header is read as fixed binary fields within its
kind's bounds, a push must come from the worker it names and declare no more contributors than the job
has workers, and its data must be as long as its header says. A malformed header is dropped with a log
line naming its sender (over TCP the connection it came on is closed: it is out of step); a push whose
data does not match its header refuses its round, as a declaration that differs between workers does.
Either way the server goes on serving every other worker.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time

import numpy as np
from mpi4py import MPI

from .. import kernels
from ..compression import pushed
from ..coordinator.backoff import Backoff, yield_core
from ..dtypes import HALF, TABLE
from ..ops import ReduceOp
from . import mpi_messages, protocol, tcp
from .discovery import SERVER, Job, job as find_job
from .geo import GeoStore

log = logging.getLogger("commlib.server")

_WIRE = {row.name: row.numpy for row in TABLE if row.name in protocol.WIRE_DTYPES}
_F32 = np.dtype(np.float32)
_U8 = np.dtype(np.uint8)
#: Connections one worker may hold open to a server at once: one per runtime, and a runtime's closing one
#: beside its successor's; a worker index that opens more is refused (each holds a thread and a buffer).
LINKS_PER_WORKER = 4


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

    __slots__ = ("first", "acc", "pushed", "dests", "slots", "error", "arrived", "most")

    def __init__(self, first: protocol.Push):
        self.first = first
        self.acc: np.ndarray | None = None
        self.pushed: dict[int, int] = {}  # worker -> slot
        self.dests: dict = {}  # worker -> where its answer goes (a rank, or a TCP link)
        self.arrived = 0  # pushes whose data has been added
        self.error = ""
        self.most = first.contributors  # the most contributors any push declared: a refused round waits for them


class _Link:
    """One worker's TCP connection to this server: pushes come in on it, answers go out in order."""

    def __init__(self, conn: socket.socket, worker: int):
        self.conn = conn
        self.worker = worker
        self.out: queue.SimpleQueue = queue.SimpleQueue()  # (slot, answer or error text, holder); None ends
        self.closed = False  # under the server's lock: no more answers are queued


def open_server(comm: "MPI.Comm", transport: str, start_timeout_s: float = 0.0,
                congestion: str = tcp.CONGESTION, interface: str = "") -> "Server":
    """This process as a summation server of the job over ``comm`` (collective with the workers' first
    ``init()``): with ``transport`` "tcp" it listens on the job's interface (``interface`` names it, if
    set; :func:`.tcp.job_addresses`), its connections with ``congestion``, and reports where."""
    listeners: list[socket.socket] = []

    def listen(addresses: tuple[str, ...]) -> tcp.Endpoint:
        sockets, endpoint = tcp.listen(addresses, congestion)
        listeners.extend(sockets)
        return endpoint

    try:
        layout = find_job(comm, SERVER, start_timeout_s, listen if transport == "tcp" else None, interface)
    except BaseException:
        for listener in listeners:
            listener.close()
        raise
    return Server(layout, listeners=listeners)


class Server:
    """The loop of one summation server on ``job`` (this process is one of ``job.servers``); with
    ``listeners`` (:func:`open_server`) push_pull's data comes over TCP."""

    def __init__(self, job: Job, max_sleep_s: float = 1e-3, listeners: list[socket.socket] = ()):
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
        # TCP: the round state is shared by the connections' threads (the lock also covers the pool)
        self._lock = threading.Lock()
        self.listeners = list(listeners)
        self.endpoint = job.endpoints[job.servers[self.index]] if self.listeners else None
        self.links: list[_Link] = []
        self.unsent = 0  # answers queued on links, not yet sent (under the lock)
        self.dropped = 0  # malformed messages dropped (the log says what each was)
        for listener in self.listeners:
            self._spawn(self._accept, "commlib-server-accept", listener)

    # -- the loop ---------------------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until every worker's process has said it is exiting."""
        last = time.monotonic()
        while len(self.exits) < len(self.job.workers) or self.sending or self.geo.busy or self.unsent:
            moved = self._control() | self._headers() | self._received() | self._sent() | self.geo.progress()
            now = time.monotonic()
            if moved:
                last = now
            elif self.receiving or self.sending or self.geo.busy:
                yield_core()  # transfers under way progress only while MPI is polled: never sleep then
            else:
                self.backoff.pause(now - last)
        self.close()
        log.info("commlib server %d: every worker exited after %d rounds", self.index, self.rounds_done)

    def _headers(self) -> bool:
        moved = False
        for source, push in mpi_messages.arrived(self.comm, protocol.TAG_PUSH, self.status, protocol.Push):
            moved = True
            try:
                worker = self._sender(source)
                if isinstance(push, protocol.ProtocolError):
                    raise push
                push = self._admit(push, worker)
            except protocol.ProtocolError as exc:
                self._drop(f"rank {source}", exc)
                continue
            self._start(push, source, worker)
        return moved

    def _control(self) -> bool:
        moved = False
        for tag in (protocol.TAG_BYE, protocol.TAG_EXIT):
            while True:
                got = mpi_messages.receive(self.comm, tag, self.status, 0)
                if got is None:
                    break
                moved = True
                source, data = got
                try:
                    worker = self._sender(source)
                    if data is None:
                        raise protocol.ProtocolError(f"{'a bye' if tag == protocol.TAG_BYE else 'an exit'} notice "
                                                     "that is not empty")
                except protocol.ProtocolError as exc:
                    self._drop(f"rank {source}", exc)
                    continue
                if tag == protocol.TAG_BYE:
                    self._bye(worker)
                else:
                    self.exits.add(worker)
                    self.geo.exit(worker)
        return moved

    def _sender(self, source: int) -> int:
        """The worker index of the rank ``source``; :class:`.protocol.ProtocolError` for a rank that is
        not a worker."""
        worker = self.worker_of_rank.get(source)
        if worker is None:
            raise protocol.ProtocolError(f"a worker's message from rank {source}, which is not a worker")
        return worker

    def _admit(self, push: protocol.Push, worker: int) -> protocol.Push:
        """``push`` (decoded) if it may come from ``worker`` in this job; else :class:`.protocol.ProtocolError`."""
        if push.worker != worker or push.contributors > len(self.job.workers):
            raise protocol.ProtocolError(f"push {push.key!r} names worker {push.worker} and {push.contributors} "
                                         f"contributors; it came from worker {worker} of a job of "
                                         f"{len(self.job.workers)}")
        return push

    def _drop(self, sender: str, error: Exception) -> None:
        """Log a malformed message (dropped) from ``sender``."""
        self.dropped += 1
        log.error("commlib server %d: dropped a malformed message from %s: %s", self.index, sender, error)

    # -- pushes -----------------------------------------------------------------------------------------
    def _start(self, push: protocol.Push, source: int, worker: int) -> None:
        """A header arrived: post the receive of its data (always: the worker's send must complete)."""
        buf = self._buffer(push)
        request = self.comm.Irecv(buf.view(np.uint8), source=source, tag=push.slot)
        self.receiving.append((request, push, buf, self._register(push, worker, source)))

    def _buffer(self, push: protocol.Push) -> np.ndarray:
        """Where a push's data is received."""
        return self.pool.take(_U8 if push.codec else _WIRE[push.wire], push.nbytes if push.codec else push.count)

    def _register(self, push: protocol.Push, worker: int, dest) -> bool:
        """Count ``worker``'s push in its key's round (answers go to ``dest``: a rank, or a TCP link);
        False when its data is to be dropped (a second push of the same round, refused)."""
        key = (push.key, push.part)
        rnd = self.rounds.get(key)
        if rnd is None:
            rnd = self.rounds[key] = _Round(push)
        if self.trace is not None:
            self.trace.append((time.monotonic(), "header", worker, push.key, push.part))
        if worker in rnd.pushed:  # its data is received and dropped
            self._answer_error([(dest, push.slot)], (
                f"push_pull {push.key!r} partition {push.part}: worker {worker} pushed it again before every "
                f"worker had pushed the previous round; the workers declare this key differently (sizes) "
                f"or one of them stopped pushing it"))
            return False
        rnd.pushed[worker] = push.slot
        rnd.dests[worker] = dest
        rnd.most = max(rnd.most, push.contributors)
        if push.declaration() != rnd.first.declaration() and not rnd.error:
            rnd.error = (f"push_pull {push.key!r} partition {push.part}: worker {worker} declared "
                         f"{push.describe()}, worker {rnd.first.worker} declared {rnd.first.describe()}; "
                         "declare every key alike on every worker")
        return True

    def _received(self) -> bool:
        if not self.receiving:
            return False
        done = mpi_messages.test_some([r for r, *_ in self.receiving])
        if not done:
            return False
        finished = [self.receiving[i] + (nbytes,) for i, nbytes in done]
        keep = {i for i, _ in done}
        self.receiving = [item for i, item in enumerate(self.receiving) if i not in keep]
        for _, push, buf, counted, nbytes in finished:
            if self.trace is not None:
                self.trace.append((time.monotonic(), "received", push.worker, push.key, push.part))
            if nbytes != buf.nbytes and counted:
                self._mislength(push, nbytes if nbytes >= 0 else "more")
            if counted:
                self._add(push, buf)
            else:
                self.pool.give(buf)
        return True

    def _mislength(self, push: protocol.Push, got) -> None:
        """``push``'s data was not as long as its header declared: its round is refused (under the lock)."""
        log.error("commlib server %d: worker %d's push %r partition %d carried %s bytes, its header declared %d",
                  self.index, push.worker, push.key, push.part, got, push.data_bytes)
        rnd = self.rounds.get((push.key, push.part))
        if rnd is not None and not rnd.error:
            rnd.error = (f"push_pull {push.key!r} partition {push.part}: worker {push.worker}'s push carried {got} "
                         f"bytes, its header declared {push.data_bytes}; the push was corrupted")

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
        destinations = [(rnd.dests[w], slot) for w, slot in rnd.pushed.items()]
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
        for dest, slot in destinations:
            if isinstance(dest, _Link):
                self._queue(dest, (slot, answer, holder))
            else:
                self.sending.append((self.comm.Isend(answer.view(np.uint8), dest=dest, tag=slot), holder))

    def _answer_error(self, destinations, text: str) -> None:
        log.warning("commlib server %d: %s", self.index, text)
        for dest, slot in destinations:
            if isinstance(dest, _Link):
                self._queue(dest, (slot, text, None))
            else:
                refusal = protocol.Refusal(slot, protocol.cut(text)).encode()
                self.sending.append((mpi_messages.post(self.comm, refusal, dest, protocol.TAG_ERROR), None))

    def _sent(self) -> bool:
        if not self.sending:
            return False
        done = MPI.Request.Testsome([r for r, _ in self.sending])
        if not done:
            return False
        finished = set(done)
        for i in done:
            self._release(self.sending[i][1])
        self.sending = [item for i, item in enumerate(self.sending) if i not in finished]
        return True

    def _release(self, holder: list | None) -> None:
        """One send of a shared answer is over (sent, or dropped): the answer's buffer goes back to the pool
        after the last (``holder``: ``[answer, sends left]``; None for an error message)."""
        if holder is not None:
            holder[1] -= 1
            if holder[1] == 0:
                self.pool.give(holder[0])

    def _bye(self, worker: int) -> None:
        """A worker's runtime shut down; once every worker has, drop the rounds still open (their
        contributors left)."""
        with self._lock:
            self.byes[worker] += 1
            if min(self.byes) == max(self.byes) and self.rounds:
                log.warning("commlib server %d: the workers shut down with %d rounds open; dropping them",
                            self.index, len(self.rounds))
                self.rounds.clear()

    # -- TCP (tcp.py) -----------------------------------------------------------------------------------
    def _spawn(self, target, name: str, *args) -> None:
        threading.Thread(target=target, args=args, name=name, daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        """Take the workers' connections (each runtime of each worker opens one per server)."""
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the server is exiting
                return
            self._spawn(self._welcome, "commlib-server-hello", conn)  # a silent peer holds only its thread

    def _welcome(self, conn: socket.socket) -> None:
        """Check a new connection's introduction; a worker's gets its receiving and sending threads."""
        worker = tcp.accept_hello(conn, self.endpoint, self.index)
        if worker is None or not 0 <= worker < len(self.job.workers):
            conn.close()
            return
        link = _Link(conn, worker)
        with self._lock:  # a worker's earlier runtimes' connections have ended
            self.links = [old for old in self.links if not old.closed]
            crowded = sum(old.worker == worker for old in self.links) >= LINKS_PER_WORKER
            if not crowded:
                self.links.append(link)
        if crowded:
            self._drop(f"worker {worker}", protocol.ProtocolError(f"a connection beyond the {LINKS_PER_WORKER} "
                                                                  "a worker may hold open"))
            conn.close()
            return
        self._spawn(self._receive, f"commlib-server-recv-{worker}", link)
        self._spawn(self._answer, f"commlib-server-send-{worker}", link)

    def _receive(self, link: _Link) -> None:
        """One worker's pushes: each header, its data into a buffer, then added to its round."""
        conn = link.conn
        try:
            while True:
                push, size = tcp.recv_head(conn, (protocol.Push,))
                self._admit(push, link.worker)
                with self._lock:
                    buf = self._buffer(push)
                    counted = self._register(push, link.worker, link)
                if buf.nbytes != size:  # bounded by the frame's check: read and drop it, refuse the round
                    tcp.discard(conn, size)
                    if counted:
                        with self._lock:
                            self._mislength(push, size)
                else:
                    tcp.recv_exact(conn, memoryview(buf.view(np.uint8)))
                if self.trace is not None:
                    self.trace.append((time.monotonic(), "received", push.worker, push.key, push.part))
                with self._lock:
                    if counted:
                        self._add(push, buf)
                    else:
                        self.pool.give(buf)
        except protocol.ProtocolError as exc:  # a malformed frame: this connection is unusable, the server goes on
            self._drop(f"worker {link.worker}'s connection (closed)", exc)
        except OSError as exc:  # the worker closed its connection (its runtime shut down)
            log.debug("commlib server %d: worker %d's connection ended: %s", self.index, link.worker, exc)
        finally:
            with self._lock:
                link.closed = True
                link.out.put(None)
            try:
                conn.shutdown(socket.SHUT_RD)
            except OSError:
                pass

    def _answer(self, link: _Link) -> None:
        """One worker's answers, in the order the rounds completed."""
        conn, broken = link.conn, False
        while True:
            item = link.out.get()
            if item is None:
                break
            slot, answer, holder = item
            if not broken:
                try:
                    if holder is None:  # a refused round: the message
                        tcp.send_frame(conn, tcp.REFUSAL, protocol.Refusal(slot, protocol.cut(answer)).encode())
                    else:
                        tcp.send_frame(conn, tcp.ANSWER, protocol.Answer(slot).encode(), answer.view(np.uint8))
                except OSError:  # the worker went away; what is queued for it is dropped
                    broken = True
            with self._lock:
                self.unsent -= 1
                self._release(holder)
        conn.close()

    def _queue(self, link: _Link, item: tuple) -> None:
        """Queue an answer on ``link`` (under the lock); dropped when the worker's connection has ended."""
        if link.closed:
            self._release(item[2])
            return
        self.unsent += 1
        link.out.put(item)

    def close(self) -> None:
        """Stop taking connections and close the workers' (the server is exiting)."""
        if not self.listeners:
            return
        for listener in self.listeners:
            listener.close()
        with self._lock:
            links = list(self.links)
        for link in links:
            try:
                link.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
