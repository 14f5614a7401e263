"""In-process recovery: after a lost peer, the surviving ranks rebuild commlib over themselves and go on,
without a restart (no new processes, no second import of the framework).

What MPICH (hydra, the ``mpich`` wheel) allows, and this relies on (docs/elastic.md): with mpiexec's
``-disable-auto-cleanup`` the other ranks keep running when one dies; point-to-point between the
survivors still works; ``MPI_Comm_create_group`` over the survivors (collective over those ranks only)
builds a working communicator. ULFM's revoke/shrink/agree are not available (``Comm.Revoke`` raises
NotImplementedError), so the old communicators are abandoned, never repaired, and MPI is never finalized
(``MPI_Finalize`` waits for the dead rank): a process that recovered ends with ``os._exit``.

Who survived is decided by commlib-run's elastic driver, the one process that sees every report (the
rendezvous is its directory, ``COMMLIB_ELASTIC_DIR``, files written whole and renamed):

1. every rank whose collective failed writes ``report.<generation>.<world rank>`` with the ranks it
   suspects, and abandons its runtime (no MPI call on the old communicators);
2. the driver waits until every member either reported or is suspected (commlib/run/survivors.py), then
   writes ``members.<generation>``: the reporters no other reporter suspects, or ``restart`` (fewer than
   ``--min-np``);
3. the members build a communicator over themselves with ``MPI_Comm_create_group`` on MPI_COMM_WORLD,
   ``commlib.init`` on it (a new runtime: coordinator, process sets, caches, learned choices), and the
   elastic loop restores and syncs the state from the new rank 0.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import time

from .. import lifecycle
from . import control

log = logging.getLogger("commlib.elastic")

#: How long a rank waits for the driver's decision before giving up on in-process recovery.
DECISION_WAIT_S = 120.0


def enabled() -> bool:
    """In-process recovery applies: under the elastic driver, which asked for it (hydra started with
    ``-disable-auto-cleanup``; read from the runtime's settings)."""
    return lifecycle.config().recovers_in_process


def rebuild(error: BaseException) -> bool:
    """Report the failure, wait for the driver's verdict, and start commlib again over the survivors.
    Returns False when the driver asked for a restart instead (the caller exits for it); a rank the
    survivors left out ends here."""
    from mpi4py import MPI

    directory = control.directory()
    world = MPI.COMM_WORLD
    me = world.Get_rank()
    runtime = lifecycle.current_or_none()
    members = _members(runtime, world)
    suspects = _suspects(error, runtime, world)
    lifecycle.abandon(_local(runtime, world, suspects))
    _install_exit_hook(directory, me)
    record = lifecycle.elastic_record()
    generation = record.generation
    record.generation += 1
    _write(directory, f"report.{generation}.{me}",
           {"rank": me, "members": members, "suspects": suspects, "time": time.time(), "error": str(error)[:500]})
    log.warning("commlib elastic: rank %d reports a failed collective (%s); waiting for the survivors", me, error)
    decision = _wait_for(directory, f"members.{generation}")
    if decision is None or "restart" in decision:
        reason = decision["restart"] if decision else f"no decision from the driver within {DECISION_WAIT_S:g} s"
        print(f"commlib elastic: in-process recovery not possible ({reason})", file=sys.stderr, flush=True)
        return False
    survivors = decision["members"]
    if me not in survivors:  # the others went on without this rank (it reported too late)
        print(f"commlib elastic: rank {me} was left out of the survivors {survivors}; exiting",
              file=sys.stderr, flush=True)
        _exit(control.RESTART_EXIT_CODE)
    comm = world.Create_group(world.Get_group().Incl(survivors), tag=generation + 1)
    lifecycle.rebuild(comm)  # init()'s settings, over the survivors
    print(f"commlib elastic: rank {me} goes on as rank {comm.Get_rank()} of {comm.Get_size()} (lost world "
          f"ranks {sorted(set(members) - set(survivors))})", file=sys.stderr, flush=True)
    return True


def _members(runtime, world) -> list[int]:
    """The world ranks of the runtime's communicator."""
    from mpi4py import MPI

    if runtime is None:
        return list(range(world.Get_size()))
    group = runtime.comm.Get_group()
    return list(MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world.Get_group()))


def _suspects(error, runtime, world) -> list[int]:
    """The ranks ``error`` names, as world ranks (errors name ranks of the runtime's communicator)."""
    ranks = [r for r in (getattr(error, "ranks", None) or []) if r is not None and r >= 0]
    if runtime is None or not ranks:
        return []
    members = _members(runtime, world)
    return sorted({members[r] for r in ranks if r < len(members)})


def _local(runtime, world, world_ranks) -> list[int]:
    """``world_ranks`` as ranks of the runtime's communicator."""
    if runtime is None:
        return []
    members = _members(runtime, world)
    return [members.index(r) for r in world_ranks if r in members]


def _install_exit_hook(directory: str, me: int) -> None:
    """After a recovery the process must end without MPI_Finalize; the driver reads the exit status
    from ``exit.<world rank>`` (mpiexec's own is the dead rank's)."""
    record = lifecycle.elastic_record()
    if record.exit_hook:
        return
    record.exit_hook = True
    previous = sys.excepthook

    def excepthook(kind, value, traceback):
        record.failed = True
        previous(kind, value, traceback)

    sys.excepthook = excepthook

    def at_exit():
        _exit(1 if record.failed else 0)

    atexit.register(at_exit)  # runs before any MPI_Finalize (mpi4py's, or commlib's: registered earlier)
    record.directory, record.world_rank = directory, me


def exit_now(code: int) -> None:
    """End the process at once with ``code``, without MPI_Finalize (a peer may be gone); after a recovery
    the driver learns the status from the exit file."""
    if lifecycle.elastic_record().exit_hook:
        _exit(code)
    os._exit(code)


def _exit(code: int) -> None:
    lifecycle.abandon()  # the process ends: tell the others, wait for no one
    record = lifecycle.elastic_record()
    if record.directory:
        try:
            _write(record.directory, f"exit.{record.world_rank}", {"code": code})
        except OSError:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)


def _write(directory: str, name: str, value) -> None:
    target = os.path.join(directory, name)
    temporary = f"{target}.{os.getpid()}.tmp"
    with open(temporary, "w") as f:
        json.dump(value, f)
    os.replace(temporary, target)


def _wait_for(directory: str, name: str):
    path = os.path.join(directory, name)
    end = time.monotonic() + DECISION_WAIT_S
    while time.monotonic() < end:
        try:
            with open(path) as f:
                return json.load(f)
        except FileNotFoundError:
            time.sleep(0.02)
    return None
