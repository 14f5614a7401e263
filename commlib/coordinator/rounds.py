"""Numbered rounds of one message from every rank: the coordinator's only way of learning what the others
submitted.

Every rank contributes to rounds 0, 1, 2, ... in order; round k is complete on a rank once it holds
round k's message from every rank still taking part, and every rank then sees the same messages in rank
order, so everything decided from complete rounds is decided identically everywhere without a further
message. A rank contributes when it has something new to say, and answers a round another rank has
started (with nothing, if it has nothing), so an idle rank never blocks the others and no round starts
without cause: an idle job sends nothing.

Two ways to deliver the messages, with the same interface:

- direct: each rank sends its message to every other rank. One message latency per round, p - 1 sends
  per rank. Messages from one sender arrive in order, so the k-th message from a rank is its round-k
  contribution and needs no number.
- relay: each rank sends its message to rank 0, which sends every rank the complete round. Two latencies,
  but O(p) messages per round in all, as Horovod's controller. Rank 0 also tells ranks that have not
  contributed to a round that it has started ("S", k); complete rounds travel as ("R", k, messages). When
  rank 0 leaves, it sends its last message to everyone ("G", message), which every other rank takes as a
  round of that message alone; nothing relays after it, so each rank then completes rounds of its own
  message alone, in which everything fails (it would anyway: every collective needs rank 0). What a rank
  had sent to rank 0 and rank 0 never relayed is lost: the caller fails it (:attr:`orphaned`).

:func:`make_rounds` picks: direct up to ``COMMLIB_DIRECT_MAX_RANKS`` ranks, relay above.
"""

from __future__ import annotations

import collections
from typing import Any

_START, _ROUND, _GONE = "S", "R", "G"


def make_rounds(channel, relay: bool) -> "Rounds":
    """The round exchange for ``channel``: through rank 0 (``relay``, and more than one rank) or direct."""
    return RelayedRounds(channel) if relay and channel.size > 1 else Rounds(channel)


class Rounds:
    """The direct round exchange (see the module docstring); :class:`RelayedRounds` relays through rank 0."""

    orphaned = False  # relay only: rank 0 left, and with it what it had not relayed

    def __init__(self, channel):
        self._channel = channel
        self.rank = channel.rank
        self.size = channel.size
        self.sent = 0                 # rounds this rank has contributed to
        self.completed = 0            # rounds complete on this rank
        self._highest = 0             # the most rounds any rank is known to have started
        self._inbox = [collections.deque() for _ in range(self.size)]
        self._active = list(range(self.size))   # ranks whose messages complete a round, in rank order
        self._peers = [r for r in self._active if r != self.rank]

    @property
    def left(self) -> bool:
        """This rank has sent its last message."""
        return self.rank not in self._active

    def contribute(self, message: Any, last: bool = False) -> None:
        """This rank's message for round ``sent``; ``last``: it takes no further part."""
        if self._peers:
            self._channel.post_all(self._peers, message)
        self._inbox[self.rank].append(message)
        self.sent += 1
        if last:
            self._active.remove(self.rank)

    def exchange(self, message: int, polls: int) -> list[tuple[int, Any]] | None:
        """:meth:`contribute` ``message``, then read the channel up to ``polls`` times until the round is
        complete: its messages, as :meth:`next_complete` returns them, or None while it is not. The lone
        path's round (:meth:`Coordinator._run_alone`), in one frame: its reads are most of a small call's
        negotiation."""
        peers = self._peers
        if peers:
            self._channel.post_all(peers, message)
        inbox = self._inbox
        inbox[self.rank].append(message)
        self.sent += 1
        active = self._active
        receive = self._channel.receive_all
        polled = 0
        while True:
            for r in active:
                if not inbox[r]:
                    break
            else:  # every rank's message is in (and some rank takes part: this one)
                self.completed += 1
                return [(r, inbox[r].popleft()) for r in active]
            if polled == polls:
                return None
            polled += 1
            for source, received in receive():
                if source in active:  # as receive(): a message of a rank that has left counts for nothing
                    box = inbox[source]
                    box.append(received)
                    started = self.completed + len(box)
                    if started > self._highest:
                        self._highest = started

    def owed(self) -> bool:
        """True while another rank has started a round that this rank has not contributed to."""
        return self._highest > self.sent

    def receive(self) -> bool:
        """Take in every message that has arrived; True if there was any."""
        received = self._channel.receive_all()
        for source, message in received:
            if source in self._active:  # else it has left (and this rank may have too): nothing counts
                self._take(source, message)
        return bool(received)

    def _take(self, source: int, message: Any) -> None:
        inbox = self._inbox[source]
        inbox.append(message)
        started = self.completed + len(inbox)
        if started > self._highest:
            self._highest = started

    def next_complete(self) -> list[tuple[int, Any]] | None:
        """The next round's messages as (rank, message) in rank order, once all have arrived; else None."""
        if self.blocked():
            return None
        self.completed += 1
        return [(r, self._inbox[r].popleft()) for r in self._active]

    def blocked(self) -> bool:
        """True while the next round lacks some rank's message (or no rank takes part any more)."""
        inbox = self._inbox
        for r in self._active:
            if not inbox[r]:
                return True
        return not self._active

    def missing(self) -> list[int]:
        """Ranks whose message for the oldest incomplete round has not arrived."""
        return [r for r in self._active if not self._inbox[r]]

    def leave(self, rank: int) -> None:
        """``rank`` takes no further part (it said so in its last message): later rounds complete without
        it. Called while handling a complete round, so every rank drops it from the same round on."""
        if rank in self._active:
            self._active.remove(rank)
            self._inbox[rank].clear()
        if rank in self._peers:
            self._peers.remove(rank)


class RelayedRounds(Rounds):
    """Rounds through rank 0 (see the module docstring). Rank 0 collects every rank's message, tells
    ranks behind that a round has started, and sends each complete round to all; the others send to and
    hear from rank 0 only. Once rank 0 has left, this rank completes rounds of its own alone."""

    def __init__(self, channel):
        super().__init__(channel)
        self._relaying = True
        self._ready: collections.deque = collections.deque()  # ranks other than 0: rounds rank 0 sent

    def contribute(self, message: Any, last: bool = False) -> None:
        if not self._relaying:
            return super().contribute(message, last)
        if self.rank != 0:
            self._channel.post(0, message)
            self.sent += 1
        else:
            self._inbox[0].append(message)
            self.sent += 1
            if last:  # rank 0 stops relaying: its last message goes straight to everyone
                for peer in self._peers:
                    self._channel.post(peer, (_GONE, message))
            elif self.sent > self._highest:
                self._started(self.sent)
        if last:
            self._active.remove(self.rank)

    def exchange(self, message: int, polls: int) -> list[tuple[int, Any]] | None:
        self.contribute(message)
        for _ in range(polls):
            if not self.blocked() or (self.receive() and not self.blocked()):
                return self.next_complete()
        return None

    def _take(self, source: int, message: Any) -> None:
        if not self._relaying:
            return super()._take(source, message)
        if self.rank == 0:
            inbox = self._inbox[source]
            inbox.append(message)
            if self.completed + len(inbox) > self._highest:
                self._started(self.completed + len(inbox))
        elif message[0] == _START:
            self._highest = max(self._highest, message[1] + 1)
        elif message[0] == _ROUND:
            self._ready.append(message[2])
            self._highest = max(self._highest, message[1] + 1)
        else:  # rank 0 left: its last message makes a round of its own, the last one relayed
            self._ready.append([(0, message[1])])

    def next_complete(self) -> list[tuple[int, Any]] | None:
        if not self._relaying or self.rank == 0:
            messages = super().next_complete()
            if messages is not None and self._relaying:
                for peer in self._peers:
                    self._channel.post(peer, (_ROUND, self.completed - 1, messages))
            return messages
        if not self._ready:
            return None
        self.completed += 1
        return self._ready.popleft()

    def blocked(self) -> bool:
        if not self._relaying or self.rank == 0:
            return super().blocked()
        return not self._ready

    def missing(self) -> list[int]:
        if not self._relaying or self.rank == 0:
            return super().missing()
        return [] if self._ready else [0]  # waiting for the relay

    def leave(self, rank: int) -> None:
        super().leave(rank)
        if self._relaying and rank == 0 and self.rank != 0:  # no relay any more: rounds of this rank alone
            self._relaying = False
            self.orphaned = True
            self._active = [self.rank] if self.rank in self._active else []
            self._peers = []
            self._inbox[self.rank].clear()
            self._highest = self.sent = self.completed

    def _started(self, rounds: int) -> None:
        """Rank 0: round ``rounds - 1`` has begun; tell the ranks that have not contributed to it."""
        self._highest = rounds
        for peer in self._peers:
            if self.completed + len(self._inbox[peer]) < rounds:
                self._channel.post(peer, (_START, rounds - 1))
