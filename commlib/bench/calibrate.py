"""``commlib-bench --calibrate``: fit the cost model's parameters on the user's own job and write the profile.

What is measured (every rank takes part; figures are combined so that every rank fits the same model):

- each link class through commlib's own transport (what the schedules use): rank 0 and the next rank of
  its node (within a node), rank 0 and the first rank of the next node (between nodes); ``alpha`` = half
  the round trip of 8 bytes (ping-pong), ``beta`` = the extra time per byte of a large message when both
  send at once (``sendrecv``, as every step of a schedule does; the fastest of several, the link's
  capacity); the other ranks wait;
- the local kernels on every rank at once (as during an allreduce): reduce, copy, and each codec's encode
  and decode over 16 MiB of float32 (the slowest rank counts);
- MPI's own allreduce (``native``) at 8 bytes and at 1 and 16 MiB: its latency per log2(p) step, and its
  bandwidth as a multiple of a ring's transfer time (least squares on the large sizes);
- the fixed Python cost of a schedule: recursive doubling on 8 bytes, less what the links predict;
- on one node with cross-memory attach, the cma schedule itself at 4 KiB and 16 MiB: its fixed cost and
  a factor on its formula's bytes (its segments stay in cache, where the kernels outrun the rates above);
- then every algorithm that can run here, at 4 KiB to 64 MiB (x4): its measured time over the fitted
  formula's, the correction ``auto`` applies on this node layout (what no formula sees: per-schedule
  Python overheads, cache effects, how well a pipeline fills, MPI's own algorithms). At each size the
  algorithms take turns in 5 rounds of 1 to 200 consecutive calls (~50 ms where calls are short), as
  commlib-bench interleaves and times them; per round the slowest rank's time per call, then the median
  over the rounds;
- the cost of one more message in a pipelined step: 4 MiB as 32 posted messages against one;
- with summation servers in the job, the link between workers and servers: rank 0 alone pushes 8 and
  32 MiB through the servers (the others wait); ``beta`` is the extra time per byte over what its
  busiest link carries of it (``ps.link_bytes`` for one worker), ``alpha`` half the rest at 8 MiB less
  that link time. ``ps`` then gets its correction like every algorithm.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import statistics
import time

import numpy as np

from .. import kernels
from ..algorithms import cost, select
from ..compression import Compression
from ..ops import ReduceOp
from .core import turn_order
from .report import human_size

_SMALL = 8
_KERNEL_BYTES = 16 << 20
_NATIVE_SIZES = (1 << 20, 16 << 20)


def _call_times(fn, reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _median_time(fn, reps: int) -> float:
    return statistics.median(_call_times(fn, reps))


def _ping_pong(transport, comm, peer: int | None, nbytes: int, reps: int) -> float:
    """Median round trip of ``nbytes`` between rank 0 and ``peer`` (seconds; 0 on the other ranks)."""
    rank = transport.rank
    buf = np.zeros(max(nbytes, 1), np.uint8)
    comm.Barrier()
    if peer is None or rank not in (0, peer):
        comm.Barrier()
        return 0.0
    other = peer if rank == 0 else 0
    times = []
    for i in range(reps + 2):
        start = time.perf_counter()
        if rank == 0:
            transport.send(buf, other)
            transport.recv(buf, other)
        else:
            transport.recv(buf, other)
            transport.send(buf, other)
        if i >= 2:  # the first exchanges set up the connection
            times.append(time.perf_counter() - start)
    comm.Barrier()
    return statistics.median(times)


def _message_cost(transport, comm, peer: int | None, nbytes: int = 4 << 20, pieces: int = 32) -> float:
    """The extra cost of one more message in a pipelined step: ``nbytes`` sent from rank 0 to ``peer`` as
    ``pieces`` posted messages against one (median of 5), per extra message."""
    if peer is None:
        return 0.0
    rank = transport.rank
    buf = np.zeros(nbytes, np.uint8)

    def once(parts: int) -> None:
        size = nbytes // parts
        if rank == 0:
            transport.waitall([transport.isend(buf[i * size:(i + 1) * size], peer) for i in range(parts)])
            transport.recv(buf[:1], peer)
        else:
            transport.waitall([transport.irecv(buf[i * size:(i + 1) * size], 0) for i in range(parts)])
            transport.send(buf[:1], 0)

    comm.Barrier()
    extra = 0.0
    if rank in (0, peer):
        for parts in (1, pieces):
            once(parts)  # warm up
        whole = _median_time(lambda: once(1), 5)
        cut = _median_time(lambda: once(pieces), 5)
        extra = max(cut - whole, 0.0) / (pieces - 1)
    comm.Barrier()
    return comm.bcast(extra, root=0)


def _swap(transport, comm, peer: int | None, nbytes: int, reps: int, fastest: bool = False) -> float:
    """Median (``fastest``: shortest) time of rank 0 and ``peer`` sending each other ``nbytes`` at once
    (``sendrecv``), as every step of a schedule does: within a node both copies compete for memory, so
    this, not a ping-pong, is the bandwidth a schedule sees."""
    rank = transport.rank
    out, into = np.zeros(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    comm.Barrier()
    t = 0.0
    if peer is not None and rank in (0, peer):
        other = peer if rank == 0 else 0
        transport.sendrecv(out, other, into, other)  # warm up
        times = _call_times(lambda: transport.sendrecv(out, other, into, other), reps)
        t = min(times) if fastest else statistics.median(times)
    comm.Barrier()
    return t


def _link(transport, comm, peer: int | None, large: int, reps_large: int) -> tuple[cost.Link | None, dict]:
    """Fit one link class between rank 0 and ``peer`` (None on every rank: no such pair): ``alpha`` from an
    8-byte ping-pong, ``beta`` from simultaneous exchanges of 8 bytes and ``large`` bytes. ``beta`` is the
    link's capacity, so it takes the fastest large exchange: a disturbance slows some exchanges and never
    speeds one up (on 2 emulated hosts one calibration's median 4 MiB exchange took 68 ms, twice the
    link's 35 ms, and halved every formula's bandwidth; what the job really pays is the corrections' job)."""
    if peer is None:
        return None, {}
    small = _ping_pong(transport, comm, peer, _SMALL, 200)
    swap_small = _swap(transport, comm, peer, _SMALL, 50)
    swap_big = _swap(transport, comm, peer, large, reps_large, fastest=True)
    small, swap_small, swap_big = comm.bcast((small, swap_small, swap_big), root=0)
    alpha = small / 2
    beta = max(swap_big - swap_small, 1e-12) / (large - _SMALL)
    return cost.Link(alpha, beta), {"peer": peer, "round_trip_8B_s": small, "exchange_8B_s": swap_small,
                                    f"exchange_{large}B_s": swap_big}


_SERVER_SIZES = (8 << 20, 32 << 20)


def _server_link(engine, comm, shape: cost.Shape) -> tuple[cost.Link | None, dict]:
    """Fit the worker-server link (None where the job has no servers, or they all share rank 0's node):
    rank 0 pushes alone (``contributors=1``), the fastest of 3 calls per size."""
    from ..algorithms import ps

    lane = engine.context.servers
    if lane is None or not shape.servers:
        return None, {}
    one = dataclasses.replace(shape, node_of_rank=shape.node_of_rank[:1])
    factor, crosses = ps.link_bytes(1.0, one)
    if not crosses:
        return None, {}
    times = {}
    if comm.Get_rank() == 0:
        for nbytes in _SERVER_SIZES:
            buf = np.ones(nbytes // 4, np.float32)
            best = math.inf
            for call in range(4):  # the first one warms up
                start = time.perf_counter()
                handle = lane.client.push_pull_async(buf, f"calibrate.server.{nbytes}", contributors=1)
                lane.client.wait(handle)
                handle.result()
                if call:
                    best = min(best, time.perf_counter() - start)
            times[nbytes] = best
    times = comm.bcast(times, root=0)
    (a, ta), (b, tb) = sorted(times.items())
    beta = max(tb - ta, 1e-12) / ((b - a) * factor)
    alpha = max(0.0, (ta - a * factor * beta) / 2)
    return cost.Link(alpha, beta), {f"push_pull_1_worker_{n}B_s": t for n, t in times.items()}


def _kernels(comm) -> dict:
    """Seconds per float32 byte of each local kernel, on every rank at once; the slowest rank's."""
    n = _KERNEL_BYTES // 4
    a = np.ones(n, np.float32)
    b = np.ones(n, np.float32)
    rates = {}
    comm.Barrier()
    rates["reduce_s_per_byte"] = _median_time(lambda: kernels.reduce_(a, b, ReduceOp.SUM), 5) / a.nbytes
    rates["copy_s_per_byte"] = _median_time(lambda: np.copyto(a, b), 5) / a.nbytes
    for name in ("fp16", "bf16"):
        codec = getattr(Compression, name)
        wire = np.empty(n, codec.wire_dtype)
        enc = _median_time(lambda: codec.encode(b, wire), 5)
        dec = _median_time(lambda: codec.decode(wire, a), 5)
        rates[f"codec_{name}"] = (enc + dec) / 2 / a.nbytes
    keys = sorted(rates)
    slowest = np.array([rates[k] for k in keys])
    comm.Allreduce(_in_place(), slowest, op=_max_op())
    return dict(zip(keys, slowest.tolist()))


def _in_place():
    from mpi4py import MPI

    return MPI.IN_PLACE


def _max_op():
    from mpi4py import MPI

    return MPI.MAX


def _slowest_median(engine, comm, buf, algorithm: str, calls: int) -> float:
    """The median of ``calls`` in-place allreduces of ``buf`` by ``algorithm``, on the slowest rank (equal on
    every rank)."""
    comm.Barrier()
    median = _median_time(lambda: engine.allreduce_(buf, ReduceOp.SUM, algorithm=algorithm), calls)
    return comm.allreduce(median, op=_max_op())


def _times(engine, comm, algorithm: str, plan) -> dict[int, float]:
    """``{nbytes: _slowest_median}`` for each ``(nbytes, calls)`` of ``plan``, after a warm-up call each."""
    times = {}
    for nbytes, calls in plan:
        buf = np.ones(nbytes // 4 or 1, np.float32)
        engine.allreduce_(buf, ReduceOp.SUM, algorithm=algorithm)
        times[nbytes] = _slowest_median(engine, comm, buf, algorithm, calls)
    return times


def _native(engine, comm, model: cost.CostModel, shape: cost.Shape) -> tuple[float, float, dict]:
    """MPI's allreduce: (latency per log2 step, bandwidth factor, the raw times)."""
    p = shape.ranks
    raw = _times(engine, comm, "native", ((_SMALL, 200),) + tuple((s, 5) for s in _NATIVE_SIZES))
    steps = max(1, math.ceil(math.log2(p)))
    alpha = raw[_SMALL] / steps
    unit = dataclasses.replace(model, native_alpha_s=0.0, native_beta_factor=1.0, native_inter_beta_factor=1.0)
    xs = [cost.native(unit, n, shape) for n in _NATIVE_SIZES]
    ys = [raw[n] - alpha * steps for n in _NATIVE_SIZES]
    factor = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs) if any(xs) else 1.0
    return alpha, max(factor, 0.0), {str(k): v for k, v in raw.items()}


def _call_overhead(engine, comm, model: cost.CostModel, shape: cost.Shape) -> tuple[float, float]:
    """The fixed Python cost per call, from recursive doubling on 8 bytes (and that time)."""
    buf = np.ones(2, np.float32)
    for _ in range(20):
        engine.allreduce_(buf, ReduceOp.SUM, algorithm="recursive_doubling")
    t = _slowest_median(engine, comm, buf, "recursive_doubling", 300)
    predicted = cost.recursive_doubling(dataclasses.replace(model, call_s=0.0), buf.nbytes, shape)
    return max(t - predicted, 1e-6), t


def _cma(engine, comm, model: cost.CostModel, shape: cost.Shape) -> tuple[float, float, dict]:
    """The cma schedule: (fixed cost beyond its formula, factor on its bytes' time, the raw times)."""
    raw = _times(engine, comm, "cma", ((4 << 10, 200), (_KERNEL_BYTES, 5)))
    bare = dataclasses.replace(model, cma_alpha_s=0.0, cma_beta_factor=1.0)
    small, large = (cost.cma(bare, n, shape) for n in raw)
    alpha = max(raw[4 << 10] - small, 0.0)
    unit_bytes = large - cost.cma(dataclasses.replace(bare, copy_s_per_byte=0.0, reduce_s_per_byte=0.0),
                                  _KERNEL_BYTES, shape)
    factor = (raw[_KERNEL_BYTES] - alpha - (large - unit_bytes)) / unit_bytes if unit_bytes > 0 else 1.0
    return alpha, max(factor, 0.0), {str(k): v for k, v in raw.items()}


#: Sizes at which every algorithm is measured for the corrections (beyond the largest, its ratio holds).
_CORRECTION_SIZES = tuple((4 << 10) << (2 * k) for k in range(8))  # 4 KiB, 16 KiB, ..., 64 MiB
#: Rounds in which the algorithms take turns at one size, each round's time budget per algorithm, and the
#: most calls in one round.
_CORRECTION_ROUNDS = 5
_CORRECTION_BUDGET_S = 0.05
_CORRECTION_MAX_CALLS = 200


def _slowest_mean(engine, comm, buf, algorithm: str, calls: int) -> float:
    """Seconds per call over ``calls`` consecutive in-place allreduces of ``buf`` by ``algorithm`` after a
    barrier, on the slowest rank (equal on every rank): what ``commlib-bench`` times, and what a job pays,
    stalls included (a median call leaves out the occasional slow call that a mean keeps)."""
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        engine.allreduce_(buf, ReduceOp.SUM, algorithm=algorithm)
    return comm.allreduce((time.perf_counter() - start) / calls, op=_max_op())


def _interleaved(engine, comm, nbytes: int, algorithms: list[str]) -> dict[str, float]:
    """Seconds per call of each of ``algorithms`` on ``nbytes`` (in place), equal on every rank, timed as
    ``commlib-bench`` times them: the algorithms take turns in :data:`_CORRECTION_ROUNDS` rounds, each
    round starting with the next one (so that drift and position in a round land on all alike); per round
    the slowest rank's time per call, then the median over the rounds."""
    buf = np.ones(nbytes // 4, np.float32)
    calls = {}
    for name in algorithms:
        engine.allreduce_(buf, ReduceOp.SUM, algorithm=name)  # warm up, and how long one call takes
        comm.Barrier()
        start = time.perf_counter()
        engine.allreduce_(buf, ReduceOp.SUM, algorithm=name)
        once = comm.allreduce(time.perf_counter() - start, op=_max_op())
        calls[name] = max(1, min(_CORRECTION_MAX_CALLS, int(_CORRECTION_BUDGET_S / max(once, 1e-9))))
    rounds: dict[str, list[float]] = {name: [] for name in algorithms}
    for r in range(_CORRECTION_ROUNDS):
        for name in (algorithms[a] for a in turn_order(len(algorithms), r)):
            rounds[name].append(_slowest_mean(engine, comm, buf, name, calls[name]))
    return {name: statistics.median(times) for name, times in rounds.items()}


def _corrections(engine, comm, model: cost.CostModel, shape: cost.Shape) -> tuple[dict, dict]:
    """Per algorithm that can run here: {size: measured / predicted}, and the measured times."""
    seg = engine.config.ring_segment_bytes
    specs = select.candidates(engine.context, None)
    ratios: dict = {s.name: {} for s in specs}
    times: dict = {s.name: {} for s in specs}
    for nbytes in _CORRECTION_SIZES:
        predicted = {s.name: s.cost(model, nbytes, shape, None, seg) for s in specs}
        runnable = [name for name, t in predicted.items() if 0 < t < cost.INF]
        for name, measured in _interleaved(engine, comm, nbytes, runnable).items():
            ratios[name][str(nbytes)] = measured / predicted[name]
            times[name][str(nbytes)] = measured
    return comm.bcast(ratios, root=0), times


def calibrate(engine, comm) -> tuple[cost.CostModel, dict]:
    """Collective: measure, fit, and return (the model, the raw measurements); every rank returns the same."""
    topo = engine.topology
    shape = select.shape_of(engine.context)
    transport = engine.transport
    same_node = [r for r in range(topo.size) if r and topo.node_of_rank[r] == topo.node_of_rank[0]]
    other_node = [r for r in range(topo.size) if topo.node_of_rank[r] != topo.node_of_rank[0]]
    measured: dict = {}
    intra, measured["intra"] = _link(transport, comm, same_node[0] if same_node else None, 16 << 20, 10)
    inter, measured["inter"] = _link(transport, comm, other_node[0] if other_node else None, 4 << 20, 8)
    rates = _kernels(comm)
    measured["kernels"] = rates
    defaults = cost.DEFAULTS
    model = dataclasses.replace(
        defaults,
        intra=intra or defaults.intra,
        inter=inter or defaults.inter,
        reduce_s_per_byte=rates["reduce_s_per_byte"],
        copy_s_per_byte=rates["copy_s_per_byte"],
        codec_s_per_byte={"fp16": rates["codec_fp16"], "bf16": rates["codec_bf16"]},
        message_s=_message_cost(transport, comm, (same_node or other_node or [None])[0]),
        source="calibration")
    server, measured["server"] = _server_link(engine, comm, shape)
    model = dataclasses.replace(model, server=server or model.inter)
    if topo.size > 1:
        alpha, factor, measured["native"] = _native(engine, comm, model, shape)
        field = "native_inter_beta_factor" if shape.nodes > 1 else "native_beta_factor"
        model = dataclasses.replace(model, native_alpha_s=alpha, **{field: factor})
        call, measured["rd_8B_s"] = _call_overhead(engine, comm, model, shape)
        model = dataclasses.replace(model, call_s=call)
    if shape.cma:
        alpha, factor, measured["cma"] = _cma(engine, comm, model, shape)
        model = dataclasses.replace(model, cma_alpha_s=alpha, cma_beta_factor=factor)
    if topo.size > 1:
        corrections, measured["algorithms_s"] = _corrections(engine, comm, model, shape)
        model = dataclasses.replace(model, corrections=corrections, corrected_for=cost.layout_of(shape))
    measured["defaults_used_for"] = [name for name, link in (("intra", intra), ("inter", inter)) if link is None]
    return model, measured


def document(model: cost.CostModel, shape: cost.Shape, measured: dict, command: str) -> dict:
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return cost.profile_document(model, shape, command, date, measured)


def describe(model: cost.CostModel) -> list[str]:
    """``#`` lines with the model's parameters in readable units."""
    def link(name, l):
        return (f"# {name:<6} alpha {l.alpha_s * 1e6:8.1f} us   beta {1 / l.beta_s_per_byte / 1e9:8.3f} GB/s"
                if l.beta_s_per_byte else f"# {name:<6} alpha {l.alpha_s * 1e6:8.1f} us")

    def rate(s):
        return f"{1 / s / 1e9:.2f} GB/s" if s else "inf"
    codecs = ", ".join(f"{k} {rate(v)}" for k, v in model.codec_s_per_byte.items())
    return [f"# cost model ({model.source}):",
            link("intra", model.intra), link("inter", model.inter), link("server", model.server),
            f"# reduce {rate(model.reduce_s_per_byte)}, copy {rate(model.copy_s_per_byte)}, codecs: {codecs}",
            f"# per call {model.call_s * 1e6:.1f} us, per extra segment {model.message_s * 1e6:.1f} us; "
            f"native: {model.native_alpha_s * 1e6:.1f} us per log2(p) step, "
            f"{model.native_beta_factor:.2f} (one node) / {model.native_inter_beta_factor:.2f} (across nodes) x a "
            f"ring's transfer time; cma: +{model.cma_alpha_s * 1e6:.1f} us, "
            f"{model.cma_beta_factor:.2f} x its copy-and-reduce time"] + _describe_corrections(model)


def _describe_corrections(model: cost.CostModel) -> list[str]:
    if not model.corrections:
        return []
    lines = [f"# corrections (measured / formula) on node layout {model.corrected_for}:"]
    for name, by_size in model.corrections.items():
        lines.append(f"#   {name:<24} " + " ".join(f"{human_size(int(n))}:{r:.2f}" for n, r in by_size.items()))
    return lines
