"""The elastic run loop: ``run(func)(state, ...)`` as Horovod Elastic's ``hvd.elastic.run``.

Under commlib-run's elastic driver (docs/elastic.md), a worker whose collective failed
(``HorovodInternalError``; a lost peer is :class:`~commlib.errors.PeerLostError`) recovers in process
when the driver's MPI allows it (:mod:`.recover`: the survivors rebuild commlib over themselves, restore
the last commit, take it from the new rank 0 with ``sync()``, run the reset callbacks and call ``func``
again). Otherwise, and when the hosts change (the world cannot grow in process), recovery is by restart:
a worker whose collective failed (``HorovodInternalError``, commlib's
:class:`~commlib.errors.CollectiveError`) or whose ``commit()`` raised :class:`HostsUpdatedInterrupt`
exits with :data:`~.control.RESTART_EXIT_CODE`; the driver starts the job again on the hosts it has, and
there ``run`` resumes from the last committed state: rank 0 loads it, ``sync()`` gives it to every rank,
the reset callbacks run, and ``func`` is called again. Outside the driver the errors propagate as they are.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Callable

from ..errors import CollectiveError
from . import control, recover
from .state import HostsUpdatedInterrupt, State

log = logging.getLogger("commlib.elastic")


def run_fn(func: Callable, reset: Callable[[], None] | None = None) -> Callable:
    """Wrap ``func(state, *args, **kwargs)`` for elastic training (see the module's docstring).
    ``reset`` is accepted for Horovod's signature; the reset is commlib's own (a runtime rebuilt over the
    survivors, :mod:`.recover`)."""

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs):
        resumed = state.resume()
        state.sync()
        if _bcast(state, resumed):  # every rank, also those that did not read the snapshot
            state.on_reset()
        while True:
            try:
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt:
                if control.directory() is None:
                    raise
                _exit_for_restart("the hosts changed; restarting from the commit that noticed it")
            except CollectiveError as exc:
                if control.directory() is None:
                    raise
                if not recover.enabled():
                    _exit_for_restart(f"a collective failed ({exc}); restarting from the last commit")
                if not recover.rebuild(exc):
                    _exit_for_restart(f"a collective failed ({exc}); restarting from the last commit")
            # the survivors go on: the last commit, made alike on every rank by the new rank 0's
            state.restore()
            state.sync()
            state.on_reset()
            if reset is not None:
                reset()

    return wrapper


def run(func: Callable) -> Callable:
    """Decorator: ``@commlib.elastic.run`` over ``def train(state): ...``."""
    return run_fn(func)


def _bcast(state: State, value: bool) -> bool:
    if control.directory() is None:
        return value
    return bool(state.broadcast_object(value, root_rank=0))


def _exit_for_restart(reason: str) -> None:
    """Leave at once with the restart code: a peer may be gone, so no MPI call (finalize included) may
    be made any more."""
    log.warning("commlib elastic: %s", reason)
    print(f"commlib elastic: {reason}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    recover.exit_now(control.RESTART_EXIT_CODE)
