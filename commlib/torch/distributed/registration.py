"""Registering ``"commlib"`` with torch.distributed, and creating its process groups.

:func:`register` runs when ``commlib.torch`` is imported, and when torch itself is imported if commlib is
installed: torch calls the ``torch.backends`` entry points at the end of ``import torch`` (setup.py names
``commlib_torch_backend.autoload``, which calls :func:`register`; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns
that off), so ``init_process_group("commlib")`` knows the name without importing commlib. Registering starts
nothing: it adds the name to torch's table of backends (``Backend.register_backend``, with the extended API
that hands the creator the group's global ranks and options) and the MPI fallback to torch's ``env://``
rendezvous (:mod:`.rendezvous`).

The default group's creator starts commlib on MPI's world (unless the program started it already) and
checks that MPI's rank and size are torch's. Where no MPI launcher started the process (torchrun,
``multiprocessing``), MPI's world is built from torch's store first (:mod:`.pmi`).
"""

from __future__ import annotations

import sys

import torch.distributed as dist

import commlib as cl

from ...config import mpi_launched
from ...errors import ConfigError
from .options import Options
from .process_group import BACKEND_NAME, ProcessGroupCommlib, options_of, seconds, shorter_than_commlib

_registered = False


def register() -> None:
    """Make ``"commlib"`` a torch.distributed backend (again: nothing)."""
    global _registered
    if _registered:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])
    import importlib

    from .rendezvous import wrap

    torch_rendezvous = importlib.import_module("torch.distributed.rendezvous")  # (the name is also a function)
    handlers = torch_rendezvous._rendezvous_handlers  # torch has no API to extend a registered scheme
    if not hasattr(handlers["env"], "commlib_wrapped"):
        handlers["env"] = wrap(handlers["env"])
    _registered = True


def _create(backend_options, pg_options) -> ProcessGroupCommlib:
    """c10d's creator (extended API): the default group, or a group created without the default group's
    help (only when the default group is not commlib's: refused, with what to do)."""
    if list(backend_options.global_ranks_in_group):
        raise NotImplementedError(
            "a commlib process group inside a job whose default group uses another backend is not supported: "
            "initialize the default group with init_process_group('commlib'); its new_group() calls are commlib "
            "groups")
    options = options_of(pg_options)
    rank, size = backend_options.group_rank, backend_options.group_size
    timeout = seconds(backend_options.timeout)
    owns = _start_commlib(backend_options.store, rank, size, timeout, options)
    limit = None if owns else shorter_than_commlib(timeout)
    return ProcessGroupCommlib(rank, size, range(size), None, f"pg{backend_options.group_id}.", options, limit,
                               owns_commlib=owns)


def _start_commlib(store, rank: int, size: int, timeout: float | None, options: Options) -> bool:
    """Start commlib on MPI's world for a torch world of ``size`` in which this process is ``rank``; False
    if the program had started it already (then it keeps it running)."""
    if cl.is_initialized():
        if options.settings:
            raise ConfigError(f"commlib backend Options: settings {sorted(options.settings)} cannot apply: commlib "
                              "was initialized before init_process_group; give them to commlib.init() instead")
        _check_world(rank, size, "commlib was initialized before init_process_group on")
        return False
    mpi = sys.modules.get("mpi4py.MPI")
    initialized = mpi is not None and mpi.Is_initialized()
    if size > 1 and not mpi_launched():
        if initialized:
            raise RuntimeError(
                "init_process_group('commlib'): MPI was initialized before it in a process no MPI launcher "
                f"started, so MPI's world is this process alone, not torch's {size} ranks; initialize the process "
                "group before anything imports mpi4py.MPI, or start the job with mpiexec, commlib-run or srun")
        from . import pmi

        pmi.start(store, rank, size)
    settings = dict(options.settings)
    if timeout:
        settings.setdefault("timeout", timeout)
    cl.init(**settings)
    try:
        _check_world(rank, size, "MPI started this process as")
    except Exception:
        cl.shutdown()
        raise
    return True


def _check_world(rank: int, size: int, how: str) -> None:
    if (cl.rank(), cl.size()) != (rank, size):
        raise ValueError(
            f"init_process_group('commlib') was asked for rank {rank} of {size}, but {how} rank {cl.rank()} of "
            f"{cl.size()}: the launcher's ranks are commlib's. Leave rank and world_size out under mpiexec, "
            "commlib-run or srun, or launch as many processes as world_size")
