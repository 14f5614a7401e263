"""The coordinator's control channel: small messages between ranks, never blocking. A bare non-negative int
(the common round message, a bit vector) travels as its bytes after a marker byte; anything else pickled.

Kept apart from the data communicators so that negotiation traffic can never match a collective's
messages. Besides round messages it carries two kinds of its own, on the same tag so that MPI keeps them
in order with everything else a rank sent (messages from one sender on one tag never overtake each
other): a notice (a stall verdict, read outside the rounds) and a goodbye (a rank's very last message:
once every peer's goodbye has arrived, nothing of theirs is still in flight, and the communicator can be
freed without a stray message reaching a later communicator that reuses its context).

Nothing waits without a limit: a message whose envelope has arrived is received under the channel's
:class:`~.deadline.Deadline` (its bytes may still be on a link that has just gone down), and
:meth:`ControlChannel.flush` waits at most the timeout.
"""

from __future__ import annotations

import time
from typing import Any

from mpi4py import MPI

from ..cache import BoundedCache
from .deadline import Deadline

_TAG = 7
_PICKLE = MPI.pickle  # mpi4py's own pickler: what lowercase receives unpickle with
#: Round messages that are a bare int (a bit vector, the common message) travel as this byte and the int's
#: bytes, without pickling; a pickle always starts with b"\x80" (protocol 2 and later), so a receiver tells
#: them apart by their first byte.
_RAW_INT = 0
#: Messages up to this many bytes are received into a buffer kept for it, with a blocking receive once
#: probed: a message this small travels eagerly, with its envelope, in every MPI. Longer ones are received
#: under the deadline (their bytes may still be on a link that goes down).
_SMALL = 256


_ANY = MPI.ANY_SOURCE
_BYTE = MPI.BYTE
_KEEP, _KEEP_BELOW = 256, 1 << 64  # encoded messages kept: at most this many, of ints below this


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

    One thread at a time: :meth:`receive_all` probes, then receives the probed message into a buffer and
    a status kept on the channel, and the sends are listed without a lock. Its coordinator calls it only
    from the thread that holds its cycle (``Progress.lock``: the cycle, the lone path, ``watch``, close)."""

    def __init__(self, comm: "MPI.Comm", deadline: Deadline | None = None):
        self._comm = comm
        self.deadline = deadline if deadline is not None else Deadline()
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._sends: list[MPI.Request] = []
        self._isend, self._iprobe = comm.Isend, comm.Iprobe
        self._encoded = BoundedCache(_KEEP)  # bare-int message -> its buffer spec (the lone path's bits recur)
        self._held: list = []   # per send: the pickled bytes it reads from (post_all), or None
        self._status = MPI.Status()
        self._small = bytearray(_SMALL)  # receives messages of up to _SMALL bytes (receive_all)
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
        if dest in self.unreachable or (self.quiet_after_loss and self.deadline.lost is not None):
            return
        self._sends.append(self._comm.isend(message, dest, _TAG))
        self._held.append(None)  # isend keeps its own buffer
        if len(self._sends) > 64:
            self._reap()

    def post_all(self, dests, message: Any) -> None:
        """Send ``message`` to every rank of ``dests``, encoded once: a bare non-negative int as its bytes
        (:data:`_RAW_INT`), anything else pickled (what ``isend`` does per destination); ``receive_all``
        decodes either."""
        if self.quiet_after_loss and self.deadline.lost is not None:
            return
        if type(message) is int and message >= 0:
            spec = self._encoded.get(message)
            if spec is None:
                data = b"\x00" + message.to_bytes((message.bit_length() + 7) // 8, "little")
                spec = self._encoded.put(message, [data, _BYTE]) if message < _KEEP_BELOW else [data, _BYTE]
        else:
            spec = [_PICKLE.dumps(message), _BYTE]
        send, sends, unreachable = self._isend, self._sends, self.unreachable
        for dest in dests:
            if dest in unreachable:
                continue
            sends.append(send(spec, dest, _TAG))
            self._held.append(spec)  # the buffer must outlive the send
        if len(sends) > 64:
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
        status, comm, small, iprobe = self._status, self._comm, self._small, self._iprobe
        while True:
            if not iprobe(_ANY, _TAG, status):
                return received
            source = status.Get_source()
            count = status.Get_count(_BYTE)
            if count <= _SMALL:  # probed, and small enough to have come with its envelope
                comm.Recv([small, count, _BYTE], source, _TAG)
                if small[0] == _RAW_INT:  # a bare int: a round message
                    received.append((source, int.from_bytes(small[1:count], "little")))
                    continue
                message = _PICKLE.loads(small[:count])
            else:  # the first message from ``source`` on this tag: the one probed, received under the deadline
                data = bytearray(count)
                request = comm.improbe(source, _TAG).Irecv([data, _BYTE])
                self.deadline.wait_quietly(request, comm, "a coordinator message", (source,))
                if data[0] == _RAW_INT:  # a bit vector of more than _SMALL bytes (high cache ids)
                    received.append((source, int.from_bytes(data[1:], "little")))
                    continue
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

    def flush(self) -> None:
        """Wait until every posted message has been delivered (used at shutdown), at most the timeout."""
        if self._sends:
            self.deadline.wait(self._sends, self._comm, "delivering the last coordinator messages")
            self._sends, self._held = [], []

    def flush_for(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for every posted message to be delivered; True if all were."""
        deadline = time.monotonic() + seconds
        while True:
            self._reap()
            if not self._sends:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)

    def close(self) -> None:
        self._reap()
        for request in self._sends:  # undeliverable at shutdown: a peer already left
            try:
                request.Cancel()
            except MPI.Exception:
                pass
        self._sends, self._held = [], []
        if self.deadline.lost is None:  # else messages may be stuck on it: left to the process's end
            self._comm.Free()
