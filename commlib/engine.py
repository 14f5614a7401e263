"""Engine: one execution lane - a Transport, its AlgorithmContext, and the collectives the API runs.

The coordinator has already checked that every rank asked for the same operation with matching dtypes
and shapes; the engine validates what one rank can see (dtype, op, contiguity) and executes. Each
collective reads top to bottom: validate, prescale, reduce, postscale.

Example (on every rank)::

    engine = Engine(MPITransport.duplicate(comm), Topology.detect(comm), Config.load())
    grads = np.ones(1000, np.float32)
    engine.allreduce_(grads, Average)      # grads now holds the mean over ranks
    engine.close()
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from . import kernels
from .algorithms import AlgorithmContext, execute, partition, prepare, ring, select, spec
from .buffers import pack, unpack
from .cache import BoundedCache
from .compression import WireCodec, warn_overflow
from .config import Config
from .dtypes import FLOAT16
from .validation import check_contiguous, check_options, check_reducible
from .errors import CommlibError
from .ops import ReduceOp, as_op
from .topology import Topology
from .transport.base import Transport
from .transport.deadline import patiently

_COUNT = np.dtype(np.int64)
PATIENT_BYTES = 8 << 20  # an allreduce at least this large across hosts waits patiently (Engine._bulk)


def scale_factors(op: ReduceOp, codec: WireCodec | None, prescale: float, postscale: float,
                   size: int) -> tuple[float, float]:
    """The factors an algorithm applies before and after reducing: the user's, an Average's division, and
    with fp16 on the wire a division by the ranks first (so that no partial sum of in-range inputs can
    exceed float16's range), undone afterwards for Sum."""
    average = op is ReduceOp.AVERAGE and size > 1
    predivide = codec is not None and codec.wire_dtype == FLOAT16 and size > 1 and op.kernel_op is ReduceOp.SUM
    pre = prescale / size if predivide else prescale
    post = postscale
    if predivide and not average:
        post *= size  # Sum: undo the division
    elif average and not predivide:
        post /= size
    return pre, post


class Engine:
    """Collectives over ``transport`` (this lane's own communicator; the engine frees it on ``close``).

    Not thread-safe: one engine per lane, used by one thread at a time."""

    def __init__(self, transport: Transport, topology: Topology, config: Config):
        self.transport = transport
        self.topology = topology
        self.config = config
        self.context = AlgorithmContext.create(transport, topology, config)
        #: the algorithm of host buffers that name none: the configured one, or auto where that one reduces
        #: device buffers only (COMMLIB_ALGORITHM=nccl)
        configured = spec.BY_NAME.get(config.algorithm)
        self.host_algorithm = spec.AUTO if configured is not None and configured.device else config.algorithm
        #: ``auto``'s plan per request while it learns (:meth:`plan_allreduce`): a small call's latency is
        #: mostly decisions like these, and each plan follows the learner
        self._learning_plans = BoundedCache(256)

    def recall(self) -> None:
        """Collective: start ``auto`` from what earlier jobs of this lane's layout settled, and keep what
        this job settles when the engine closes (:func:`.algorithms.select.recall`). The runtime calls it
        once the lane is complete (its summation servers attached); an engine never recalled keeps
        nothing."""
        select.recall(self.context)

    def use_model(self, model) -> None:
        """Decide from the cost model ``model`` from now on (``commlib-bench --calibrate`` fits one during
        the job; equal on every rank): what was decided from the old one is forgotten."""
        self.context.cost_model = model
        select.forget_model(self.context)
        self._learning_plans = BoundedCache(256)

    @property
    def fusion_inplace_bytes(self) -> int:
        """Tensors at least this large are reduced in place, never packed: COMMLIB_FUSION_INPLACE, or by
        default the limit the cost model predicts (:func:`.algorithms.select.inplace_limit`)."""
        configured = self.config.fusion_inplace_bytes
        return configured if configured is not None else select.inplace_limit(self.context)

    def group_inplace_bytes(self, nbytes: int, dtype, codec: WireCodec | None, algorithm: str | None) -> int:
        """The fusion limit for a group of ``nbytes`` in all: where it runs cma (``algorithm``, else the
        lane's, else what auto runs now for a fused call of that size), which reduces every buffer of the
        group in one pass, :func:`.algorithms.select.pass_limit`; else :attr:`fusion_inplace_bytes`."""
        limit = self.fusion_inplace_bytes
        if self.config.fusion_inplace_bytes is not None or self.context.peer_memory is None:
            return limit
        algorithm = algorithm or self.host_algorithm
        if algorithm == spec.AUTO:
            algorithm = select.current(self.context, nbytes, codec, True, dtype).algorithm
        return min(limit, select.pass_limit(self.context.cost_model)) if algorithm == "cma" else limit

    @property
    def rank(self) -> int:
        return self.transport.rank

    @property
    def size(self) -> int:
        return self.transport.size

    # -- allreduce --------------------------------------------------------------------------------------
    def allreduce_(self, buf: np.ndarray, op=ReduceOp.SUM, algorithm: str | None = None,
                   prescale: float = 1.0, postscale: float = 1.0, codec: WireCodec | None = None,
                   name: str = "tensor") -> np.ndarray:
        """Reduce the C-contiguous ``buf`` in place across all ranks and return it.

        Args:
            op: ``Sum``, ``Average`` (sum, then divided by the number of ranks), ``Min``, ``Max``, ``Product``.
            algorithm: ``auto`` or a name of the registry (:mod:`commlib.algorithms.spec`); None means
                ``config.algorithm``.
            prescale, postscale: factors applied before and after the reduction (floating dtypes only).
            codec: a ``WireCodec`` (float32 buffers only): data travels in half precision.
            name: names the tensor in errors and warnings.

        Warning: with ``Compression.fp16`` and Sum/Average, values are divided by the number of ranks
        before encoding (so partial sums stay in float16's range) and multiplied back after (Sum only);
        a value whose magnitude divided by the number of ranks still exceeds 65504 becomes inf and this
        rank is warned (``CompressionOverflowWarning``).
        """
        op = as_op(op)
        check_contiguous(buf, name)
        check_reducible(buf, op, name)
        self.plan_allreduce(buf.dtype, buf.size, op, algorithm, prescale, postscale, codec, name)(buf.reshape(-1))
        return buf

    def plan_allreduce(self, dtype: np.dtype, count: int, op=ReduceOp.SUM, algorithm: str | None = None,
                       prescale: float = 1.0, postscale: float = 1.0, codec: WireCodec | None = None,
                       name: str = "tensor") -> Callable[[np.ndarray], None]:
        """What :meth:`allreduce_` does to a buffer of ``count`` values of ``dtype``, decided once: a
        function that reduces such a 1-D C-contiguous buffer in place. The checks, the algorithm choice
        and the scale factors depend only on the request, so the coordinator keeps one function per
        negotiated request; a small call's latency is mostly decisions like these."""
        op = as_op(op)
        check_options(dtype, codec, prescale, postscale, name)
        ctx = self.context
        algorithm = algorithm or self.host_algorithm
        pre, post = scale_factors(op, codec, prescale, postscale, self.size)
        kernel_op = op.kernel_op
        if algorithm == spec.AUTO and self.size > 1 and count and select.learner(ctx) is not None:
            key = (dtype, count, kernel_op, pre, post, codec.name if codec is not None else None, name)
            plans = self._learning_plans
            known = plans.get(key)
            if known is not None:
                return known
            prepare(ctx, dtype, count * dtype.itemsize, algorithm, codec)  # the checks

            def runner_for(choice):
                if choice.algorithm == "native" and pre == 1.0 and post == 1.0:
                    return self.transport.native_allreducer(dtype, kernel_op)  # (None: no overflow count)
                return self._waiting_as_needed(lambda flat: execute(ctx, flat, kernel_op, choice, codec, pre, post),
                                               choice.algorithm, count * dtype.itemsize)
            plan = select.learning_plan(ctx, count * dtype.itemsize, codec, False, runner_for, dtype)
            if codec is None:  # nothing can overflow
                return plans.put(key, plan)

            def run_learning(flat: np.ndarray) -> None:
                overflow = plan(flat)
                if overflow:
                    warn_overflow(name, overflow, codec)
            return plans.put(key, run_learning)
        choice = prepare(ctx, dtype, count * dtype.itemsize, algorithm, codec)
        if self.size > 1 and count and choice.algorithm == "native" and pre == 1.0 and post == 1.0:
            return self.transport.native_allreducer(dtype, kernel_op)

        def run(flat: np.ndarray) -> None:
            overflow = execute(ctx, flat, kernel_op, choice, codec, pre, post)
            if overflow:
                warn_overflow(name, overflow, codec)
        return self._waiting_as_needed(run, choice.algorithm, count * dtype.itemsize)

    def _bulk(self, nbytes: int) -> bool:
        """Whether an allreduce of ``nbytes`` is a bulk transfer across hosts: the waits of commlib's own
        algorithms then sleep between polls, leaving the core to the framework
        (:func:`.transport.deadline.patiently`). Never MPI's own allreduce: MPI progresses its schedule
        only inside a poll, so sleeping between polls slows its calls (docs/results/design_choices.md)."""
        return nbytes >= PATIENT_BYTES and self.topology.cross_size > 1

    def _waiting_as_needed(self, run: Callable, algorithm: str, nbytes: int) -> Callable:
        """``run`` (a call of ``algorithm`` moving ``nbytes``), its waits patient where that is a bulk
        transfer across hosts by one of commlib's algorithms; decided once, not per call."""
        if algorithm == "native" or not self._bulk(nbytes):
            return run

        def run_patiently(*args, **kwargs):
            with patiently():
                return run(*args, **kwargs)
        return run_patiently

    def reduce_gathered_(self, out: np.ndarray, contributions: Sequence[np.ndarray], op=ReduceOp.SUM,
                         prescale: float = 1.0, postscale: float = 1.0) -> np.ndarray:
        """The allreduce of contributions that already reached this rank (every rank's buffer, in rank
        order; see :mod:`.coordinator.eager`), written into the 1-D ``out``: each contribution scaled by
        ``prescale`` as its rank would scale it, reduced in rank order, then ``postscale`` (and an
        Average's division) applied. Every rank that computes it from the same contributions gets the
        same bits."""
        op = as_op(op)
        pre, post = scale_factors(op, None, prescale, postscale, self.size)
        kernel_op = op.kernel_op
        out[...] = contributions[0]
        if pre != 1.0:
            kernels.scale_(out, pre)
        for contribution in contributions[1:]:
            if pre != 1.0:
                contribution = contribution.copy()
                kernels.scale_(contribution, pre)
            kernels.reduce_(out, contribution, kernel_op)
        if post != 1.0:
            kernels.scale_(out, post)
        return out

    def allreduce_many_(self, bufs: Sequence[np.ndarray], op=ReduceOp.SUM, algorithm: str | None = None,
                        prescale: float = 1.0, postscale: float = 1.0, codec: WireCodec | None = None,
                        name: str = "tensors") -> None:
        """Reduce several C-contiguous buffers of one dtype in place, as :meth:`allreduce_` would each.

        Where the algorithm for their total size reduces them in one pass (cma; the ring without a codec or
        prescale, over their concatenation: :func:`.algorithms.spec.reduces_together`), they are reduced together
        without copying them; otherwise one :meth:`allreduce_` each, those small enough packed into one
        first (:meth:`_apart`)."""
        op = as_op(op)
        for buf in bufs:  # before flattening: reshape(-1) of a non-contiguous array is a silent copy
            check_contiguous(buf, name)
            check_reducible(buf, op, name)
        flats = [b.reshape(-1) for b in bufs]
        if len({f.dtype for f in flats}) > 1:
            raise TypeError(f"{name}: allreduce_many_ needs buffers of one dtype, got "
                            f"{sorted({f.dtype.name for f in flats})}")
        if len(flats) < 2 or self.size == 1:
            for flat in flats:
                self.allreduce_(flat, op, algorithm, prescale, postscale, codec, name)
            return
        check_options(flats[0].dtype, codec, prescale, postscale, name)
        algorithm = algorithm or self.host_algorithm
        total = sum(f.nbytes for f in flats)
        if algorithm == spec.AUTO and select.learner(self.context) is not None:
            prepare(self.context, flats[0].dtype, total, algorithm, codec)  # the checks
            overflow = select.learning_plan(self.context, total, codec, True,
                                            lambda choice: self._many_runner(choice, op, codec, prescale,
                                                                             postscale, total),
                                            flats[0].dtype)(flats)
            if overflow:
                warn_overflow(name, overflow, codec)
            return
        choice = prepare(self.context, flats[0].dtype, total, algorithm, codec)
        pre, post = scale_factors(op, codec, prescale, postscale, self.size)
        together = spec.get(choice.algorithm).run_many
        if together is None or not spec.reduces_together(choice.algorithm, codec, pre):
            def reduce_one(flat: np.ndarray) -> int:
                self.allreduce_(flat, op, algorithm, prescale, postscale, codec, name)  # (it warns of overflow)
                return 0
            self._apart(flats, reduce_one)
            return
        self.context.segment_bytes = choice.segment_bytes
        overflow = self._waiting_as_needed(together, choice.algorithm, total)(
            self.context, flats, op.kernel_op, codec, prescale=pre, postscale=post)
        if overflow:
            warn_overflow(name, overflow, codec)

    def _many_runner(self, choice, op: ReduceOp, codec, prescale: float, postscale: float, total: int):
        """A function reducing a list of flat buffers of ``total`` bytes with ``choice`` (``auto`` learning
        on fused calls): in one pass where the algorithm does that, else one call of it each (:meth:`_apart`)."""
        ctx = self.context
        pre, post = scale_factors(op, codec, prescale, postscale, self.size)
        kernel_op = op.kernel_op
        together = spec.get(choice.algorithm).run_many if spec.reduces_together(choice.algorithm, codec, pre) else None

        def run(flats) -> int:
            if together is not None:
                ctx.segment_bytes = choice.segment_bytes
                return together(ctx, flats, kernel_op, codec, prescale=pre, postscale=post)
            return self._apart(flats, lambda flat: execute(
                ctx, flat, kernel_op, select.choice_of(ctx, choice.algorithm, flat.nbytes, codec), codec, pre, post))
        return self._waiting_as_needed(run, choice.algorithm, total)

    def _apart(self, flats: list[np.ndarray], reduce_one: Callable[[np.ndarray], int]) -> int:
        """Reduce ``flats`` with an algorithm that runs a call per buffer, those under
        :attr:`fusion_inplace_bytes` packed into one scratch buffer first (the coordinator leaves more tensors
        in place where it expects cma's one pass: :meth:`group_inplace_bytes`); returns the summed overflow
        counts."""
        limit = self.fusion_inplace_bytes
        small = [f for f in flats if f.nbytes < limit]
        if len(small) < 2:
            return sum(reduce_one(flat) for flat in flats)
        packed = self.context.scratch.get("engine.apart", sum(f.size for f in small), small[0].dtype)
        pack(small, packed)
        overflow = sum(reduce_one(flat) for flat in [packed] + [f for f in flats if f.nbytes >= limit])
        unpack(packed, small)
        return overflow

    # -- data movement ----------------------------------------------------------------------------------
    def _row_counts(self, rows: int) -> list[int]:
        """Every rank's number of rows (first dimension)."""
        mine = np.array([rows], _COUNT)
        every = np.empty(self.size, _COUNT)
        self.transport.allgatherv(mine, every, [1] * self.size)
        return every.tolist()

    def allgather(self, arr: np.ndarray, name: str = "tensor") -> np.ndarray:
        """Concatenate every rank's ``arr`` along the first dimension (which may differ between ranks;
        the other dimensions must match). A non-contiguous ``arr`` is copied first."""
        arr = _at_least_1d(arr, name)
        rows = self._row_counts(arr.shape[0])
        row = _row_size(arr)
        out = np.empty((sum(rows),) + arr.shape[1:], arr.dtype)
        self.transport.allgatherv(np.ascontiguousarray(arr).reshape(-1), out.reshape(-1),
                                  [r * row for r in rows])
        return out

    def broadcast_(self, arr: np.ndarray, root: int, name: str = "tensor") -> np.ndarray:
        """Overwrite ``arr`` on every rank with ``root``'s ``arr`` (same shape everywhere); return it."""
        check_contiguous(arr, name)
        if not 0 <= root < self.size:
            raise CommlibError(f"{name}: broadcast root {root} is not a rank (0..{self.size - 1})")
        if self.size > 1 and arr.size:
            self.transport.bcast_(arr.reshape(-1), root)
        return arr

    def reducescatter(self, arr: np.ndarray, op=ReduceOp.SUM, name: str = "tensor", prescale: float = 1.0,
                      postscale: float = 1.0) -> np.ndarray:
        """Reduce ``arr`` across ranks and return this rank's block of rows: the first dimension is cut
        with ``partition.offsets`` (earlier ranks take the extra rows). As Horovod: ``prescale`` multiplies
        each rank's input, ``postscale`` the result, and ``Average`` divides by the size in that same
        postscale pass (integers: each product truncated, see ``kernels.scale_``)."""
        op = as_op(op)
        arr = _at_least_1d(arr, name)
        check_reducible(arr, op, name)
        check_options(arr.dtype, None, prescale, postscale, name)
        rows = partition.offsets(arr.shape[0], self.size)
        row = _row_size(arr)
        work = np.array(arr, order="C", copy=True).reshape(-1)
        if prescale != 1.0:
            kernels.scale_(work, prescale)
        if self.size > 1:
            ring.reduce_scatter_(self.context, self.transport, work, op.kernel_op, [r * row for r in rows])
        mine = work[rows[self.rank] * row:rows[self.rank + 1] * row]
        out = mine.reshape((rows[self.rank + 1] - rows[self.rank],) + arr.shape[1:]).copy()
        post = postscale / self.size if op is ReduceOp.AVERAGE and self.size > 1 else postscale
        if post != 1.0:
            kernels.scale_(out.reshape(-1), post)
        return out

    def alltoall(self, arr: np.ndarray, splits: Sequence[int] | None = None,
                 name: str = "tensor") -> tuple[np.ndarray, np.ndarray]:
        """Send ``splits[i]`` consecutive rows of ``arr`` to rank i; return (the rows received, in rank
        order, and how many came from each rank). ``splits=None`` sends equal shares (the first
        dimension must divide by the number of ranks)."""
        arr = _at_least_1d(arr, name)
        size, nrows = self.size, arr.shape[0]
        if splits is None:
            if nrows % size:
                raise CommlibError(
                    f"{name}: alltoall without splits needs a first dimension divisible by {size} ranks, "
                    f"got {nrows}; pass splits"
                )
            splits = [nrows // size] * size
        splits = [int(s) for s in np.asarray(splits).reshape(-1)]
        if len(splits) != size or min(splits) < 0 or sum(splits) != nrows:
            raise CommlibError(
                f"{name}: alltoall splits {splits} must be {size} non-negative row counts adding up to the "
                f"first dimension {nrows}"
            )
        received = np.empty(size, _COUNT)
        self.transport.alltoallv(np.array(splits, _COUNT), [1] * size, received, [1] * size)
        row = _row_size(arr)
        out = np.empty((int(received.sum()),) + arr.shape[1:], arr.dtype)
        self.transport.alltoallv(np.ascontiguousarray(arr).reshape(-1), [s * row for s in splits],
                                 out.reshape(-1), [int(r) * row for r in received])
        return out, received

    def barrier(self) -> None:
        self.transport.barrier()

    def close(self) -> None:
        """Free the sub-groups, the scratch memory and the transport. Idempotent."""
        if self.context is not None:
            select.keep(self.context)
            self.context.close()
            self.transport.free()
            self.context = None

    def __repr__(self) -> str:
        return f"Engine(rank={self.rank}, size={self.size}, {self.topology})"


def _at_least_1d(arr: np.ndarray, name: str) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array, got {type(arr).__name__}")
    if arr.ndim == 0:
        raise CommlibError(f"{name}: this collective works on the first dimension; got a 0-d array "
                           "(reshape it to (1,))")
    return arr


def _row_size(arr: np.ndarray) -> int:
    """Elements per row (product of the dimensions after the first)."""
    return int(np.prod(arr.shape[1:], dtype=np.int64))
