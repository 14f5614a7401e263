"""Values a worker sends to the driver while a function runs: Horovod's ``horovod.ray.ray_logger``.

A worker calls ``ray_logger.log({...})`` (Horovod's examples do so on rank 0); the driver's
``RayExecutor.run(fn, callbacks=[...])`` calls each callback with each dict as it arrives. The values travel
through a Ray queue made for the run (an actor of no CPU); without callbacks ``log`` warns once and drops.
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional, Sequence

_queue = None
_warned = False


def log(info: dict) -> None:
    """Send ``info`` to the driver's callbacks."""
    global _warned
    if _queue is not None:
        _queue.put(info)
    elif not _warned:
        warnings.warn("ray_logger.log called, but the driver gave no callbacks: the values are dropped")
        _warned = True


def configure_in_actor(member, queue) -> None:
    """Run in a worker (with its Member): log to ``queue``."""
    global _queue
    _queue = queue


def make_queue():
    from ray.util.queue import Queue

    return Queue(actor_options={"num_cpus": 0})


def close_queue(queue) -> None:
    queue.shutdown()


def get_with_callbacks(refs: Sequence, queue, callbacks: Optional[Sequence[Callable]]) -> list:
    """``ray.get(refs)``, calling ``callbacks`` with what arrives on ``queue`` meanwhile."""
    import ray

    def drain() -> None:
        while queue is not None and callbacks and not queue.empty():
            info = queue.get_nowait()
            for callback in callbacks:
                callback(info)

    pending = list(refs)
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.1)
        drain()
    drain()
    return ray.get(list(refs))
