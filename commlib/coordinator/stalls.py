"""Stall inspection: tensors some ranks submitted and others did not, and peers that stopped answering.

Two kinds of stall, told apart by whether rounds still complete (docs/coordinator.md, Stalls):

- A tensor stall: rounds complete, but some ranks have not submitted a tensor that others did (usually a
  bug: the ranks call different collectives). Only rank 0 checks this, from its ready table, since a
  decision taken from a clock would differ between ranks: after ``COMMLIB_STALL_CHECK_TIME`` it logs the
  tensor with its missing ranks; after ``COMMLIB_STALL_SHUTDOWN_TIME`` it names the tensor in its next
  round message, and the tensor fails on every rank in that round, which completes (every rank answers).
- A silent peer: this rank has contributed to a round that some rank never answers (stopped, swapped out,
  looping without calling commlib, or holding the GIL). No round completes, so a verdict sent in a round
  would never arrive. Every rank checks this on its own clock: after the check time it logs the silent
  ranks; after the shutdown time it gives up, tells every peer with a notice outside the rounds (the
  control channel's notice tag, read while a rank waits), and fails. A rank that receives the notice
  fails too. Giving up ends the coordinator (as Horovod shuts down on a stall): everything pending and
  every later call fails, naming the silent ranks, so no rank ever decides from a round another rank
  abandoned.
"""

from __future__ import annotations

import logging

log = logging.getLogger("commlib")


class StallInspector:
    """The clock-driven checks of one coordinator. ``check`` returns what the coordinator must do."""

    def __init__(self, rank: int, config, describe_ranks=None, relayed: bool = False):
        self.rank = rank
        self._check_s = config.stall_check_time_s
        self._shutdown_s = config.stall_shutdown_time_s
        # A silent peer is given up on after the stall shutdown time or the timeout, whichever is first.
        self._limit_s = config.wait_limit_s
        # Through the relay a rank other than 0 only sees rank 0 missing; rank 0 sees who is, and its
        # notice should normally come first: the others give up on their own only later.
        self._give_up_s = self._limit_s * (1.5 if relayed and rank != 0 else 1.0)
        # how often the clock is looked at while waiting: often enough to give up within ~10% of the limit
        self._every_s = max(min(self._check_s or 5.0, self._limit_s / 10, 5.0), 0.05)
        self._describe = describe_ranks or (lambda ranks: f"rank(s) {ranks}")
        self._next_check = 0.0
        self._stuck_since = 0.0       # when this rank began waiting for a round (0: not waiting)
        self._failing = False         # rank 0: stalled tensors named, their round not yet complete
        self._warned: dict[str, float] = {}
        self._silent_warned = 0.0     # when silent peers were last logged
        self._next_tensor_check = 0.0  # rank 0: when tensor stalls are next looked at

    @property
    def stuck_since(self) -> float:
        return self._stuck_since

    def waiting(self, stuck: bool, now: float) -> bool:
        """Record whether this rank waits for a round (at ``now``); True when it is time for :meth:`check`."""
        if stuck:
            if not self._stuck_since:
                self._stuck_since = now
        elif self._stuck_since:
            self._stuck_since = 0.0
        return ((self._stuck_since and now >= self._next_check) or
                (self.rank == 0 and self._check_s and now >= self._next_check))

    def check(self, now: float, table, missing_ranks) -> tuple[list[str] | None, tuple | None]:
        """Log stalls; return (tensor names rank 0 fails in its next round message, or None; a verdict
        giving up on silent peers, as (text, silent set ranks), or None). ``missing_ranks()`` lists the
        ranks whose message for the oldest open round has not arrived."""
        check, shutdown = self._check_s, self._shutdown_s
        self._next_check = now + self._every_s
        verdict = None
        waited = now - self._stuck_since if self._stuck_since else 0.0
        if waited >= self._give_up_s:
            silent = missing_ranks()
            if silent:
                setting = (f"COMMLIB_STALL_SHUTDOWN_TIME={shutdown:g}" if shutdown and shutdown <= self._limit_s
                           else f"COMMLIB_TIMEOUT={self._limit_s:g}")
                verdict = (f"{self._describe(silent)} sent no coordinator message for {waited:.0f} s "
                           f"({setting}): a process stopped answering (its link is down, its host frozen, "
                           "or it is stopped, looping without calling commlib, or holding the GIL); "
                           "commlib gave up", silent)
        elif check and self._stuck_since and waited >= check and now - self._silent_warned >= min(check, 5.0):
            self._silent_warned = now
            silent = missing_ranks()
            log.warning("commlib stall: rank %d has waited %.0f s for a coordinator message from %s; "
                        "a process may have died, or be stuck without releasing the GIL",
                        self.rank, waited, self._describe(silent))
        if self.rank != 0 or not check or now < self._next_tensor_check:
            return None, verdict
        self._next_tensor_check = now + max(min(check, 5.0), 0.05)
        stalled = table.stalled(check, now)
        self._warned = {name: t for name, t in self._warned.items() if any(name == s for s, _ in stalled)}
        for name, missing in stalled:
            last = self._warned.get(name)
            if last is None or now - last >= check:
                self._warned[name] = now
                log.warning("commlib stall: tensor %r was submitted by some ranks more than %g s ago; "
                            "waiting for %s", name, check, self._describe(missing))
        names = None
        if shutdown and not self._failing:
            names = [name for name, _ in table.stalled(shutdown, now)] or None
            self._failing = names is not None
        return names, verdict

    def fail_applied(self) -> None:
        """Rank 0's named tensors were failed in a complete round: it may name more."""
        self._failing = False
