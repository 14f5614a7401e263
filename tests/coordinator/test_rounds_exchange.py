"""``Rounds.exchange`` (the lone path's round) against the general steps it stands for - ``contribute``,
then ``receive`` until ``next_complete`` has the round - fed the same arrivals: the same round, the same
state after it (rounds sent and complete, the highest round started, what is left in the inboxes)."""

from __future__ import annotations

import pytest

from commlib.coordinator.rounds import Rounds


class _Channel:
    """Arrivals scripted per read: ``reads[i]`` is what the i-th ``receive_all`` returns."""

    def __init__(self, rank: int, size: int, reads: list):
        self.rank, self.size = rank, size
        self._reads = [list(r) for r in reads]
        self.posted = []

    def post_all(self, dests, message):
        self.posted.append((list(dests), message))

    def receive_all(self):
        return self._reads.pop(0) if self._reads else []


def _general(rounds: Rounds, message, polls: int):
    rounds.contribute(message)
    for _ in range(polls):
        if not rounds.blocked() or (rounds.receive() and not rounds.blocked()):
            return rounds.next_complete()
    return None


def _state(rounds: Rounds, channel: _Channel) -> tuple:
    return (rounds.sent, rounds.completed, rounds.owed(), [list(box) for box in rounds._inbox], channel.posted,
            channel._reads)


SCRIPTS = {
    "at once": (3, [[(1, 4), (2, 4)]], 16),
    "one by one": (3, [[], [(2, 4)], [], [(1, 4)]], 16),
    "too late": (3, [[(1, 4)], [], []], 2),
    "a peer ahead": (2, [[(1, 4), (1, 8)]], 16),  # its next round's message came along: this rank owes it
    "a peer's last message": (3, [[(1, ("full", 4, {"gone": "left"})), (2, 4)]], 16),
    "single rank": (1, [], 16),
}


@pytest.mark.parametrize("script", SCRIPTS, ids=list(SCRIPTS))
def test_exchange_is_contribute_then_receive_until_complete(script):
    size, reads, polls = SCRIPTS[script]
    fast_channel, general_channel = _Channel(0, size, reads), _Channel(0, size, reads)
    fast, general = Rounds(fast_channel), Rounds(general_channel)
    got = fast.exchange(4, polls)
    assert got == _general(general, 4, polls)
    assert _state(fast, fast_channel) == _state(general, general_channel)
    assert (got is None) == (script == "too late")


def test_exchange_ignores_a_rank_that_left():
    """A message from a rank that took its leave counts for nothing (as ``receive`` drops it)."""
    reads = [[(2, 4)], [(1, 4)]]
    fast_channel, general_channel = _Channel(0, 3, reads), _Channel(0, 3, reads)
    fast, general = Rounds(fast_channel), Rounds(general_channel)
    fast.leave(2)
    general.leave(2)
    got = fast.exchange(4, 16)
    assert got == _general(general, 4, 16) == [(0, 4), (1, 4)]
    assert _state(fast, fast_channel) == _state(general, general_channel)
