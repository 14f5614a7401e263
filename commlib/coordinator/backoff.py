"""How a thread that drives the coordinator waits when a cycle made no progress: yield, then sleep.

The phases are measured in time since the last progress, not in cycles: a cycle with nothing to read
takes a few microseconds, so a count of cycles ends the waiting long before a reply can cross a network.
Until ``YIELD_S`` the thread yields the core after every empty cycle, then it sleeps, longer
and longer, up to the cycle time (COMMLIB_CYCLE_TIME).

It never spins without yielding: ranks can outnumber cores, and a spinning rank holds a core that the
rank producing the reply may need. Yielding is ``os.sched_yield()``, not ``time.sleep(0)``: a zero
sleep's deadline has passed when the kernel looks at it, so it returns without giving up the core. A
spin before yielding gains nothing either: the replies read right after contributing
(``progress.REPLY_POLLS``) already catch a reply that is microseconds away (the measurements:
docs/results/design_choices.md).
"""

from __future__ import annotations

import os
import time

#: Yield the core after each empty cycle until this long after the last progress (a reply from another
#: host arrives within it), then sleep.
YIELD_S = 2e-3
#: The first sleep; later ones grow with the idle time, up to the cycle time.
MIN_SLEEP_S = 20e-6

yield_core = getattr(os, "sched_yield", lambda: time.sleep(0))  # where the OS has no sched_yield


class Backoff:
    """The waiting policy of one driving thread. ``pause(idle_s)`` after a cycle without progress, where
    ``idle_s`` is the time since the last cycle that made progress."""

    def __init__(self, max_sleep_s: float, yield_s: float = YIELD_S):
        self.max_sleep_s = max_sleep_s
        self.yield_s = yield_s

    def pause(self, idle_s: float) -> None:
        if idle_s < self.yield_s:
            yield_core()
            return
        time.sleep(min(self.max_sleep_s, max(MIN_SLEEP_S, (idle_s - self.yield_s) / 8)))
