"""c10d's Work over commlib's handles: ``wait``, ``is_completed``, ``get_future``, errors on the Work.

A :class:`Work` holds the commlib handles of one c10d call and a *finish* step (copying results into the
caller's output tensors, if the call needs it) that runs once, after the handles are done, in whichever
thread gets there first:

- ``wait()`` drives commlib in the calling thread (no hand-off to another thread: the fast path of a
  synchronous ``dist.all_reduce``), finishes, and raises the collective's error if it failed;
- ``get_future()`` returns a torch Future that completes on its own, as DDP needs: the Work is queued for
  the *completer*, one thread of the backend that waits for queued Works in turn (driving commlib as any
  waiting thread does, without the background thread's gathering cycle), finishes them and sets their
  futures' results (or exceptions). Everything queued was submitted already, on every rank, so waiting in
  turn never waits for something not yet started. Completing a future runs its ``then`` callbacks in that
  thread, so they may start more collectives and even wait for them (PyTorch's PowerSGD hook does): a
  future asked for from the completer thread itself is completed there at once, by driving its collective
  in place, since nothing else would complete it while the completer waits.

A peer lost within the process group's timeout (commlib's :class:`~commlib.errors.PeerLostError`) surfaces
as :class:`CollectiveTimeoutError`, a ``torch.distributed.DistBackendError`` (torch's type for a failed
collective) that keeps the lost ``ranks``; commlib's other errors (mismatched requests, bad input) stay
what they are (``RuntimeError``/``ValueError``/``TypeError``).
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from ...errors import PeerLostError


class CollectiveTimeoutError(dist.DistBackendError):
    """A collective (or send/recv) of the ``commlib`` backend waited longer than the process group's
    timeout for a peer: a cut link, a frozen or dead host. ``ranks``: the peers it waited for."""

    def __init__(self, message: str, ranks: Sequence[int] = ()):
        super().__init__(message)
        self.ranks = tuple(ranks)


def raising_torch_errors(method):
    """``method`` (a c10d call) raising :func:`torch_error`'s error where commlib refuses to start it (commlib
    already lost a peer)."""
    import functools

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except PeerLostError as exc:
            raise torch_error(exc, method.__name__) from None

    return call


def torch_error(exc: BaseException, what: str) -> BaseException:
    """The error a Work raises for commlib's ``exc``."""
    if isinstance(exc, PeerLostError):
        error = CollectiveTimeoutError(f"{what} timed out: {exc}", exc.ranks)
        error.__cause__ = exc
        return error
    return exc


_PENDING, _OK, _FAILED = 0, 1, 2


class Work(dist.Work):
    """One c10d call of the ``commlib`` backend in flight. ``handles``: commlib handles (or anything with
    ``done``, ``wait`` and ``result``); ``finish(results)`` turns their results into
    the call's result, a list of tensors (it may copy into the caller's tensors); ``what`` names the call
    in errors; ``timeout`` (seconds, or None) bounds ``wait()`` as the process group's timeout."""

    def __init__(self, handles: Sequence, finish: Callable[[list], list], what: str,
                 timeout: float | None = None):
        super().__init__()
        self._handles = list(handles)
        self._finish = finish
        self._what = what
        self._timeout = timeout
        self._lock = threading.Lock()
        self._state = _PENDING
        self._value: list = []
        self._error: BaseException | None = None
        self._future: torch.futures.Future | None = None
        self._future_set = False
        self.source = -1  # recv from any source: the sender's rank in the group

    @classmethod
    def completed(cls, value: list, what: str) -> "Work":
        """The Work of a call that has run already (a synchronous one): its result is ``value``."""
        work = cls((), None, what)
        work._state, work._value = _OK, value
        return work

    # ---- c10d's Work interface -------------------------------------------------------------------------

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Wait for the call (driving commlib in this thread), then raise its error if it failed.
        ``timeout``: at most this long (a ``timedelta``; zero or none: the process group's timeout)."""
        if self._state == _OK and self._future is None:  # done, nothing to tell (a synchronous call's Work)
            return True
        limit = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        if not limit or limit <= 0:
            limit = self._timeout
        if self._state == _PENDING:
            try:
                if limit:
                    self._wait_until(time.monotonic() + limit)
                else:
                    for handle in self._handles:
                        handle.wait()
            except Exception as exc:  # noqa: BLE001 - the coordinator failed while this thread drove it
                self._fail(torch_error(exc, self._what))
            self._settle()
        self._complete_future()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        if self._state == _PENDING and all(h.done() for h in self._handles):
            self._settle()
        return self._state != _PENDING

    def is_success(self) -> bool:
        return self.is_completed() and self._state == _OK

    def exception(self):
        return self._error if self.is_completed() else None

    def result(self) -> list:
        self.wait()
        return self._value

    def source_rank(self) -> int:
        return self.source

    _source_rank = source_rank  # (what dist.recv asks)

    def synchronize(self) -> None:
        """CPU tensors: nothing to order on a stream."""

    def get_future(self) -> torch.futures.Future:
        """A future of the call's result (a list of tensors) that completes by itself."""
        with self._lock:
            new = self._future is None
            if new:
                self._future = torch.futures.Future()
        if new:
            if self._state != _PENDING or _in_completer():
                self._complete()
            else:
                completer().put(self)
        return self._future

    # ---- internals ------------------------------------------------------------------------------------

    def _wait_until(self, deadline: float) -> None:
        for handle in self._handles:
            while not handle.done():
                left = deadline - time.monotonic()
                if left <= 0:
                    self._fail(CollectiveTimeoutError(
                        f"{self._what} timed out: not complete after the process group's timeout of "
                        f"{self._timeout if self._timeout else 0:.3g} s"))
                    return
                if hasattr(handle, "wait_briefly"):  # commlib's background thread drives meanwhile
                    handle.wait_briefly(min(left, 0.05))
                else:
                    time.sleep(min(left, 1e-3))

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            if self._state == _PENDING:
                self._error, self._state = error, _FAILED

    def _settle(self) -> None:
        """Once the handles are done: their results (or error), then the finish step; exactly once."""
        with self._lock:
            if self._state != _PENDING:
                return
            try:
                self._value = self._finish([h.result() for h in self._handles])
                self._state = _OK
            except Exception as exc:  # noqa: BLE001 - the call's error, raised by wait() and the future
                self._error, self._state = torch_error(exc, self._what), _FAILED
            self._handles = [_Done()] * len(self._handles)  # the tensors they hold are released
            self._finish = None

    def _complete_future(self) -> None:
        with self._lock:
            if self._future is None or self._future_set or self._state == _PENDING:
                return
            self._future_set = True
        if self._error is not None:
            self._future.set_exception(self._error)
        else:
            self._future.set_result(self._value)

    def _complete(self) -> None:
        """Wait (driving commlib in this thread), finish, and complete the future."""
        try:
            self.wait()
        except Exception:  # noqa: BLE001 - the future holds it now
            pass


class _Done:
    """A handle already settled."""

    @staticmethod
    def done() -> bool:
        return True

    def wait(self) -> None:
        pass

    @staticmethod
    def result() -> Any:
        return None


def completed(value: list, what: str) -> Work:
    """A Work that is done already (a call with nothing to communicate)."""
    return Work([], lambda _results: value, what)


# ---- the completer thread --------------------------------------------------------------------------------

class _Completer(threading.Thread):
    """Completes the futures of Works, one Work after the other, in the order their futures were asked for."""

    def __init__(self):
        super().__init__(name="commlib-torch-completer", daemon=True)
        self.queue: queue.SimpleQueue = queue.SimpleQueue()

    def put(self, work: Work) -> None:
        self.queue.put(work)

    def run(self) -> None:
        _local.completer = True
        while True:
            work = self.queue.get()
            try:
                work._complete()
            except Exception as exc:  # noqa: BLE001 - a future's callback raised: torch reports it there
                _report(exc)


_local = threading.local()
_started: _Completer | None = None
_start_lock = threading.Lock()


def completer() -> _Completer:
    """The completer thread, started on first use (never at import)."""
    global _started
    if _started is None:
        with _start_lock:
            if _started is None:
                thread = _Completer()
                thread.start()
                _started = thread
    return _started


def _in_completer() -> bool:
    return getattr(_local, "completer", False)


def _report(exc: BaseException) -> None:
    import logging

    logging.getLogger("commlib").error("commlib torch backend: completing a future raised %r", exc)
