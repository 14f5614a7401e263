"""Who drives the coordinator's cycle, and how a driver waits: polling, yielding, sleeping.

A thread waiting in ``synchronize`` (or a synchronous call) runs the cycle itself, because a thread
hand-off costs tens of microseconds (docs/results/design_choices.md). The background thread runs it when nobody waits (asynchronous
submissions, rank 0's stall check) and otherwise sleeps, reading messages every ``IDLE_POLL_S``. Woken by
a submission, it first waits one cycle time (``COMMLIB_CYCLE_TIME``) so that a burst of submissions
(a backward pass's gradients) is negotiated in one round; where it gathers whole bursts
(:func:`gather_limit_s`), it goes on waiting while submissions still arrive. A submitting thread wakes it
only when no wake is already on its way. How
long a driver waits between cycles that made no progress is :mod:`.backoff`'s policy, in one place.
"""

from __future__ import annotations

import os
import threading
import time

from .backoff import YIELD_S, Backoff, yield_core

REPLY_POLLS = 16          # reads of the channel right after contributing, before the next cycle
_get_ident = threading.get_ident
IDLE_POLL_S = 0.05        # how often an idle rank still reads control messages
GATHER_S = 0.01           # the longest a whole burst is gathered (gather_limit_s)


def gather_limit_s(topology) -> float:
    """How long the background thread may keep gathering a burst of submissions while they still arrive
    (0: one cycle time, then negotiate what came). ``GATHER_S`` where the process set is on one node and
    its ranks have no core to spare (as many ranks as cores this process may run on, or more): there no
    transfer crosses a network for the backward pass to hide, and each round negotiated and reduced
    during the pass takes a core and the GIL from the ranks computing the next gradients. Not across
    hosts: there the rounds started during the pass overlap the link (docs/results/design_choices.md).
    Nodes with spare cores keep one cycle: not measured."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return GATHER_S if topology.cross_size == 1 and topology.local_size >= cores else 0.0


def reply_arrived(rounds) -> bool:
    """After contributing to a round: read the channel until the round is complete (True) - peers at the
    same point answer within microseconds, so ``REPLY_POLLS`` reads back to back, then a read and a yield
    of the core in turn, as a waiting driver does (:mod:`.backoff`) - or until ``backoff.YIELD_S`` has
    passed (False: the general cycle waits from there, with its stall checks and sleeps)."""
    for _ in range(REPLY_POLLS):
        if not rounds.blocked() or (rounds.receive() and not rounds.blocked()):
            return True
    limit = time.perf_counter() + YIELD_S
    while time.perf_counter() < limit:
        yield_core()
        if rounds.receive() and not rounds.blocked():
            return True
    return not rounds.blocked()


class Progress:
    """Runs ``coordinator.cycle()`` from waiting user threads and from one background thread.

    The coordinator provides ``cycle() -> bool`` (True if it made progress), ``has_work()``,
    ``undecided()`` (requests announced and not yet decided), ``fail(exc)``, ``check_usable()``,
    ``lanes_threaded`` and ``submitted`` (a count of submissions). ``gather_s``: see
    :func:`gather_limit_s`."""

    def __init__(self, coordinator, cycle_s: float, name: str = "commlib-coordinator", gather_s: float = 0.0):
        self._coordinator = coordinator
        self._cycle_s = cycle_s
        self._gather_s = gather_s
        self._backoff = Backoff(cycle_s)
        self.lock = threading.Lock()            # held by the thread running a cycle
        self.holder = 0                         # that thread's ident (0: none)
        self._wakeup = threading.Condition()
        self._waiters: list = []                # an item per user thread inside wait() (append/pop: atomic)
        self._stopped = False
        self._woken = False                     # the thread is awake or a wake is on its way; cleared before it checks for work
        self._thread = threading.Thread(target=self._background, name=name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Tell the background thread there is something to drive."""
        if self._woken:  # the background thread is awake and looks at the work before it sleeps again
            return
        with self._wakeup:
            self._woken = True
            self._wakeup.notify()

    def wait(self, handle, before=None) -> None:
        """Drive the cycle in this thread until ``handle`` is done; ``before`` runs first, once this
        thread is registered as a waiter (so that the background thread leaves the cycle to it)."""
        self._waiters.append(None)
        try:
            if before is not None:
                before()
            self._drive(handle)
        finally:
            self._waiters.pop()

    def hold(self) -> bool:
        """Take the cycle if no thread runs it (True), as a waiter: a synchronous call with nothing else
        under way runs its request itself (:meth:`Coordinator._run_alone`); :meth:`let_go` gives it back."""
        if not self.lock.acquire(False):
            return False
        self._waiters.append(None)
        self.holder = _get_ident()
        return True

    def let_go(self) -> None:
        self.holder = 0
        self._waiters.pop()
        self.lock.release()

    def _drive(self, handle) -> None:
        coordinator = self._coordinator
        cycle_s = self._cycle_s
        timeout = max(cycle_s, 1e-3)
        lock = self.lock
        me = threading.get_ident()
        idle_since = None
        while not handle.done():
            coordinator.check_usable()
            if not lock.acquire(timeout=timeout):
                continue
            self.holder = me
            try:
                busy = coordinator.cycle()
            except Exception as exc:  # the user sees a CollectiveError, as every other rank's waiter will
                coordinator.fail(exc)
                coordinator.check_usable()
                raise
            finally:
                self.holder = 0
                lock.release()
            if busy:
                idle_since = None
                continue
            now = time.perf_counter()
            if idle_since is None:
                idle_since = now
            if coordinator.lanes_threaded and not coordinator.undecided():
                handle.wait_briefly(cycle_s)  # decided and queued on a lane: its thread completes it
            else:
                self._backoff.pause(now - idle_since)

    def _background(self) -> None:
        coordinator = self._coordinator
        idle_since = None
        while not self._stopped:
            with self._wakeup:
                # Cleared only here, just before the check for work (a submission after the check finds it
                # cleared and notifies); set again while the thread is awake, so that the submissions of a
                # burst (a backward pass's gradients, tens of microseconds apart) do not each notify a
                # thread that is already running (docs/results/design_choices.md).
                self._woken = False
                if self._waiters or not coordinator.has_work():
                    gather = self._wakeup.wait(IDLE_POLL_S)  # True: a submission woke it
                    self._woken = True
                    idle_since = None
                    if self._waiters or self._stopped:
                        continue
                else:
                    self._woken = True
                    gather = False
            if gather and self._cycle_s:
                # Woken by a submission: let the submitting thread add the rest of its burst first (a
                # backward pass hands over a gradient every few tens of microseconds), then negotiate them
                # in one round, as Horovod's cycle does. A cycle per submission costs CPU and the GIL
                # that the submitting thread needs (docs/results/design_choices.md).
                self._gather()
                if self._waiters:  # a thread waits for its result: it drives the cycle itself
                    continue
            if not self.lock.acquire(timeout=IDLE_POLL_S):
                continue
            self.holder = threading.get_ident()
            try:
                busy = coordinator.cycle()
            except BaseException as exc:  # reaches the user through the handles and the next call
                coordinator.fail(exc)
                return
            finally:
                self.holder = 0
                self.lock.release()
            if busy:
                idle_since = None
            elif coordinator.has_work():
                now = time.perf_counter()
                idle_since = now if idle_since is None else idle_since
                self._backoff.pause(now - idle_since)

    def _gather(self) -> None:
        """Let a burst of submissions come in: one cycle time, and with ``gather_s`` more cycles while
        submissions still arrived during the last one (up to ``gather_s``; a thread that starts waiting
        drives the cycle itself and ends the gathering)."""
        coordinator = self._coordinator
        seen = coordinator.submitted
        time.sleep(self._cycle_s)
        if not self._gather_s:
            return
        limit = time.perf_counter() + self._gather_s
        while coordinator.submitted != seen and not self._waiters and time.perf_counter() < limit:
            seen = coordinator.submitted
            time.sleep(self._cycle_s)

    def stop(self) -> None:
        """Stop the background thread (bounded wait)."""
        self._stopped = True
        with self._wakeup:
            self._wakeup.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
