"""The coordinator's control channel: small messages between ranks, never blocking. A bare non-negative int
(the common round message, a bit vector) travels as its bytes after a marker byte; anything else pickled.

Kept apart from the data communicators so that negotiation traffic can never match a collective's
messages. Besides round messages it carries two kinds of its own, on the same tag so that MPI keeps them
in order with everything else a rank sent (messages from one sender on one tag never overtake each
other): a notice (a stall verdict, read outside the rounds) and a goodbye (a rank's very last message:
once every peer's goodbye has arrived, nothing of theirs is still in flight, and the communicator can be
freed without a stray message reaching a later communicator that reuses its context).

Persistent requests carry the common case: per peer, a receive kept posted into a buffer of
``_POSTED_BYTES``, and sends of fixed sizes (``_FIXED_SIZES``) for ints below ``_FIXED_BELOW`` (the bit
vectors of the default cache's ids). An exchange of bit vectors between 2 ranks of one node took
1.22-1.25 us this way against 1.81-1.87 us with ``Isend`` and ``Iprobe``/``Recv``
(docs/results/design_choices.md). Beyond ``_POSTED_MAX_RANKS`` ranks a rank probes for messages from any
source instead of keeping a receive per peer posted. A message longer than ``_POSTED_BYTES`` sends its
length on ``_TAG`` (marker ``_LONG``) and its bytes on ``_LONG_TAG``, so it keeps its place in the order.

Nothing waits without a limit: a long message's bytes are received under the channel's
:class:`~.deadline.Deadline` (they may still be on a link that has just gone down), and
:meth:`ControlChannel.flush` waits at most the timeout.
"""

from __future__ import annotations

import time
from typing import Any

from mpi4py import MPI

from .deadline import Deadline

_TAG = 7
_LONG_TAG = 8  # the bytes of messages longer than _POSTED_BYTES, announced on _TAG
_PICKLE = MPI.pickle  # mpi4py's own pickler: what lowercase receives unpickle with
#: Round messages that are a bare int (a bit vector, the common message) travel as this byte and the int's
#: bytes, without pickling; a pickle always starts with b"\x80" (protocol 2 and later), so a receiver tells
#: them apart by their first byte.
_RAW_INT = 0
_LONG = 1  # on _TAG: a message of this many bytes (the int after this byte) follows on _LONG_TAG
#: Messages up to this many bytes travel on _TAG: into a posted receive's buffer, or (many ranks) probed.
#: Longer ones are announced there and received under the deadline (their bytes may still be on a link
#: that goes down). It holds an eager tensor (eager.TENSOR_BYTES) and its request: a 4 KiB eager call
#: between hosts (2x2) took 319-329 us where such a message went as two, against 251-262 us as one.
_POSTED_BYTES = 32 << 10
#: A probed message of up to this many bytes is received with a blocking receive: so small a message
#: travels eagerly, with its envelope, in every MPI. A longer one is received under the deadline.
_SMALL = 256
#: The persistent sends' sizes: the marker and an int of up to 64, 256 or 1024 bits (the bit vectors of
#: cache ids below 1024, the default cache's), each int in the smallest that holds it (bytes on a link).
_FIXED_SIZES = (9, 33, 129)
_FIXED_BELOW = 1 << (8 * (_FIXED_SIZES[-1] - 1))
#: 64-bit words of the int (0 to 16) -> the size of the smallest send that holds it
_FIXED_BY_WORDS = [min(size for size in _FIXED_SIZES if size - 1 >= 8 * words)
                   for words in range((_FIXED_SIZES[-1] - 1) // 8 + 1)]
#: Up to this many ranks (the direct rounds' default limit) each rank keeps a receive posted per peer;
#: beyond, it probes for messages from any source (no persistent receive from any source: under MPICH
#: 5.0.2's UCX netmod one lost a message within 3,000 exchanges between 2 emulated hosts).
_POSTED_MAX_RANKS = 16


_ANY = MPI.ANY_SOURCE
_testsome = MPI.Request.Testsome
_BYTE = MPI.BYTE


class _Notice:
    __slots__ = ("text", "lost")

    def __init__(self, text: str, lost: tuple = ()):
        self.text = text
        self.lost = lost  # world ranks the sender lost (a timeout), or () for a stall verdict

    def __reduce__(self):
        return (_Notice, (self.text, self.lost))


class _Goodbye:
    __slots__ = ()

    def __reduce__(self):
        return (_Goodbye, ())


class ControlChannel:
    """Non-blocking object messages over a communicator of its own.

    One thread at a time: the persistent requests, their buffers, the status and the list of sends are
    used without a lock. Its coordinator calls it only from the thread that holds its cycle
    (``Progress.lock``: the cycle, the lone path, ``watch``, close)."""

    def __init__(self, comm: "MPI.Comm", deadline: Deadline | None = None):
        self._comm = comm
        self.deadline = deadline if deadline is not None else Deadline()
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._sends: list[MPI.Request] = []
        self._isend = comm.Isend
        self._held: list = []   # per send: the bytes it reads from (they must outlive it)
        # size -> dest -> its persistent send of that size and the send's buffer
        self._fixed: dict[int, dict[int, tuple[MPI.Prequest, bytearray]]] = {size: {} for size in _FIXED_SIZES}
        self._status = MPI.Status()
        self._small = bytearray(_SMALL)  # receives a probed message of up to _SMALL bytes (many ranks)
        # up to _POSTED_MAX_RANKS ranks: a persistent receive kept posted per peer (from itself if alone)
        sources = [r for r in range(self.size) if r != self.rank] or [self.rank]
        self._posted = self.size <= _POSTED_MAX_RANKS
        self._inbound: list[MPI.Prequest] = []
        self._buffers: list[bytearray] = []
        self._sources = sources if self._posted else []
        for source in self._sources:
            buffer = bytearray(_POSTED_BYTES)
            self._buffers.append(buffer)
            self._inbound.append(comm.Recv_init([buffer, _POSTED_BYTES, _BYTE], source, _TAG))
        MPI.Prequest.Startall(self._inbound)
        self._statuses = [MPI.Status() for _ in self._inbound]
        self.notices: list[tuple[int, str, tuple]] = []  # read by receive_all, not yet taken
        self.farewells: set[int] = set()   # ranks whose goodbye has arrived
        # ranks lost for good (a PeerLostError named them): nothing more is sent to them. With hydra's
        # -disable-auto-cleanup (elastic recovery) a dead rank's endpoint stays in MPI, and a send to it
        # crashed the sender (segmentation fault in MPICH's UCX netmod, mpich 5.0.2 wheel)
        self.unreachable: set[int] = set()
        # under in-process recovery: once the runtime lost a peer (``deadline.lost``), send nothing at all.
        # Which peers are dead is known only to the elastic driver, and the recovery abandons this channel
        self.quiet_after_loss = False

    def post(self, dest: int, message: Any) -> None:
        """Send ``message`` to ``dest`` without waiting for it to be received."""
        self.post_all((dest,), message)

    def post_all(self, dests, message: Any) -> None:
        """Send ``message`` to every rank of ``dests``, encoded once: a bare non-negative int as its bytes
        (:data:`_RAW_INT`; below ``_FIXED_BELOW`` by the peer's persistent send when that is free),
        anything else pickled; ``receive_all`` decodes either."""
        if self.quiet_after_loss and self.deadline.lost is not None:
            return
        unreachable = self.unreachable
        if type(message) is int and 0 <= message < _FIXED_BELOW:
            size = _FIXED_BY_WORDS[(message.bit_length() + 63) >> 6]
            data = message.to_bytes(size - 1, "little")
            fixed = self._fixed[size]
            for dest in dests:
                if dest in unreachable:
                    continue
                slot = fixed.get(dest)
                if slot is None:
                    slot = fixed[dest] = self._fixed_send(dest, size)
                request, buffer = slot
                if request.Test():  # idle: its buffer is free
                    buffer[1:] = data
                    request.Start()
                else:  # the last one is still under way: an ordinary send, in order after it
                    self._send(b"\x00" + data, dest, _TAG)
            return
        if type(message) is int and message >= 0:
            data = b"\x00" + message.to_bytes((message.bit_length() + 7) // 8, "little")
        else:
            data = _PICKLE.dumps(message)
        for dest in dests:
            if dest in unreachable:
                continue
            if len(data) <= _POSTED_BYTES:
                self._send(data, dest, _TAG)
            else:
                self._send(bytes([_LONG]) + len(data).to_bytes(8, "little"), dest, _TAG)
                self._send(data, dest, _LONG_TAG)

    def _fixed_send(self, dest: int, size: int) -> tuple:
        buffer = bytearray(size)  # buffer[0] stays _RAW_INT
        return self._comm.Send_init([buffer, size, _BYTE], dest, _TAG), buffer

    def _send(self, data: bytes, dest: int, tag: int) -> None:
        self._sends.append(self._isend([data, _BYTE], dest, tag))
        self._held.append(data)
        if len(self._sends) > 64:
            self._reap()

    def post_notice(self, dest: int, text: str, lost: tuple = ()) -> None:
        """Send ``text`` outside the rounds: :meth:`receive_all` never returns it; :meth:`receive_notices`
        does. ``lost``: world ranks this rank timed out on."""
        self.post(dest, _Notice(text, tuple(lost)))

    def post_goodbye(self, dest: int) -> None:
        """This rank's last message to ``dest``."""
        self.post(dest, _Goodbye())

    def receive_all(self) -> list[tuple[int, Any]]:
        """Every round message that has arrived, as (source, message), in arrival order per source
        (notices and goodbyes are kept aside)."""
        received = []
        if not self._posted:
            self._probe_all(received)
        elif len(self._inbound) == 1:  # two ranks (or one): a Test, cheaper than Testsome on a list of one
            request, status, source, buffer = self._inbound[0], self._statuses[0], self._sources[0], self._buffers[0]
            while request.Test(status):
                self._take(received, source, buffer, status.Get_count(_BYTE), request)
        else:
            requests, statuses, sources, buffers = self._inbound, self._statuses, self._sources, self._buffers
            while True:
                done = _testsome(requests, statuses)
                if not done:
                    break
                for k, i in enumerate(done):  # (the statuses come in the order of ``done``)
                    self._take(received, sources[i], buffers[i], statuses[k].Get_count(_BYTE), requests[i])
        return received

    def _probe_all(self, received: list) -> None:
        """receive_all beyond _POSTED_MAX_RANKS ranks: probe, then receive (a small message into the kept
        buffer at once, a longer one under the deadline)."""
        status, comm, small = self._status, self._comm, self._small
        while comm.Iprobe(_ANY, _TAG, status):
            source, count = status.Get_source(), status.Get_count(_BYTE)
            if count <= _SMALL:
                comm.Recv([small, count, _BYTE], source, _TAG)
                self._take(received, source, small, count, None)
                continue
            data = bytearray(count)
            self._await(comm.improbe(source, _TAG).Irecv([data, _BYTE]), source)
            self._take(received, source, data, count, None)

    def _await(self, request: "MPI.Request", source: int) -> None:
        """Wait for the receive of a message's bytes from ``source`` under the deadline."""
        self.deadline.wait_quietly(request, self._comm, "a coordinator message", (source,))

    def _take(self, received: list, source: int, buffer: bytearray, count: int, request) -> None:
        """Decode the message of ``count`` bytes in ``buffer``, then restart ``request`` (its receive) - not
        before: a peer's next message may land in the buffer at once."""
        marker = buffer[0]
        if marker == _RAW_INT:  # a bare int: a round message
            value = int.from_bytes(buffer[1:count], "little")
            if request is not None:
                request.Start()
            received.append((source, value))
            return
        data = buffer[:count]
        if request is not None:
            request.Start()
        if marker == _LONG:
            data = bytearray(int.from_bytes(data[1:], "little"))
            self._await(self._comm.Irecv([data, _BYTE], source, _LONG_TAG), source)
            if data[0] == _RAW_INT:  # a bit vector of more than _POSTED_BYTES bytes (very high cache ids)
                received.append((source, int.from_bytes(data[1:], "little")))
                return
        message = _PICKLE.loads(data)
        kind = type(message)
        if kind is _Notice:
            self.notices.append((source, message.text, message.lost))
        elif kind is _Goodbye:
            self.farewells.add(source)
        else:
            received.append((source, message))

    def receive_notices(self) -> list[tuple[int, str, tuple]]:
        """The notices :meth:`receive_all` has read since the last call, as (source, text, lost ranks)."""
        notices, self.notices = self.notices, []
        return notices

    def _reap(self) -> None:
        pending = [i for i, r in enumerate(self._sends) if not r.Test()]
        self._sends = [self._sends[i] for i in pending]
        self._held = [self._held[i] for i in pending]

    def _persistent_sends(self) -> list:
        return [slot for slots in self._fixed.values() for slot in slots.values()]

    def _undelivered(self) -> list:
        """The sends still under way, persistent ones included."""
        self._reap()
        return self._sends + [request for request, _ in self._persistent_sends() if not request.Test()]

    def flush(self) -> None:
        """Wait until every posted message has been delivered (used at shutdown), at most the timeout."""
        pending = self._undelivered()
        if pending:
            self.deadline.wait(pending, self._comm, "delivering the last coordinator messages")
            self._sends, self._held = [], []

    def flush_for(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for every posted message to be delivered; True if all were."""
        deadline = time.monotonic() + seconds
        while True:
            if not self._undelivered():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)

    def close(self) -> None:
        """Cancel what is still under way (a peer already left) and free the requests and the communicator.
        A send still under way is freed without waiting: MPI completes or drops it."""
        lost = self.deadline.lost is not None  # messages may be stuck on it: left to the process's end
        for request in self._undelivered():
            try:
                request.Cancel()
            except MPI.Exception:
                pass
        try:
            for request in self._inbound:
                request.Cancel()
            if not lost:
                MPI.Request.Waitall(self._inbound)  # cancelled receives complete at once
            for request in self._inbound + [request for request, _ in self._persistent_sends()]:
                request.Free()
        except MPI.Exception:
            pass
        self._inbound = []
        self._sends, self._held = [], []
        self._fixed = {size: {} for size in _FIXED_SIZES}
        if not lost:
            self._comm.Free()
