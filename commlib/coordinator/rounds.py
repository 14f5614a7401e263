"""Numbered rounds of one message from every rank: the coordinator's only way of learning what the others
submitted.

Every rank contributes to rounds 0, 1, 2, ... in order, sending its contribution for round k to every
other rank; round k is complete on a rank once it holds round k's message from every rank still taking
part. Messages from one sender arrive in order, so the k-th message from a rank is its round-k
contribution and needs no number. A rank contributes when it has something new to say, and answers a
round another rank has started (with nothing, if it has nothing), so an idle rank never blocks the
others and no round is ever started without cause: an idle job sends nothing.

Because every rank sees the same messages per round and handles them in rank order, everything decided
from complete rounds is decided identically everywhere without a further message.
"""

from __future__ import annotations

import collections
from typing import Any


class Rounds:
    """The round exchange over a control channel (see the module docstring)."""

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
        for peer in self._peers:
            self._channel.post(peer, message)
        self._inbox[self.rank].append(message)
        self.sent += 1
        if last:
            self._active.remove(self.rank)

    def owed(self) -> bool:
        """True while another rank has started a round that this rank has not contributed to."""
        return self._highest > self.sent

    def receive(self) -> bool:
        """Take in every message that has arrived; True if there was any."""
        received = self._channel.receive_all()
        for source, message in received:
            if source not in self._active:
                continue  # it has left (and this rank may have too): nothing it sends counts
            inbox = self._inbox[source]
            inbox.append(message)
            started = self.completed + len(inbox)
            if started > self._highest:
                self._highest = started
        return bool(received)

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
