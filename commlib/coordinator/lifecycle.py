"""Failure and shutdown of a coordinator: what every rank does when it, or a peer, stops.

- Failure: an exception in the cycle (or a stall verdict, :class:`StallShutdown`) fails every pending
  handle with it, makes every later call raise, and says ``gone`` to the others in this rank's last round
  message, so that they fail what needs this rank.
- Shutdown (``shutdown()``): pending operations fail; this rank's last message says ``gone``; then it sends
  every peer a goodbye and waits (at most ``_SHUTDOWN_GRACE_S``) for theirs. Messages from one sender on
  one tag never overtake each other, so once every goodbye is in, nothing of the peers' is in flight and
  the communicator can be freed: a stray message would otherwise reach a later communicator that reuses
  its context (as ``shutdown()`` followed by ``init()`` across hosts would).
- Leaving (the process exits without ``shutdown()``: ``init()`` registers an exit hook, ``shutdown()``
  removes it): the same path with the reason :data:`LEFT`, except that it waits only for its own sends
  (at most ``_LEAVE_FLUSH_S``), not for the others, who may be waiting for this rank. Its last message is
  its contribution to the oldest round it has not answered, the round the others wait in, so that round
  completes and every rank fails what needs the leaver, naming it.
"""

from __future__ import annotations

import logging
import time

from ..errors import CollectiveError, CommlibError

log = logging.getLogger("commlib")

_SHUTDOWN_GRACE_S = 10.0   # how long shutdown waits for the other ranks to shut down too
_LEAVE_FLUSH_S = 2.0       # how long a leaving process waits for its last message to be delivered

#: The reason a leaving rank gives in its last message (the exit hook's shutdown path).
LEFT = "left: its process exited without calling commlib.shutdown()"


class Lifecycle:
    """The failure and shutdown half of :class:`~.controller.Coordinator` (which it is a base of: the
    two share the coordinator's state)."""

    def check_usable(self) -> None:
        """Raise if this coordinator failed or was shut down."""
        if self._failure is not None:
            raise self._failure_error()
        if self._closed:
            raise CollectiveError("commlib has been shut down; call commlib.init() to use it again")

    def _failure_error(self) -> CollectiveError:
        where = self._who(self.rank)
        if isinstance(self._failure, StallShutdown):
            error = CollectiveError(f"commlib stopped on {where}: {self._failure}")
        else:
            error = CollectiveError(f"commlib's background coordinator failed on {where}: "
                                    f"{type(self._failure).__name__}: {self._failure}")
        error.__cause__ = self._failure
        return error

    def fail(self, exc: BaseException) -> None:
        """The cycle raised ``exc``: fail everything pending and every later call, and tell the others."""
        if self._failure is not None:
            return
        self._failure = exc
        if not isinstance(exc, StallShutdown):
            log.error("commlib coordinator failed on rank %d: %r", self._world_ranks[self.rank], exc)
        self._fail_all(str(self._failure_error()))
        try:
            self._announce_gone(f"failed ({type(exc).__name__}: {exc})")
        except BaseException:  # the channel itself may be what failed
            pass

    def _fail_all(self, reason: str) -> None:
        with self._names:
            entries = list(self._in_flight.values())
            self._in_flight.clear()
        self._incoming.clear()
        self._undecided.clear()
        self._eager.clear()
        for entry in entries:
            entry.handle.set_error(CollectiveError(f"tensor {entry.meta.name!r}: {reason}"))

    def _announce_gone(self, reason: str) -> None:
        """This rank's last message: later rounds complete without it."""
        if self._rounds.left:
            return
        self._incoming.clear()
        self._extra["gone"] = reason
        self._contribute(last=True)

    def close(self, leaving: bool = False) -> None:
        """Stop the coordinator: pending operations fail, and the other ranks are told. ``leaving``: the
        process is exiting without ``shutdown()`` (the exit hook); do not wait for the others."""
        if self._closed:
            return
        self._closed = True
        self._progress.stop()
        with self._progress.lock:
            self._fail_all("commlib was shut down before it completed" if not leaving else
                           "this process is exiting without commlib.shutdown()")
            try:
                self._announce_gone(LEFT if leaving else "shut down")
                if leaving:
                    self._say_goodbye()
                    self._channel.flush_for(_LEAVE_FLUSH_S)
                else:
                    self._await_peers_shutdown()
            except Exception as exc:  # a failed coordinator may have lost its channel: still shut down
                if self._failure is None and not leaving:
                    raise
                log.warning("commlib shutdown after a failure on rank %d: %r", self._world_ranks[self.rank], exc)
        self._lanes.close()
        self._channel.close()

    def _say_goodbye(self) -> None:
        for peer in range(self.size):
            if peer != self.rank:
                self._channel.post_goodbye(peer)

    def _await_peers_shutdown(self) -> None:
        """Wait (bounded) for every peer's goodbye, its last message: then nothing of theirs is in flight
        when the communicators are freed (a stray message could reach a later communicator that reuses
        this one's context); reading (and dropping) messages meanwhile keeps the others' sends flowing."""
        self._say_goodbye()
        deadline = time.monotonic() + _SHUTDOWN_GRACE_S
        farewells = self._channel.farewells
        while True:
            self._channel.receive_all()
            if len(farewells) >= self.size - 1:
                break
            if time.monotonic() > deadline:
                silent = [r for r in range(self.size) if r != self.rank and r not in farewells]
                log.warning("commlib shutdown: %s did not shut down within %g s; continuing",
                            self.describe_ranks(silent), _SHUTDOWN_GRACE_S)
                return
            time.sleep(0.001)
        self._channel.flush()



class StallShutdown(CommlibError):
    """A peer stopped answering for ``COMMLIB_STALL_SHUTDOWN_TIME``: this coordinator gave up on it."""
