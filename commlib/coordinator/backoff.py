"""How a thread that drives the coordinator waits when a cycle made no progress: poll, yield, then sleep.

The phases are measured in time since the last progress, not in cycles: a cycle with nothing to read
takes a few microseconds, so a count of cycles ends the polling long before a reply can cross a network
(a 4 KiB allreduce between hosts took 0.61 ms against MPI's 0.061 ms when the waiter fell asleep after 64
idle cycles). ``SPIN_S`` is short: a spinning rank holds a core that the rank producing the reply may need (ranks can
outnumber cores), and on 2 hosts x 2 ranks over 2 cores a 1 ms spin made a 4 KiB allreduce 2.9 ms
against 0.83 ms with 50 us. After it the thread yields the core until ``YIELD_S``, then sleeps, longer
and longer, up to the cycle time (COMMLIB_CYCLE_TIME).
"""

from __future__ import annotations

import time

#: Poll without giving up the core for this long after the last progress (a reply on one host is near).
SPIN_S = 50e-6
#: Then yield the core (``sleep(0)``) until this long after the last progress (a reply from
#: another host arrives within it), then sleep.
YIELD_S = 2e-3
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
