"""Geo-SGD (Paddle's asynchronous training through summation servers), for numpy parameters.

Each worker trains on its own; every ``k`` local steps it pushes its parameters' change since the last
exchange (the *delta*) to the summation servers, which add it to their copy of the parameters at once,
and it continues with the merged parameters they send back. No worker waits for another: a slow worker
or a slow link delays only itself, up to the staleness bound. See docs/servers.md.

    import commlib as cl
    from commlib.geo import GeoSGD

    cl.init()                                         # mpiexec -n 4 python train.py : -n 2 python -m commlib.server
    geo = GeoSGD({"w": w, "b": b}, k=4)               # w, b: numpy arrays, updated in place
    for x, y in batches:
        w -= lr * grad_w(w, b, x, y); b -= lr * grad_b(w, b, x, y)
        geo.step()                                    # every 4th call: exchange with the servers
    geo.close()

(``examples/geo_sgd.py`` is this, runnable.)

:class:`GeoSGD` is framework-neutral: it reads and writes the parameters through numpy arrays that share
their memory (``commlib.torch.GeoSGD`` hands it torch's CPU parameters).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from . import api, lifecycle
from .algorithms.ps import no_servers
from .errors import CommlibError

#: ``staleness`` not given: ``COMMLIB_GEO_STALENESS`` decides (``None`` is a value: unbounded).
FROM_CONFIG = object()


class GeoSGD:
    """Geo-SGD over ``params``: a mapping of names to numpy arrays, or a sequence of arrays or of ``(name,
    array)`` pairs; every array writable, C-contiguous, float32 or float64 (all alike). Collective: every
    worker creates its GeoSGD over the same parameters (shapes, order), in the same order as its other
    GeoSGDs. At creation worker 0's values are broadcast to the other workers and become the servers'
    starting point.

    - ``k``: local steps between two exchanges (default ``COMMLIB_GEO_STEPS``, 4);
    - ``staleness``: bound in rounds: the servers answer a worker's round ``r`` once every worker still in
      has pushed round ``r - staleness``; the worker waits for that answer before pushing its next round.
      ``None``: unbounded (nobody ever waits); 0: every round waits for everyone's. Default
      ``COMMLIB_GEO_STALENESS`` (unbounded);
    - ``average``: the servers add ``delta / workers`` (True, Paddle's rule: model averaging when the
      workers are in step) or the whole ``delta`` (False: the merged parameters are the sum of every
      worker's changes);
    - ``overlap``: keep training while a round's answer travels, applying it at the next ``step()`` that
      finds it in (the worker's steps meanwhile are kept, added on top of the merged values); False: wait
      for the answer at once;
    - ``name``: names the table on the servers (with a per-process counter).

    ``step()`` after each local optimizer step; ``close()`` at the end (pushes what is left, then the
    servers stop waiting for this worker). Raises ``CommlibError`` in a job without servers.
    """

    def __init__(self, params, k: int | None = None, staleness=FROM_CONFIG, average: bool = True,
                 overlap: bool = True, name: str = "geo"):
        runtime = lifecycle.current()
        client = runtime.geo  # the runtime's Geo-SGD client (commlib.server.geo_client), None without servers
        if client is None:
            raise CommlibError(no_servers("GeoSGD"))
        config = runtime.config
        self.k = config.geo_steps if k is None else int(k)
        if self.k < 1:
            raise CommlibError(f"GeoSGD: k={k} must be at least 1 (local steps between exchanges)")
        self.staleness = config.geo_staleness if staleness is FROM_CONFIG else staleness
        if self.staleness is not None and int(self.staleness) < 0:
            raise CommlibError(f"GeoSGD: staleness={staleness} must be None (unbounded) or at least 0")
        self.average = bool(average)
        self.overlap = bool(overlap)
        self.workers = runtime.size
        self.names, self.arrays = _named_arrays(params)
        dtype = self.arrays[0].dtype if self.arrays else np.dtype(np.float32)
        for n, a in zip(self.names, self.arrays):
            if a.dtype != dtype or dtype.name not in ("float32", "float64"):
                raise CommlibError(f"GeoSGD: parameter {n!r} is {a.dtype}; every parameter must be float32, or "
                                   f"every one float64 (the first is {dtype})")
            if not a.flags.c_contiguous or not a.flags.writeable:
                raise CommlibError(f"GeoSGD: parameter {n!r} must be a writable C-contiguous array (it is "
                                   "updated in place)")
        sizes = [a.size for a in self.arrays]
        self._bounds = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        key = client.table_key(name)
        # every worker starts from worker 0's values, the servers' starting point
        mine = (key, [(n, a.shape, a.dtype.str) for n, a in zip(self.names, self.arrays)])
        declared = api.allgather_object(mine, name=f"{key}.declare")  # every worker learns of a mismatch
        for worker, theirs in enumerate(declared):
            if theirs != declared[0]:
                raise CommlibError(f"GeoSGD: worker {worker} declares {theirs}, worker 0 declares {declared[0]}; "
                                   "create every GeoSGD alike (parameters, shapes, dtypes) and in the same order "
                                   "on every worker")
        for n, a in zip(self.names, self.arrays):
            api.broadcast_(a, root_rank=0, name=f"{key}.init.{n}")
        self.base = self._gather()
        self.key = key
        self.table = client.open(key, self.base, self.staleness)
        self.steps = 0  # local steps since the last push
        self.rounds = 0  # rounds pushed
        self._in_flight = False
        self._closed = False

    # -- the training loop --------------------------------------------------------------------------------
    def step(self) -> None:
        """Count one local step; every ``k``-th pushes the delta. An answer already in is applied."""
        self._check_open()
        self.steps += 1
        if self._in_flight and self.table.ready():
            self._apply()
        if self.steps >= self.k:
            self.push()

    def push(self) -> None:
        """Push the change since the last exchange now (after the round in flight, if any, is applied)."""
        self._check_open()
        self.synchronize()
        local = self._gather()
        delta = local - self.base
        if self.average and self.workers > 1:
            delta *= 1.0 / self.workers
        self.base = local  # the answer's correction is measured from what was pushed
        self.rounds += 1
        self.steps = 0
        self.table.push(delta, self.rounds)
        self._in_flight = True
        if not self.overlap:
            self.synchronize()

    def synchronize(self) -> None:
        """Wait for the round in flight (if any) and apply its merged parameters."""
        if self._in_flight:
            self.table.wait()
            self._apply()

    def pull(self) -> None:
        """Fetch the merged parameters now, without pushing (local steps since the last push are kept)."""
        self._check_open()
        self.synchronize()
        self.table.pull()
        self._in_flight = True
        self.synchronize()

    def close(self) -> None:
        """Push the local steps not yet pushed, apply the answer, and leave: the servers no longer wait for
        this worker. The parameters then hold the merged values (other workers may still change the
        servers' copy)."""
        if self._closed:
            return
        try:
            if self.steps:
                self.push()
            self.synchronize()
        finally:
            self._closed = True
            self.table.leave()

    def __enter__(self) -> "GeoSGD":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def slowest_round(self) -> int:
        """The lowest round among the workers still in, as the last answer said (a measure of staleness)."""
        return self.table.slowest

    # -- internals ------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise CommlibError(f"GeoSGD {self.key!r} is closed")

    def _gather(self) -> np.ndarray:
        if not self.arrays:
            return np.empty(0, np.float32)
        return np.concatenate([a.reshape(-1) for a in self.arrays])

    def _apply(self) -> None:
        """local += merged - base (the local steps taken since the push stay on top); base = merged."""
        self._in_flight = False
        merged = self.table.merged
        correction = merged - self.base
        for a, lo, hi in zip(self.arrays, self._bounds[:-1], self._bounds[1:]):
            a.reshape(-1)[...] += correction[lo:hi]
        self.base = merged.copy()


def _named_arrays(params) -> tuple[list[str], list[np.ndarray]]:
    if isinstance(params, Mapping):
        items = list(params.items())
    else:
        items = list(params)
        if items and not isinstance(items[0], tuple):
            items = [(f"param{i}", a) for i, a in enumerate(items)]
    names = [str(n) for n, _ in items]
    if len(set(names)) != len(names):
        raise CommlibError(f"GeoSGD: parameter names repeat: {names}")
    arrays = []
    for n, a in items:
        if not isinstance(a, np.ndarray):
            raise CommlibError(f"GeoSGD: parameter {n!r} is a {type(a).__name__}, not a numpy array (it is updated "
                               "in place)")
        arrays.append(a)
    return names, arrays

