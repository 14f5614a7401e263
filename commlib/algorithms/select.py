"""The ``auto`` rule: the algorithm, and the pipeline segment where it has one, with the least predicted
time (:mod:`.cost`) among those that can run here (each spec's ``requires``).

Every input is equal on every rank - the message size, the codec, the topology, the configuration, the
collective cma probe, and the cost model (rank 0's profile, broadcast by ``AlgorithmContext.create``) - and
the evaluation is deterministic, so every rank picks the same algorithm without a message. Ties go to the
earlier algorithm of the registry and the configured segment size.

Rankings are remembered per (size, codec) on the context (a bounded cache): the search evaluates a few
dozen formulas, which a 4 KiB call should not pay every time.

The model is where ``auto`` starts. With ``COMMLIB_AUTO_LEARN`` (the default) it then learns from the calls
it runs (:mod:`.learn`): :func:`learning_plan` runs the candidates of a size class on its first calls,
times them, and runs the learned algorithm afterwards; :func:`current` says what auto runs now.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable

import numpy as np

from ..cache import BoundedCache
from ..dtypes import BY_NUMPY
from ..ops import ReduceOp
from . import cost, learn, persist, spec
from .cost import INF, Shape

log = logging.getLogger("commlib")

#: Pipeline segments ``auto`` considers for segmented algorithms (bytes of data), besides the configured one.
#: Nothing smaller than 1 MiB: smaller segments cost a step each that the model does not see where ranks
#: outnumber cores (docs/results/design_choices.md).
SEGMENT_CHOICES = (1 << 20, 4 << 20)


@dataclasses.dataclass(frozen=True)
class Choice:
    """What runs: an algorithm of the registry and its pipeline segment (bytes of data)."""

    algorithm: str
    segment_bytes: int
    predicted_s: float | None = None  # the model's time, when auto chose it


def shape_of(ctx) -> Shape:
    """The cost model's view of ``ctx``: nodes of every rank, whether cma can run, the torus grid."""
    cached = ctx.shape
    if cached is None:
        torus = None
        if spec.BY_NAME["torus2d"].requires(ctx, None) is None:
            from .context import torus_layout

            torus = torus_layout(ctx.topology, ctx.config)[0]
        servers = ctx.servers  # the summation servers' lane (ps), or None
        cached = ctx.shape = Shape(
            node_of_rank=tuple(ctx.topology.node_of_rank), cma=ctx.peer_memory is not None and ctx.size > 1,
            torus=torus, small_message_bytes=ctx.config.small_message_bytes,
            servers=tuple(servers.server_nodes) if servers is not None else (),
            server_partition_bytes=ctx.config.server_partition_bytes,
            server_depth=servers.depth if servers is not None else 16,
            server_host_reduce=ctx.config.server_host_reduce)
    return cached


def candidates(ctx, codec) -> list[spec.AlgorithmSpec]:
    """The algorithms ``auto`` weighs on ``ctx`` with ``codec``, in registry order: those that can run there,
    less those that would repeat another's exchanges (``auto_skips``)."""
    return [s for s in spec.SPECS if s.requires(ctx, codec) is None and s.auto_skips(ctx, codec) is None]


def rank_all(model, nbytes: int, shape: Shape, specs, codec, configured_segment: int) -> list[Choice]:
    """Every (algorithm, segment) with its predicted time, fastest first (stable: registry order): the
    formula's time, times the calibration's correction for that algorithm and size (uncompressed)."""
    choices = []
    for s in specs:
        segments = dict.fromkeys((configured_segment,) + SEGMENT_CHOICES) if s.segmented else (configured_segment,)
        factor = cost.correction(model, s.name, nbytes, shape) if codec is None else 1.0
        best = None
        for seg in segments:
            t = s.cost(model, nbytes, shape, codec, seg) * factor
            if best is None or t < best.predicted_s:
                best = Choice(s.name, seg, t)
        choices.append(best)
    return sorted(choices, key=lambda c: c.predicted_s)


def reduced_by_callback(dtype, codec=None) -> str | None:
    """``dtype``'s name where MPI's own allreduce of it reduces through a Python callback (commlib's kernels
    as a user-defined MPI op: the half types, sent without a codec), else None. No MPI can offload such an
    op, and beside a training thread each of its calls waits for the GIL: MPI's own fp16 allreduce of
    DDP's buckets took 2-3x commlib's best in a training job (docs/results/auto_learn_rules.md). Its size
    classes are learned apart, with MPI's own ranked last, and only where the model calls them short."""
    if dtype is None or codec is not None:
        return None
    row = BY_NUMPY.get(np.dtype(dtype))
    return row.name if row is not None and row.mpi is None else None


def ranked(ctx, nbytes: int, codec=None, dtype=None) -> list[Choice]:
    """Every algorithm that can run on ``ctx`` for ``nbytes`` with ``codec``, with its best segment and
    predicted time, fastest first (remembered per (size, codec, dtype class) on the context); where MPI's
    own would reduce ``dtype`` through a callback (:func:`reduced_by_callback`), it comes last, and only
    under ``learn.SMALL_S``."""
    cache = ctx.rankings
    if cache is None:
        cache = ctx.rankings = BoundedCache(256)
    callback = reduced_by_callback(dtype, codec)
    key = (nbytes, codec.name if codec is not None else None, callback)
    hit = cache.get(key)
    if hit is not None:
        return hit
    ranking = rank_all(ctx.cost_model, nbytes, shape_of(ctx), candidates(ctx, codec), codec,
                       ctx.config.ring_segment_bytes)
    if not ranking or ranking[0].predicted_s == INF:
        raise RuntimeError(f"no allreduce algorithm can run here for {nbytes} bytes")  # ring always can
    if callback:  # last, and only where calls are short (its one MPI call's latency can still win there)
        native = [c for c in ranking if c.algorithm == "native" and c.predicted_s < learn.SMALL_S]
        ranking = [c for c in ranking if c.algorithm != "native"] + native
    return cache.put(key, ranking)


def choose(ctx, nbytes: int, codec=None, dtype=None) -> Choice:
    """The cost model's choice for a message of ``nbytes`` bytes (the float32 size with a codec) of
    ``dtype`` (None: one MPI reduces itself)."""
    return ranked(ctx, nbytes, codec, dtype)[0]


def choice_of(ctx, algorithm: str, nbytes: int, codec=None, dtype=None) -> Choice:
    """``algorithm`` as ``auto`` would run it at ``nbytes``: with the segment the model finds best for it."""
    for choice in ranked(ctx, nbytes, codec, dtype):
        if choice.algorithm == algorithm:
            return choice
    one = spec.get(algorithm)  # configured, though auto leaves it out here (auto_skips)
    if one.requires(ctx, codec) is not None:
        raise RuntimeError(f"{algorithm} cannot run here for {nbytes} bytes")  # candidates come from ranked
    return rank_all(ctx.cost_model, nbytes, shape_of(ctx), [one], codec, ctx.config.ring_segment_bytes)[0]


# -- learning (:mod:`.learn`) ------------------------------------------------------------------------------
def learner(ctx) -> learn.Learner | None:
    """The context's learner, made on first use, starting from what earlier jobs of this layout settled
    (:func:`recall`); None when learning is off (COMMLIB_AUTO_LEARN=0) or there is nobody to learn with."""
    if not ctx.config.auto_learn or ctx.size < 2:
        return None
    found = ctx.learner
    if found is None:
        transport = ctx.transport

        def agree(times):
            transport.allreduce_native_(times, ReduceOp.MAX)  # every rank: the slowest rank's times
            return times
        found = ctx.learner = learn.Learner(agree, sync=transport.barrier, pace=ctx.config.auto_pace)
        kept = ctx.kept
        if kept is not None:
            for data in kept.buckets:
                found.restore(learn.Bucket.from_kept(data))
            found.origin = kept.describe()
            found.notes.append(found.origin)
    return found


def layout_of(ctx) -> dict:
    """What the times ``auto`` measures depend on and this job knows before it runs, equal on every rank:
    the cost model's view of the ranks and their links (:func:`shape_of`: nodes, cross-memory attach, the
    summation servers), the model's parameters, the settings the algorithms read, and the algorithms that
    can run (:mod:`.persist` keeps what was settled per layout)."""
    config = ctx.config
    return {"shape": dataclasses.asdict(shape_of(ctx)), "model": ctx.cost_model.to_json(),
            "algorithms": [s.name for s in candidates(ctx, None)],
            "settings": {"ring_segment_bytes": config.ring_segment_bytes,
                         "cma_segment_bytes": config.cma_segment_bytes}}


def recall(ctx) -> None:
    """Collective on ``ctx``'s transport: rank 0 reads what earlier jobs of this layout settled (with rank
    0's ``COMMLIB_AUTO_CACHE``) and broadcasts it, so that every rank's learner starts from the same
    buckets (:func:`learner`); :func:`keep` writes them back at the end. Call it where every rank of the
    lane does, after the context has its servers; nothing where learning is off."""
    if not ctx.config.auto_learn or ctx.size < 2:
        return
    from .context import broadcast_bytes

    data = b""
    if ctx.rank == 0:
        data = persist.read(persist.directory_of(ctx.config.auto_cache), layout_of(ctx)).to_bytes()
    ctx.kept = persist.Kept.from_bytes(broadcast_bytes(ctx.transport, data))


def keep(ctx) -> None:
    """Rank 0, at the end: write what this lane's learner settled into its layout's file (merged with what
    other jobs kept there). Nothing where the context never recalled, keeping is off or nothing settled;
    a directory that cannot be written is logged, never an error of the job."""
    kept, learning = ctx.kept, ctx.learner
    if ctx.rank != 0 or kept is None or kept.status == persist.OFF or learning is None:
        return
    settled = [b.to_kept() for b in learning.buckets.values() if b.keepable]
    if not settled:
        return
    directory = persist.directory_of(ctx.config.auto_cache)
    try:
        persist.write(directory, layout_of(ctx), settled)
    except OSError as exc:
        log.warning("commlib: could not keep what auto settled in %s: %s", directory, exc)


def bucket_key(nbytes: int, codec=None, fused: bool = False, dtype=None) -> tuple:
    """The size class :mod:`.learn` measures ``nbytes`` in (its power of two), with the codec (or the
    dtype, where MPI reduces it through a callback: its candidates come in another order) and whether the
    call reduces several buffers fused in place."""
    return (max(int(nbytes), 1).bit_length(),
            codec.name if codec is not None else reduced_by_callback(dtype), fused)


def learning_plan(ctx, nbytes: int, codec, fused: bool, runner_for: Callable[[Choice], Callable[..., int]],
                  dtype=None) -> Callable[..., int]:
    """A function running one call of ``nbytes`` the way ``auto`` decides now: a candidate while its size
    class is explored (timed, its time recorded), then the learned algorithm. ``runner_for(choice)`` makes
    the function that runs ``choice`` (returning an overflow count, or None for none); one is made per
    algorithm used."""
    learning = learner(ctx)
    bucket = learning.bucket(bucket_key(nbytes, codec, fused, dtype), lambda: ranked(ctx, nbytes, codec, dtype))
    runners: dict[str, Callable[..., int]] = {}

    def runner(name: str):
        found = runners.get(name)
        if found is None:
            found = runners[name] = runner_for(choice_of(ctx, name, nbytes, codec, dtype))
        return found

    def run(*args) -> int:
        name = learning.pick(bucket)
        if name is None and bucket.untimed:  # SETTLED: the settled algorithm, no clock
            return (runners.get(bucket.settled) or runner(bucket.settled))(*args)
        clock = learning.clock
        start = clock()
        overflow = runner(name or bucket.settled)(*args)
        if name is not None:  # an exploring call
            learning.record(bucket, clock() - start)
        else:                 # a watched call of the settled algorithm
            learning.watched(bucket, clock() - start)
        return overflow
    return run


def current(ctx, nbytes: int, codec=None, fused: bool = False, dtype=None) -> Choice:
    """What ``auto`` runs now for ``nbytes``: the learned algorithm where its size class has settled, else
    the cost model's choice."""
    learning = learner(ctx)
    settled = learning.settled(bucket_key(nbytes, codec, fused, dtype)) if learning is not None else None
    return choice_of(ctx, settled, nbytes, codec, dtype) if settled else choose(ctx, nbytes, codec, dtype)


#: Sizes ``auto`` considers as the fusion limit: powers of two from 256 B to 64 MiB.
_PACK_SIZES = tuple(1 << k for k in range(8, 27))
#: The group a packed tensor joins, in tensors of its size, when its marginal cost is predicted.
_GROUP = 8


def packing_limit(model, shape: Shape, specs, configured_segment: int) -> int:
    """``auto``'s fusion decision: tensors of at least this many bytes are reduced in place, smaller ones
    are copied into the fusion buffer. A tensor of m bytes is worth packing when its own call is predicted
    to cost more than copying it in and out plus what its bytes add to a fused call,
    ``T(m) > 2 m copy + T(8 m) - T(7 m)`` (T: the fastest algorithm's predicted time); the limit is the
    first power of two where that fails."""
    def best(nbytes: int) -> float:
        return rank_all(model, nbytes, shape, specs, None, configured_segment)[0].predicted_s

    copy = model.copy_s_per_byte
    for m in _PACK_SIZES:
        if best(m) <= 2 * m * copy + best(_GROUP * m) - best((_GROUP - 1) * m):
            return m
    return 2 * _PACK_SIZES[-1]


#: What one more buffer in place costs cma's pass over a group (its address in the exchange, a few more copy
#: vectors), where packing it costs two copies instead. (The ring's pass over a group sends a message per
#: buffer at least: there a buffer costs what a message does, as :func:`packing_limit` has it.)
_PASS_BUFFER_S = 2e-6


def pass_limit(model) -> int:
    """The fusion limit for a group that cma reduces, in one pass however many buffers it has: a tensor in
    place costs that pass one more buffer (``_PASS_BUFFER_S``) rather than a call of its own, so only
    tensors whose two copies cost less than that are packed; the first power of two where they do not."""
    for m in _PACK_SIZES:
        if _PASS_BUFFER_S <= 2 * m * model.copy_s_per_byte:
            return m
    return 2 * _PACK_SIZES[-1]


def forget_model(ctx) -> None:
    """``ctx.cost_model`` changed (``--calibrate``): drop what was decided from the old one (the engine
    drops its plans too: :meth:`commlib.engine.Engine.use_model`)."""
    ctx.rankings = None
    ctx.inplace_limit = None


def inplace_limit(ctx) -> int:
    """:func:`packing_limit` for ``ctx`` (float32, the algorithms that can run there), remembered on the
    context; equal on every rank (the same model and shape)."""
    limit = ctx.inplace_limit
    if limit is None:
        limit = ctx.inplace_limit = packing_limit(
            ctx.cost_model, shape_of(ctx), candidates(ctx, None), ctx.config.ring_segment_bytes)
    return limit
