"""Elastic state: what training keeps across a failure, as Horovod Elastic's ``State`` defines it.

- ``commit()``: save the current values in memory as the point to come back to (and, under commlib-run's
  elastic driver, write them to its directory from rank 0, so a restarted job resumes there), then check
  whether the driver changed the hosts (:meth:`State.check_host_updates`).
- ``restore()``: put the last saved values back (after a failed step).
- ``sync()``: make every rank hold rank 0's saved values (at start, and after a restart), then save.

A subclass says how to save, restore and synchronise its values (:class:`ObjectState` for plain Python
attributes; ``commlib.torch.elastic.TorchState`` for a model, an optimizer and samplers) and how to turn
the saved values into one picklable snapshot and back (:meth:`State.snapshot`, :meth:`State.load`).
"""

from __future__ import annotations

import copy
import os
import pickle
from typing import Any, Callable

from . import control


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by ``commit()``/``check_host_updates()`` on every rank at the same step when the driver added
    or removed hosts: training stops at this committed point and goes on with the new hosts."""

    def __init__(self, skip_sync: bool = False):
        super().__init__("the elastic driver changed the hosts; training continues from this commit with the "
                         "new hosts")
        self.skip_sync = skip_sync


def _default_bcast_object(obj, root_rank: int = 0):
    import commlib

    return commlib.broadcast_object(obj, root_rank=root_rank)


def _default_rank() -> int:
    import commlib

    return commlib.rank()


class State:
    """The base of every elastic state: reset callbacks, commit and host checks; subclasses implement
    :meth:`save`, :meth:`restore`, :meth:`sync`, :meth:`snapshot` and :meth:`load`.

    ``bcast_object(obj, root_rank=0)`` and ``get_rank()`` default to commlib's.
    """

    def __init__(self, bcast_object: Callable | None = None, get_rank: Callable[[], int] | None = None):
        self._bcast_object = bcast_object or _default_bcast_object
        self._rank = get_rank or _default_rank
        self._reset_callbacks: list[Callable[[], None]] = []

    def broadcast_object(self, obj, root_rank: int = 0):
        """``obj`` from ``root_rank`` on every rank, through the plug-in's broadcast this state was given
        (what the elastic loop agrees with)."""
        return self._bcast_object(obj, root_rank=root_rank)

    def register_reset_callbacks(self, callbacks) -> None:
        """Functions to call after a reset (the job restarted with other hosts), e.g. to rescale the
        learning rate to the new number of ranks."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the current values as the point to return to; under the elastic driver rank 0 also writes
        them to the driver's directory. Then raise :class:`HostsUpdatedInterrupt` if the hosts changed."""
        self.save()
        directory = control.directory()
        if directory and self._rank() == 0:
            control.write_snapshot(directory, pickle.dumps(self.snapshot(), protocol=pickle.HIGHEST_PROTOCOL))
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise :class:`HostsUpdatedInterrupt` on every rank if the driver flagged changed hosts (rank 0
        reads the flag and broadcasts it, so every rank raises at the same step). Without the driver this
        does nothing and calls no collective."""
        directory = control.directory()
        if not directory:
            return
        updated = control.hosts_updated(directory) if self._rank() == 0 else None
        if self._bcast_object(updated, root_rank=0):
            raise HostsUpdatedInterrupt()

    def resume(self) -> bool:
        """On rank 0 of a job the elastic driver restarted: load the last committed snapshot (the
        following :meth:`sync` hands it to every rank). True if one was loaded."""
        directory = control.directory()
        if not directory or self._rank() != 0:
            return False
        data = control.read_snapshot(directory)
        if data is None:
            return False
        self.load(pickle.loads(data))
        return True

    # -- what a subclass provides -------------------------------------------------------------------------
    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def snapshot(self) -> Any:
        """The saved values as one picklable object."""
        raise NotImplementedError

    def load(self, snapshot: Any) -> None:
        """Make ``snapshot`` (from :meth:`snapshot`) the saved values and restore them."""
        raise NotImplementedError


class ObjectState(State):
    """Plain Python attributes as elastic state: ``ObjectState(epoch=0, batch=0)``; ``state.epoch`` reads
    and writes the attribute; ``commit()`` saves a deep copy, ``sync()`` takes rank 0's saved values."""

    def __init__(self, bcast_object: Callable | None = None, get_rank: Callable[[], int] | None = None,
                 **kwargs):
        self._saved_state = copy.deepcopy(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {name: copy.deepcopy(getattr(self, name)) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, root_rank=0)
            self._set_attrs()

    def snapshot(self) -> Any:
        return self._saved_state

    def load(self, snapshot: Any) -> None:
        self._saved_state = dict(snapshot)
        self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))
