"""The algorithm registry: one :class:`AlgorithmSpec` per allreduce algorithm, read by everything else
(the configuration's name check, ``prepare``, the Engine, ``auto``, the benchmark, the docs).

Every entry point has one signature::

    run(ctx, buf, op, codec=None, *, prescale=1.0, postscale=1.0) -> overflow count
    run_many(ctx, bufs, op, codec=None, *, prescale=1.0, postscale=1.0) -> overflow count

``buf = postscale * reduce(prescale * buf)`` in place on every rank. An algorithm that ``folds_scaling``
applies the factors inside passes it makes anyway; the others get passes of their own
(:func:`.scaling.with_scaling_passes`), so the caller never needs to know which. ``requires(ctx, codec)``
says, without communicating, why the algorithm cannot run here (None: it can). ``cost(model, nbytes,
shape, codec)`` is its predicted time in seconds (:mod:`.cost`), which ``auto`` minimises.

Importing this module does not import MPI (the configuration validates names against :func:`names`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from ..ops import ReduceOp
from . import (cma, cost, hierarchical, native, pipelined, ps, rabenseifner, recursive_doubling, ring, ring_many,
               torus2d)
from .scaling import with_scaling_passes

#: What ``auto`` stands for: not an algorithm of its own, the cost model's choice among them.
AUTO = "auto"


def _anywhere(ctx, codec) -> str | None:
    return None


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
    """One allreduce algorithm: how to run it, what it needs and what it costs."""

    name: str
    run: Callable[..., int]
    run_many: Callable[..., int] | None  # several buffers in one pass without copying them, or None
    folds_scaling: bool  # prescale/postscale ride on passes the schedule makes anyway
    requires: Callable[..., str | None]  # (ctx, codec) -> why it cannot run here, or None
    cost: Callable[..., float]  # (model, nbytes, shape, codec) -> predicted seconds
    summary: str  # one line for --help, the docs and --explain
    segmented: bool = False  # pipelines in ``ctx.segment_bytes`` segments (auto chooses the size)
    device: bool = False  # reduces device buffers only, on the coordinator's device path (docs/gpu.md)
    #: (ctx, codec) -> why ``auto`` leaves it out on ``ctx`` though it can run (it would repeat another
    #: candidate's exchanges), or None; a configured algorithm still runs
    auto_skips: Callable[..., str | None] = _anywhere


def _passes(schedule: Callable[..., int]) -> Callable[..., int]:
    """The common signature for a schedule that cannot fold scaling: passes before and after."""
    def run(ctx, buf: np.ndarray, op: ReduceOp, codec=None, *, prescale: float = 1.0,
            postscale: float = 1.0) -> int:
        return with_scaling_passes(buf, prescale, postscale, lambda: schedule(ctx, buf, op, codec))
    run.__doc__ = schedule.__doc__
    return run


def _ring_many(ctx, bufs: Sequence[np.ndarray], op: ReduceOp, codec=None, *, prescale: float = 1.0,
               postscale: float = 1.0) -> int:
    """One ring pass over the buffers' concatenation; with a codec or a prescale (which that pass does not
    fold: :func:`reduces_together`) one ring call per buffer."""
    if reduces_together("ring", codec, prescale):
        ring_many.allreduce(ctx, bufs, op, postscale=postscale)
        return 0
    return sum(ring.allreduce(ctx, b, op, codec, prescale=prescale, postscale=postscale) for b in bufs)


def reduces_together(name: str, codec, prescale: float) -> bool:
    """Whether ``name``'s ``run_many`` reduces a group's buffers in one pass with these options: cma's does
    whatever the codec; the ring's folds no codec nor prescale (with one it runs a call per buffer)."""
    return name == "cma" or (name == "ring" and codec is None and prescale == 1.0)


def _cma_many(ctx, bufs, op, codec=None, *, prescale: float = 1.0, postscale: float = 1.0) -> int:
    return cma.allreduce_many(ctx, bufs, op, codec=codec, prescale=prescale, postscale=postscale)


def _cma_one(ctx, buf, op, codec=None, *, prescale: float = 1.0, postscale: float = 1.0) -> int:
    return cma.allreduce(ctx, buf, op, codec=codec, prescale=prescale, postscale=postscale)


NCCL_ON_HOST = ("nccl reduces CUDA device tensors (CuPy arrays, torch CUDA tensors) on the coordinator's device "
                "path; this buffer is in host memory (a configured COMMLIB_ALGORITHM=nccl leaves host tensors to auto)")


def _device_only(ctx, codec) -> str | None:
    return NCCL_ON_HOST


def _nccl_on_host(ctx, buf, op, codec=None, *, prescale: float = 1.0, postscale: float = 1.0) -> int:
    from ..errors import ConfigError

    raise ConfigError(NCCL_ON_HOST)


SPECS: tuple[AlgorithmSpec, ...] = (
    AlgorithmSpec("native", _passes(native.allreduce), None, False, native.requires, cost.native,
                  "MPI's own MPI_Allreduce (no wire compression)"),
    AlgorithmSpec("ring", ring.allreduce, _ring_many, True, _anywhere, cost.ring,
                  "reduce-scatter + allgather around one ring; bandwidth-optimal, pipelined", segmented=True),
    AlgorithmSpec("recursive_doubling", recursive_doubling.allreduce, None, True, _anywhere,
                  cost.recursive_doubling, "log2(p) exchanges of the whole buffer; latency-optimal"),
    AlgorithmSpec("rabenseifner", rabenseifner.allreduce, None, True, _anywhere, cost.rabenseifner,
                  "recursive halving + doubling; bandwidth-optimal with log2(p) latency", segmented=True),
    AlgorithmSpec("hierarchical", _passes(hierarchical.allreduce), None, False, _anywhere, cost.hierarchical,
                  "reduce-scatter in each node, allreduce of the shards across nodes, allgather in each node",
                  segmented=True, auto_skips=hierarchical.flat_here),
    AlgorithmSpec("hierarchical_pipelined", pipelined.allreduce, None, True, _anywhere,
                  cost.hierarchical_pipelined,
                  "hierarchical on blocks: one block crosses the network while the next is reduced in the node",
                  segmented=True, auto_skips=hierarchical.flat_here),
    AlgorithmSpec("torus2d", _passes(torus2d.allreduce), None, False, torus2d.requires, cost.torus2d,
                  "X-by-Y grid: rings along rows, then columns, then rows", segmented=True),
    AlgorithmSpec("cma", _cma_one, _cma_many, True, cma.requires_reason, cost.cma,
                  "one node: each rank reduces its share straight from its peers' memory"),
    AlgorithmSpec("ps", ps.allreduce, None, True, ps.requires, ps.chosen_cost,
                  "through summation servers (push_pull): each rank sends and receives its buffer once; needs "
                  "servers in the job (docs/servers.md)"),
    AlgorithmSpec("nccl", _nccl_on_host, None, False, _device_only, cost.ring,
                  "device tensors: NCCL on the lane's stream when every rank has a GPU of its own (NCCL inside "
                  "each node, the staged host path across nodes), else the staged path (docs/gpu.md)",
                  device=True),
)

BY_NAME: dict[str, AlgorithmSpec] = {spec.name: spec for spec in SPECS}


def names(with_auto: bool = True) -> tuple[str, ...]:
    """Every name the configuration accepts: ``auto`` first, then the algorithms in registry order."""
    return ((AUTO,) if with_auto else ()) + tuple(BY_NAME)


def get(name: str) -> AlgorithmSpec:
    """The spec of the concrete algorithm ``name`` (not ``auto``)."""
    try:
        return BY_NAME[name]
    except KeyError:
        from ..errors import ConfigError

        raise ConfigError(f"unknown algorithm {name!r}; use one of: {', '.join(names())}") from None
