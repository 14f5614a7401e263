"""How a thread that drives the coordinator waits when a cycle made no progress: poll, yield, then sleep.

The phases are measured in time since the last progress, not in cycles: a cycle with nothing to read
takes a few microseconds, so a count of cycles ends the polling long before a reply can cross a network
(a 4 KiB allreduce between hosts took 0.61 ms against MPI's 0.061 ms when the waiter fell asleep after 64
idle cycles). ``SPIN_S`` covers a negotiation round trip between hosts with room to spare; after it the
thread yields the core (others may need it to produce the reply: ranks can outnumber cores), and after
``YIELD_S`` it sleeps, longer and longer, up to the cycle time (COMMLIB_CYCLE_TIME).
"""

from __future__ import annotations

import time

#: Poll without giving up the core for this long after the last progress (a reply is likely imminent).
SPIN_S = 1e-3
#: Then yield the core (``sleep(0)``) until this long after the last progress, then sleep.
YIELD_S = 5e-3
#: The first sleep; later ones grow with the idle time, up to the cycle time.
MIN_SLEEP_S = 20e-6


class Backoff:
    """The waiting policy of one driving thread. ``pause(idle_s)`` after a cycle without progress, where
    ``idle_s`` is the time since the last cycle that made progress."""

    def __init__(self, max_sleep_s: float, spin_s: float = SPIN_S, yield_s: float = YIELD_S):
        self.max_sleep_s = max_sleep_s
        self.spin_s = spin_s
        self.yield_s = max(yield_s, spin_s)

    def pause(self, idle_s: float) -> None:
        if idle_s < self.spin_s:
            return
        if idle_s < self.yield_s:
            time.sleep(0)
            return
        time.sleep(min(self.max_sleep_s, max(MIN_SLEEP_S, (idle_s - self.yield_s) / 8)))
