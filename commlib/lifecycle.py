"""The one owner of commlib's per-process state: ``init``, ``shutdown``, the exit hook, the abort after a
lost peer, and a runtime rebuilt over the survivors of a loss (:mod:`commlib.elastic`).

Everything commlib keeps in a process is the :class:`Process` record below (as Horovod keeps its own in one
struct, ``horovod/common/global_state.h``): the current :class:`~commlib.runtime.Runtime`, which holds what
one ``init()`` built as typed fields, and the few things that outlive a runtime (init's settings, the loss
that forbids finalizing MPI, elastic recovery's record). Only this module
writes it; nothing is created at import, and ``init()`` after ``shutdown()`` starts afresh.

The internal interface (docs/architecture.md, "Internal interface"): plug-ins and services reach the
process state through :func:`current`, :func:`current_or_none`, :func:`config`, :func:`elastic_record`,
:func:`abandon` and :func:`rebuild`, and the Runtime's documented fields, never through another module's
underscore names.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, Sequence

from .errors import CommlibError, PeerLostError
from .process_sets import GlobalProcessSet, ProcessSet

if TYPE_CHECKING:  # runtime.py imports MPI: init() imports it, so that `import commlib` does not
    from .config import Config
    from .runtime import Runtime
    from .server.discovery import Job

log = logging.getLogger("commlib")


@dataclasses.dataclass
class ElasticRecord:
    """What in-process recovery (:mod:`commlib.elastic.recover`) keeps across the runtimes it rebuilds."""

    generation: int = 0            # recoveries so far in this launch: names the rendezvous files
    exit_hook: bool = False        # the exit hook that ends without MPI_Finalize is installed
    failed: bool = False           # an exception reached the top level (the exit status)
    directory: str | None = None   # where the exit status goes for the driver (``exit.<world rank>``)
    world_rank: int = -1


@dataclasses.dataclass
class Process:
    """commlib's state in this process; :data:`_process` is the one instance."""

    runtime: Runtime | None = None        # what init() built; None before init() and after shutdown()
    settings: dict = dataclasses.field(default_factory=dict)  # init()'s settings, for a rebuilt runtime
    config: Config | None = None          # the last runtime's settings (kept while recovery rebuilds)
    lost: PeerLostError | None = None     # a runtime met a lost peer: MPI must not be finalized
    elastic: ElasticRecord = dataclasses.field(default_factory=ElasticRecord)
    #: the job's layout (workers and summation servers) by the user communicator's handle: found by the
    #: first runtime on that communicator, reused by the next (a server takes part in finding it only once)
    layouts: dict[int, Job] = dataclasses.field(default_factory=dict)


_process = Process()


# ---- the internal interface ----------------------------------------------------------------------------

def current() -> "Runtime":
    """The runtime ``init()`` built; a CommlibError saying to call ``init()`` when there is none."""
    runtime = _process.runtime
    if runtime is None:
        raise CommlibError("commlib is not initialized; call commlib.init() first")
    return runtime


def current_or_none() -> "Runtime | None":
    """The runtime ``init()`` built, or None."""
    return _process.runtime


def job_layout(comm) -> "Job":
    """The job's layout over ``comm`` (its workers and summation servers), found once per process and kept
    for every runtime on ``comm``: collective over ``comm`` the first time (a server answers once)."""
    from .server import discovery

    return discovery.worker_job(comm, _process.layouts, config().start_timeout_s)


def is_initialized() -> bool:
    return _process.runtime is not None


def config() -> "Config":
    """The settings in force: the current runtime's (``init(**settings)`` over the environment); between a
    loss and the rebuild, or after ``shutdown()``, the last runtime's; before any ``init()``, the
    environment's."""
    if _process.runtime is not None:
        return _process.runtime.config
    if _process.config is not None:
        return _process.config
    from .config import Config

    return Config.load()


def elastic_record() -> ElasticRecord:
    """In-process recovery's record (:mod:`commlib.elastic.recover` reads and updates it)."""
    return _process.elastic


#: The world as a process set (id 0): always registered while commlib is initialized.
global_process_set = GlobalProcessSet(lambda: _process.runtime.sets if _process.runtime is not None else None)


# ---- init and shutdown ---------------------------------------------------------------------------------

def init(comm=None, process_sets: Sequence[ProcessSet] | None = None, **settings) -> None:
    """Start commlib on ``comm`` (default MPI.COMM_WORLD); this initializes MPI (mpi4py) if needed.
    ``process_sets``: sets to register at once (as ``add_process_set`` each, in order). ``settings``
    override ``COMMLIB_*`` variables (e.g. ``algorithm="ring"``, ``num_streams=2``; see
    docs/configuration.md). Calling it again while initialized does nothing; after ``shutdown()`` it
    starts afresh.

    ``timeout`` (seconds, or a ``datetime.timedelta`` as torch.distributed takes; ``COMMLIB_TIMEOUT``,
    default 10 minutes) bounds every wait for a peer: past it the call raises ``PeerLostError`` naming the
    peers (docs/failures.md).

    A script that set ``mpi4py.rc.initialize = False`` gets MPI initialized here (MPI_THREAD_MULTIPLE) and
    finalized at exit, after commlib's own exit work. A set that cannot be registered (the same ranks
    twice, or twice the same communicator) raises the ValueError on every rank and leaves commlib
    uninitialized, so that ``init()`` may be called again with a corrected list (as Horovod).

    Until ``shutdown()``, an exit hook runs the shutdown path if the process exits without it, so that the
    other ranks learn at once that this rank left (their pending and later operations fail, naming it)."""
    if _process.runtime is not None:
        return
    _start_mpi()
    from .runtime import Runtime

    if "timeout" in settings:
        timeout = settings.pop("timeout")
        settings["timeout_s"] = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    runtime = Runtime(comm, layouts=_process.layouts, **settings)
    _process.runtime, _process.settings, _process.config = runtime, dict(settings), runtime.config
    atexit.register(_leave)
    try:
        for process_set in process_sets or ():
            runtime.add_process_set(process_set)
    except Exception:  # every rank raises alike (the sets are agreed on): every rank shuts down
        shutdown()
        raise


def shutdown() -> None:
    """Stop commlib: pending operations fail with a clear error; ``init()`` may be called again."""
    runtime, _process.runtime = _process.runtime, None
    atexit.unregister(_leave)
    if runtime is not None:
        try:
            runtime.close()
        finally:
            _after_loss(runtime)


def _start_mpi() -> None:
    """Initialize MPI where the script told mpi4py not to (``mpi4py.rc.initialize = False``, as some
    applications and Horovod's tests do), with the thread level commlib needs (its background threads,
    process sets and servers call MPI: MPI_THREAD_MULTIPLE); finalize it at exit. The exit handler is
    registered before ``init()`` registers its own, so it runs after them (atexit runs the last registered
    first); mpi4py itself finalizes only what it initialized."""
    from mpi4py import MPI

    if MPI.Is_initialized():
        return
    if MPI.Is_finalized():
        raise CommlibError("commlib.init(): MPI was already finalized in this process; it cannot start again")
    MPI.Init_thread(MPI.THREAD_MULTIPLE)
    atexit.register(_finalize_mpi)


def _finalize_mpi() -> None:
    """At exit, after commlib's exit hook: finalize the MPI that :func:`_start_mpi` initialized (not after a
    lost peer: that path aborts instead)."""
    from mpi4py import MPI

    if _process.lost is None and MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()


# ---- leaving: the exit hook and the abort after a lost peer ---------------------------------------------

def _leave() -> None:
    """The exit hook: the process exits without ``shutdown()``. Tell the other ranks, without waiting for
    them (they may be waiting for this rank in their next collective)."""
    runtime, _process.runtime = _process.runtime, None
    if runtime is None:
        return
    try:
        runtime.close(leaving=True)
    except Exception as exc:  # exiting anyway: say why the others may not have been told
        log.warning("commlib: could not tell the other ranks that rank %d is exiting: %r", runtime.rank, exc)
    _after_loss(runtime)
    if _process.lost is not None:
        _exit_after_loss()


#: The exit status of a process that lost a peer (the launcher then ends the rest of the job).
LOST_PEER_EXIT_STATUS = 1


def _after_loss(runtime) -> None:
    """After a runtime that lost a peer: the process must not finalize MPI (MPI_Finalize, and freeing
    what the lost peers still hold, would wait for them), so it ends without it at exit."""
    lost = runtime.lost
    if lost is not None and _process.lost is None:
        _process.lost = lost
        atexit.register(_exit_after_loss)


#: How long the exit path waits before aborting the job, so that the other live ranks, which reach their
#: own verdict within moments (or at once through this rank's notice), can report it before the launcher
#: stops them.
ABORT_GRACE_S = 1.0


def _exit_after_loss() -> None:
    """At exit after a lost peer: end the job with ``MPI_Abort(MPI_COMM_WORLD, 1)`` instead of reaching
    mpi4py's MPI_Finalize (which would wait for the lost peers). The launcher ends every other rank it
    can reach and exits (measured with hydra: a plain exit(1) left mpiexec waiting for the proxy behind
    the cut link; MPI_Abort ended it at once). Other exit handlers registered before ``init()`` do not
    run."""
    log.error("commlib: ending the job (MPI_Abort, status %d) after a lost peer: %s",
              LOST_PEER_EXIT_STATUS, _process.lost)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream: nothing more to say
            pass
    time.sleep(ABORT_GRACE_S)
    try:
        from mpi4py import MPI

        from .transport.deadline import unlink_mapped_shared_memory

        if MPI.Is_initialized() and not MPI.Is_finalized():
            unlink_mapped_shared_memory()  # MPI_Abort leaves MPICH's node segments in /dev/shm
            MPI.COMM_WORLD.Abort(LOST_PEER_EXIT_STATUS)
    finally:
        os._exit(LOST_PEER_EXIT_STATUS)


# ---- elastic recovery: leave a runtime without its peers, rebuild over the survivors -------------------

#: How long :func:`abandon` lets the old runtime's threads take to stop before going on without them.
ABANDON_WAIT_S = 5.0


def abandon(lost_ranks: Sequence[int] | None = None) -> None:
    """Drop the current runtime without a collective and without waiting for any peer: its threads end
    (every wait fails at once after a loss), its communicators are left alone (a dead rank is in them).
    ``lost_ranks`` (ranks of its communicator): elastic recovery leaves it for one over the survivors
    (:func:`rebuild`), and later calls on it name the loss; None: the process is about to end. At most
    :data:`ABANDON_WAIT_S`."""
    runtime, _process.runtime = _process.runtime, None
    atexit.unregister(_leave)
    if runtime is None:
        return
    if lost_ranks is None:
        _quietly(lambda: runtime.close(leaving=True))
    else:
        lost = list(lost_ranks)
        _quietly(lambda: runtime.abandon(lost))


def _quietly(close: Callable[[], None]) -> None:
    def run():
        try:
            close()
        except Exception as exc:  # noqa: BLE001 - the runtime is being thrown away
            log.debug("commlib: closing an abandoned runtime: %r", exc)

    closer = threading.Thread(target=run, daemon=True, name="commlib-abandon")
    closer.start()
    closer.join(timeout=ABANDON_WAIT_S)


def rebuild(comm) -> None:
    """Start a runtime on ``comm`` (the survivors of a loss) with the first ``init()``'s settings."""
    init(comm=comm, **_process.settings)
