"""Worker: the ring allreduce with a wire codec, bit for bit against a numpy simulation of its rule.

    mpiexec -n P python codec_ring_check.py

The rule (docs/algorithms.md, "Wire codecs"): chunk c is started by rank c+1, which sends
``wire(x * prescale)``; each following rank k computes ``x_k * prescale + float32(received)`` in float32 and
sends it on encoded; the owner c ends with ``v``, keeps ``float32(wire(v)) * postscale``, and every other
rank decodes the same wire values with the same postscale. The simulation below computes exactly that
with numpy/ml_dtypes conversions, so any difference in rounding, scaling order (e.g. a fused multiply-add),
segmenting or message matching shows as a bit difference. Checked through ``ring.allreduce``
(prescale/postscale given directly) and through ``Engine.allreduce_`` (fp16 pre-divide and multiply-back),
with a small segment size so that chunks span many segments, including chunks whose segment counts
differ. For every algorithm, the Engine's scaling (folded into the codec passes by ring, recursive
doubling and rabenseifner) is also compared with separate scaling passes around ``run_allreduce``.
Named cases on every rank (tests/spmd.py).
"""

from __future__ import annotations

import warnings

import numpy as np
from mpi4py import MPI

from commlib import kernels
from commlib.algorithms import ALGORITHMS, AlgorithmContext, partition, ring, run_allreduce
from commlib.compression import Compression, CompressionOverflowWarning
from commlib.config import Config
from commlib.engine import Engine
from commlib.ops import ReduceOp
from commlib.topology import Topology
from commlib.transport.mpi import MPITransport
import spmd

F32 = np.float32
SEGMENT_BYTES = 4096  # a codec segment is SEGMENT_BYTES / 16 = 256 elements


def simulate(inputs: list[np.ndarray], wire, op: ReduceOp, pre: float, post: float) -> np.ndarray:
    p = len(inputs)
    n = inputs[0].size
    offs = partition.offsets(n, p)
    combine = {ReduceOp.SUM: np.add, ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum}[op]
    out = np.empty(n, F32)
    for c in range(p):
        s, e = offs[c], offs[c + 1]
        part = lambda k: inputs[k % p][s:e]  # noqa: E731
        if p == 1:
            v = part(c)
        else:
            v = (part(c + 1) * F32(pre)).astype(F32)
            for k in range(2, p + 1):
                v = combine((part(c + k) * F32(pre)).astype(F32), v.astype(wire).astype(F32))
        out[s:e] = v.astype(wire).astype(F32) * F32(post) if p > 1 else v * F32(pre) * F32(post)
    return out


def same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
        bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
        i = int(bad[0])
        raise AssertionError(f"{what}: {bad.size} element(s) differ from the simulated rule; first at [{i}]: "
                             f"got {got[i]!r}, expected {want[i]!r}")


comm = MPI.COMM_WORLD
p, rank = comm.size, comm.rank
config = Config.load(ring_segment_bytes=SEGMENT_BYTES)
transport = MPITransport.duplicate(comm)
ctx = AlgorithmContext.create(transport, Topology.detect(comm, config.local_size), config)
engine = Engine(MPITransport.duplicate(comm), Topology.detect(comm, config.local_size), config)
# sizes: tiny, one segment, chunks of 257 and 256 elements (different segment counts), many segments
SIZES = (1, 7, 256 * p, 257 * p - (p - 1), 256 * p + 1, 5000, 40_000)
CODECS = (Compression.fp16, Compression.bf16)


def inputs(n: int) -> list[np.ndarray]:
    return [(np.random.default_rng([k, n]).standard_normal(n) * 100).astype(F32) for k in range(p)]


@spmd.case
def ring_with_prescale_and_postscale():
    for codec in CODECS:
        for n in SIZES:
            every = inputs(n)
            for op in (ReduceOp.SUM, ReduceOp.MAX):
                for pre, post in ((1.0, 1.0), (1 / p, float(p)), (0.5, 3.0)):
                    buf = every[rank].copy()
                    ring.allreduce(ctx, buf, op, codec, prescale=pre, postscale=post)
                    same_bits(buf, simulate(every, codec.wire_dtype, op, pre, post),
                              f"ring {codec} n={n} {op.name} prescale={pre} postscale={post}")


@spmd.case
def engine_ring_predivides_for_fp16():
    """The Engine: fp16 Sum/Average divide by p before encoding; Sum multiplies back."""
    for codec in CODECS:
        for n in SIZES:
            every = inputs(n)
            for op, user_pre, user_post in ((ReduceOp.SUM, 1.0, 1.0), (ReduceOp.AVERAGE, 1.0, 1.0),
                                            (ReduceOp.SUM, 2.0, 0.25)):
                predivide = codec is Compression.fp16 and p > 1
                pre = user_pre / p if predivide else user_pre
                post = user_post * (p if predivide and op is ReduceOp.SUM else 1)
                if op is ReduceOp.AVERAGE and not predivide and p > 1:
                    post /= p
                buf = every[rank].copy()
                engine.allreduce_(buf, op, algorithm="ring", prescale=user_pre, postscale=user_post, codec=codec)
                same_bits(buf, simulate(every, codec.wire_dtype, ReduceOp.SUM, pre, post),
                          f"engine ring {codec} n={n} {op.name} prescale={user_pre} postscale={user_post}")


@spmd.case
def every_algorithm_scales_as_separate_passes():
    """The Engine's scaling (folded into the codec passes where the algorithm can, and into the ring's last
    reduce-scatter step without a codec) is bit for bit that of separate passes around run_allreduce."""
    for name in ALGORITHMS:
        if name in ("native", "ps") or (name == "cma" and engine.context.peer_memory is None):
            continue  # cma: only where the kernel allows it (algo_check checks the probe's verdict); ps: servers
        for codec in (None, Compression.fp16, Compression.bf16):
            for n in (7, 257 * p - (p - 1), 5000, 20011) + ((600011,) if codec is None else ()):
                x = (np.random.default_rng([rank, n, 7]).standard_normal(n) * 100).astype(F32)
                for op, user_pre, user_post in ((ReduceOp.SUM, 1.0, 1.0), (ReduceOp.AVERAGE, 2.0, 1.0),
                                                (ReduceOp.MAX, 0.5, 3.0)):
                    predivide = codec is Compression.fp16 and p > 1 and op is not ReduceOp.MAX
                    pre = user_pre / p if predivide else user_pre
                    post = user_post * (p if predivide and op is ReduceOp.SUM else 1)
                    if op is ReduceOp.AVERAGE and not predivide and p > 1:
                        post /= p
                    want = x.copy()
                    kernels.scale_(want, pre)
                    run_allreduce(engine.context, want, op, name, codec)
                    kernels.scale_(want, post)
                    got = x.copy()
                    engine.allreduce_(got, op, algorithm=name, prescale=user_pre, postscale=user_post, codec=codec)
                    same_bits(got, want, f"engine {name} {codec} n={n} {op.name} prescale={user_pre} "
                                         f"postscale={user_post} vs separate scaling passes")


@spmd.case
def overflow_warns_only_the_rank_that_overflowed():
    """Only the rank whose value overflowed float16 after the pre-divide is warned."""
    big = np.full(3000, 1.0, F32)
    if rank == 0:
        big[5] = 65504.0 * p * 4
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.allreduce_(big, ReduceOp.SUM, algorithm="ring", codec=Compression.fp16, name="big")
    warned = [w for w in caught if issubclass(w.category, CompressionOverflowWarning)]
    if p > 1 and bool(warned) != (rank == 0):
        raise AssertionError(f"rank {rank}: expected an overflow warning only on rank 0, got {len(warned)}")
    if p > 1 and not np.isinf(big[5]):
        raise AssertionError(f"the overflowed value should be inf on every rank, got {big[5]}")


@spmd.case
def close():
    engine.close()
    ctx.close()
    transport.free()
    comm.Barrier()


if __name__ == "__main__":
    spmd.main()
