"""Failure and shutdown of a coordinator: what every rank does when it, or a peer, stops.

- Failure: an exception in the cycle (or a stall verdict, :class:`StallShutdown`) fails every pending
  handle with it, makes every later call raise, and says ``gone`` to the others in this rank's last round
  message, so that they fail what needs this rank.
- A lost peer (:class:`~commlib.errors.PeerLostError`: a wait timed out, a silent peer in the rounds, or
  a peer's notice that it lost one): a failure as above, and before it a notice to every peer outside the
  rounds naming the lost ranks, so that a peer waiting for this rank fails at once naming them. Shutdown
  and the exit hook then neither wait for goodbyes nor free communicators (nothing collective after a
  loss). Under in-process recovery (``config.recovers_in_process``) a rank sends no notice, and after the
  loss nothing at all (no ``gone``, no goodbye): a send to a dead rank can crash the sender there.
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

from ..errors import CollectiveError, PeerLostError

log = logging.getLogger("commlib")

_SHUTDOWN_GRACE_S = 10.0   # how long shutdown waits for the other ranks to shut down too
_LEAVE_FLUSH_S = 2.0       # how long a leaving process waits for its last message to be delivered
_LOST_FLUSH_S = 0.5        # the same after a lost peer: messages to the lost peers never will be

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

    @property
    def lost(self) -> PeerLostError | None:
        """The peer loss that ended this coordinator (or its transports), else None."""
        if isinstance(self._failure, PeerLostError):
            return self._failure
        return self._channel.deadline.lost

    def _failure_error(self) -> CollectiveError:
        where = self._who(self.rank)
        if isinstance(self._failure, PeerLostError):
            error = PeerLostError(f"commlib stopped on {where}: {self._failure}", self._failure.ranks,
                                  self._failure.what)
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
        peer_lost = isinstance(exc, PeerLostError)
        lost = exc.ranks if peer_lost else ()
        if peer_lost:
            # Under in-process recovery the channel sends nothing from here on (ControlChannel.post);
            # otherwise the lost ranks are told as the others are: a held or frozen rank that wakes then
            # fails at once, naming who gave up on it.
            self._channel.deadline.lose(exc)  # every transport of the runtime: later waits raise it at once
            if not isinstance(exc, StallShutdown):  # (a stall verdict was logged and told already)
                log.error("commlib on rank %d: %s", self._world_ranks[self.rank], exc)
                self._tell_peers(str(exc), exc.ranks)
        else:
            log.error("commlib coordinator failed on rank %d: %r", self._world_ranks[self.rank], exc)
        self._fail_all(str(self._failure_error()))
        try:
            self._announce_gone(f"failed ({type(exc).__name__}: {exc})", lost)
        except BaseException:  # the channel itself may be what failed
            pass

    def _tell_peers(self, text: str, lost) -> None:
        """A notice to every peer outside the rounds, naming the world ranks this rank gave up on: a peer
        waiting for this rank (in a round, or in a transfer: :meth:`watch`) fails at once, naming them.

        Under in-process recovery, none: a rank that runs out of time does not know which of its peers are
        alive (in a chain, rank 0 waits for rank 1, which waits for the dead rank 2, which nobody has
        blamed yet), and a send to a dead rank can crash the sender there. Each survivor then reaches its
        own verdict within the timeout, and the elastic driver decides from the reports
        (commlib/run/survivors.py)."""
        if self._config.recovers_in_process:
            return
        for peer in range(self.size):
            if peer != self.rank and self._world_ranks[peer] not in lost:
                try:
                    self._channel.post_notice(peer, text, tuple(lost))
                except Exception:  # best effort: each waiting peer reaches a verdict on its own clock
                    pass

    def _fail_all(self, reason: str) -> None:
        with self._names:
            entries = list(self._in_flight.values())
            self._in_flight.clear()
        self._incoming.clear()
        self._undecided.clear()
        self._eager.clear()
        self._queue.drop()
        for entry in entries:
            entry.handle.set_error(CollectiveError(f"tensor {entry.meta.name!r}: {reason}"))

    def _announce_gone(self, reason: str, lost=()) -> None:
        """This rank's last message: later rounds complete without it. ``lost``: the world ranks it gave up
        on, so that a peer that reads this message before the notice (another tag: either may come first)
        fails as on the notice, naming them."""
        if self._rounds.left:
            return
        self._incoming.clear()
        self._extra["gone"] = reason
        if lost:
            self._extra["lost"] = tuple(lost)
        self._contribute(last=True)

    def forget(self, world_ranks) -> None:
        """Send nothing more to ``world_ranks`` (ranks of the runtime's communicator): they are gone for
        good (elastic recovery abandons this coordinator without them)."""
        gone = set(world_ranks)
        self._channel.unreachable.update(r for r in range(self.size) if self._world_ranks[r] in gone)

    def close(self, leaving: bool = False) -> None:
        """Stop the coordinator: pending operations fail, and the other ranks are told. ``leaving``: the
        process is exiting without ``shutdown()`` (the exit hook); do not wait for the others."""
        if self._closed:
            return
        self._closed = True
        self._progress.stop()
        lost = self.lost is not None
        with self._progress.lock:
            self._fail_all("commlib was shut down before it completed" if not leaving else
                           "this process is exiting without commlib.shutdown()")
            try:
                self._announce_gone(LEFT if leaving else "shut down")
                if lost:  # the lost peers will never say goodbye: tell the others, and do not wait
                    self._say_goodbye()
                    self._channel.flush_for(_LOST_FLUSH_S)
                elif leaving:
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
        grace = min(_SHUTDOWN_GRACE_S, self._config.timeout_s)
        deadline = time.monotonic() + grace
        farewells = self._channel.farewells
        while True:
            self._channel.receive_all()
            if len(farewells) >= self.size - 1:
                break
            if time.monotonic() > deadline:
                silent = [r for r in range(self.size) if r != self.rank and r not in farewells]
                log.warning("commlib shutdown: %s did not shut down within %g s; continuing",
                            self.describe_ranks(silent), grace)
                return
            time.sleep(0.001)
        self._channel.flush()



class StallShutdown(PeerLostError):
    """Peers stopped answering negotiation rounds for ``COMMLIB_STALL_SHUTDOWN_TIME`` (or
    ``COMMLIB_TIMEOUT``): this coordinator gave up on them (``ranks``)."""
