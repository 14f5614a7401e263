"""The cost model ``auto`` minimises: alpha-beta-gamma per link class, and each algorithm's formula in it.

Parameters (:class:`CostModel`), all in seconds:

- ``intra``, ``inter``: a :class:`Link` per class - within a node (shared memory) and between nodes (one
  network link per node, shared by all its ranks). ``server``: the link between workers and summation
  servers (the ``ps`` algorithm; per node, shared by the node's workers and servers). A message of m bytes costs ``alpha + m * beta``; when
  s messages leave (or enter) one node at once over the inter-node link, each costs ``alpha + m * beta * s``.
- ``reduce_s_per_byte`` (gamma): ``dst = dst op src`` per byte of float32 ``dst``;
  ``copy_s_per_byte``: a memory copy per byte.
- ``codec_s_per_byte``: encoding (or decoding) float32 to a wire format, per float32 byte, per codec.
- ``message_s``: the extra cost of one more message inside a pipelined step (one more segment).
- ``call_s``: the fixed cost of a Python schedule per call (planning, scratch, the first posts).
- ``native_alpha_s``, ``native_beta_factor`` and ``native_inter_beta_factor``: MPI's own allreduce is a black
  box: ``native_alpha_s`` per log2(p) step, plus a factor times a ring's transfer time -
  ``native_beta_factor`` on one node (MPI's shared-memory allreduce copies through its own buffers),
  ``native_inter_beta_factor`` where the ranks span nodes (there MPI streams over the network as well as
  a ring does; docs/results/design_choices.md).
- ``cma_alpha_s`` and ``cma_beta_factor``: what the cma schedule costs beyond its formula (system calls and
  synchronisation per call, by default 25 us; its copies and reductions run on cache-sized segments,
  faster than the out-of-cache kernel rates): a fixed time, and a factor on its bytes' copy-and-reduce
  time.
- ``corrections``: per algorithm, measured time over the formula's at a few sizes (bytes, as strings),
  found by running each algorithm at calibration; :func:`correction` interpolates them (log-linear in
  the size, the nearest measured size beyond the ends). They hold for the node layout they were measured
  on (``corrected_for``, :func:`layout_of`), uncompressed; elsewhere the formulas stand alone. The
  formulas cannot see what the corrections catch: Python overheads that differ per schedule, cache
  effects, and how MPI's own allreduce is built.

A step of a schedule is a set of concurrent messages (pairs of ranks); its time is that of its slowest
message class: over the inter-node link if any pair crosses nodes (with the node sending the most
messages at once setting the contention), else within a node. Formulas follow the schedules in this
package (the docstrings of ring.py, hierarchical.py, ...) with ``node_of_rank`` deciding which steps cross.

The tuning profile (JSON, written by ``commlib-bench --calibrate``) holds the machine shape it was measured
on, these parameters, the command and the date. :func:`load_profile` reads ``COMMLIB_TUNING_FILE``, else
``$XDG_CACHE_HOME/commlib/tuning.json`` (default ``~/.cache/commlib/tuning.json``) if it exists, else the
model is :data:`DEFAULTS`. ``AlgorithmContext.create`` loads it on rank 0 and broadcasts it, so every rank
predicts - and ``auto`` chooses - alike.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ..errors import ConfigError
from . import partition

INF = float("inf")
PROFILE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Link:
    """A link class: ``alpha_s`` per message, ``beta_s_per_byte`` per byte."""

    alpha_s: float
    beta_s_per_byte: float

    def time(self, nbytes: float, streams: int = 1) -> float:
        return self.alpha_s + nbytes * self.beta_s_per_byte * max(streams, 1)


@dataclasses.dataclass(frozen=True)
class CostModel:
    """The fitted (or default) parameters; see the module docstring."""

    intra: Link = Link(5e-6, 1 / 7e9)
    inter: Link = Link(50e-6, 1 / 1.25e9)  # 10 Gbit/s Ethernet
    server: Link = Link(50e-6, 1 / 1.25e9)  # as inter until --calibrate measures it
    reduce_s_per_byte: float = 1 / 10e9
    copy_s_per_byte: float = 1 / 10e9
    codec_s_per_byte: Mapping[str, float] = dataclasses.field(
        default_factory=lambda: {"fp16": 1 / 9e9, "bf16": 1 / 9e9})
    message_s: float = 5e-6
    call_s: float = 5e-6
    native_alpha_s: float = 7e-6
    native_beta_factor: float = 2.5
    native_inter_beta_factor: float = 1.0
    cma_alpha_s: float = 25e-6
    cma_beta_factor: float = 1.0
    corrections: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    corrected_for: str = ""
    source: str = "defaults"

    def codec_rate(self, codec) -> float:
        if codec is None:
            return 0.0
        return self.codec_s_per_byte.get(codec.name, max(self.codec_s_per_byte.values(), default=0.0))

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["codec_s_per_byte"] = dict(self.codec_s_per_byte)
        data["corrections"] = {name: dict(by_size) for name, by_size in self.corrections.items()}
        data.pop("source")
        return data

    @classmethod
    def from_json(cls, data: Mapping, source: str) -> "CostModel":
        known = {f.name for f in dataclasses.fields(cls)} - {"source"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"tuning profile {source}: unknown parameter(s) {', '.join(unknown)}; "
                              "recreate it with commlib-bench --calibrate")
        values = dict(data)
        try:
            for key in ("intra", "inter", "server"):
                if key in values:
                    values[key] = Link(**values[key])
            values["codec_s_per_byte"] = dict(values.get("codec_s_per_byte", DEFAULTS.codec_s_per_byte))
            values["corrections"] = {str(name): {str(int(size)): float(ratio) for size, ratio in by_size.items()}
                                     for name, by_size in values.get("corrections", {}).items()}
            model = cls(**values, source=source)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"tuning profile {source}: {exc}; recreate it with commlib-bench --calibrate") from None
        for name, value in _numbers(model):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    value >= 0 and math.isfinite(value)):
                raise ConfigError(f"tuning profile {source}: {name} = {value!r} must be a finite number >= 0")
        return model


def _numbers(model: CostModel) -> Iterable[tuple[str, float]]:
    for field in dataclasses.fields(model):
        value = getattr(model, field.name)
        if isinstance(value, Link):
            yield f"{field.name}.alpha_s", value.alpha_s
            yield f"{field.name}.beta_s_per_byte", value.beta_s_per_byte
        elif isinstance(value, Mapping):
            for key, rate in value.items():
                if isinstance(rate, Mapping):  # corrections: algorithm -> size -> ratio
                    for size, ratio in rate.items():
                        yield f"{field.name}.{key}.{size}", ratio
                else:
                    yield f"{field.name}.{key}", rate
        elif field.name not in ("source", "corrected_for"):
            yield field.name, value


#: The model without a profile (docs/algorithms.md lists the values and where they come from).
DEFAULTS = CostModel()


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the formulas need of a job: which node each rank is on, whether cma can run, the torus grid."""

    node_of_rank: tuple[int, ...]
    cma: bool = False
    torus: tuple[int, int] | None = None  # (X, Y) with rank = y * X + x; None: torus2d cannot run
    small_message_bytes: int = 128 << 10  # hierarchical's switch to recursive doubling across nodes
    #: the node of each summation server (numbered as ``node_of_rank``: a server beside a worker has that
    #: worker's node, one on a host of its own a number no worker has); empty: no servers (``ps`` cannot run)
    servers: tuple[int, ...] = ()
    server_partition_bytes: int = 4096000  # push_pull's partition size (COMMLIB_SERVER_PARTITION)
    server_depth: int = 16  # partitions per server of a large tensor (commlib.server.protocol.partitions)
    server_host_reduce: str = "auto"  # ps: reduce inside each node first (COMMLIB_SERVER_HOST_REDUCE)

    @property
    def ranks(self) -> int:
        return len(self.node_of_rank)

    @property
    def nodes(self) -> int:
        return len(set(self.node_of_rank))

    def node_groups(self) -> list[list[int]]:
        groups: dict[int, list[int]] = {}
        for rank, node in enumerate(self.node_of_rank):
            groups.setdefault(node, []).append(rank)
        return [groups[node] for node in sorted(groups)]

    @classmethod
    def blocks(cls, nodes: int, per_node: int, **kw) -> "Shape":
        """``nodes`` nodes of ``per_node`` consecutive ranks (for predictions at other scales)."""
        torus = kw.pop("torus", (per_node, nodes))
        return cls(tuple(r // per_node for r in range(nodes * per_node)), torus=torus, **kw)


# -- steps ----------------------------------------------------------------------------------------------
def _step(model: CostModel, shape: Shape, pairs: Sequence[tuple[int, int]], nbytes: float) -> float:
    """Concurrent messages of ``nbytes`` from ``src`` to ``dst``: the slowest class's time."""
    if not pairs:
        return 0.0
    node = shape.node_of_rank
    out: dict[int, int] = {}
    into: dict[int, int] = {}
    for src, dst in pairs:
        if node[src] != node[dst]:
            out[node[src]] = out.get(node[src], 0) + 1
            into[node[dst]] = into.get(node[dst], 0) + 1
    if out:
        return model.inter.time(nbytes, max(max(out.values()), max(into.values())))
    return model.intra.time(nbytes)


def _crosses(shape: Shape, pairs: Sequence[tuple[int, int]]) -> bool:
    node = shape.node_of_rank
    return any(node[a] != node[b] for a, b in pairs)


def _pipelined(model: CostModel, shape: Shape, pairs, wire_bytes: float, data_bytes: float, seg: int,
               reduces: bool) -> float:
    """One pipelined ring step: ``wire_bytes`` per message in segments of ``seg`` data bytes, reducing
    ``data_bytes`` on arrival. Across nodes the reduction of a segment overlaps the next one's transfer
    (only the last segment's is exposed); within a node both compete for memory and add up."""
    nseg = max(1, math.ceil(data_bytes / seg)) if seg else 1
    t = _step(model, shape, pairs, wire_bytes) + (nseg - 1) * model.message_s
    if reduces:
        exposed = min(data_bytes, seg) if seg and _crosses(shape, pairs) else data_bytes
        t += exposed * model.reduce_s_per_byte
    return t


def _ring_half(model: CostModel, shape: Shape, groups: Sequence[Sequence[int]], nbytes: float, codec,
               seg: int, reduces: bool) -> float:
    """A reduce-scatter (``reduces``) or an allgather of ``nbytes`` around each ring of ``groups`` at once."""
    p = max((len(g) for g in groups), default=1)
    if p < 2 or nbytes <= 0:
        return 0.0
    pairs = [(g[i], g[(i + 1) % len(g)]) for g in groups if len(g) > 1 for i in range(len(g))]
    chunk = nbytes / p
    wire = chunk * (0.5 if codec is not None else 1.0)
    if codec is not None:
        seg = seg // 16 * 4 if seg else 0  # a codec's segments hold ring_segment_bytes / 16 elements
    # the uncompressed allgather moves whole chunks (one sendrecv per step), the other steps segments
    step = _pipelined(model, shape, pairs, wire, chunk, seg if reduces or codec is not None else 0, reduces)
    codec_t = 2 * chunk * model.codec_rate(codec) if codec is not None else 0.0  # encode + decode per step
    return (p - 1) * (step + codec_t)


def _ring(model, shape, groups, nbytes, codec, seg) -> float:
    return (_ring_half(model, shape, groups, nbytes, codec, seg, True)
            + _ring_half(model, shape, groups, nbytes, codec, seg, False))


def rings(model: CostModel, shape: Shape, groups: Sequence[Sequence[int]], nbytes: float, codec=None,
          seg: int = 1 << 20) -> float:
    """A ring allreduce of ``nbytes`` around each ring of ``groups`` at once, without a call's fixed cost
    (what another schedule runs inside the nodes: ps's reduction in the hosts)."""
    return _ring(model, shape, groups, nbytes, codec, seg)


def _fold_pairs(p: int) -> tuple[int, int, list[tuple[int, int]]]:
    pof2 = 1 << (p.bit_length() - 1)
    rem = p - pof2
    return pof2, rem, [(2 * i, 2 * i + 1) for i in range(rem)]


def _real(newrank: int, rem: int) -> int:
    return newrank * 2 + 1 if newrank < rem else newrank + rem


def _butterfly(pof2: int, rem: int, mask: int) -> list[tuple[int, int]]:
    return [(_real(i, rem), _real(i ^ mask, rem)) for i in range(pof2)]


# -- the formulas, one per algorithm ----------------------------------------------------------------------
def native(model: CostModel, nbytes: float, shape: Shape, codec=None, seg: int = 0) -> float:
    """MPI's allreduce: fitted latency per log2(p) step (across nodes at least the network's) plus a fitted
    multiple of a ring's transfer time (one factor on one node, another across nodes), never below the link bound across nodes (a factor fitted below 1 on a few nodes, where MPI's own
    schedule keeps part of the ring's traffic inside a node, would otherwise beat the bound at scale)."""
    p = shape.ranks
    if codec is not None:
        return INF
    if p < 2 or nbytes <= 0:
        return 0.0
    pairs = [(r, (r + 1) % p) for r in range(p)]
    per_step = _step(model, shape, pairs, nbytes / p) - _step(model, shape, pairs, 0.0)
    if shape.nodes > 1:  # across nodes every step waits for the network at least once
        alpha, factor = max(model.native_alpha_s, model.inter.alpha_s), model.native_inter_beta_factor
    else:
        alpha, factor = model.native_alpha_s, model.native_beta_factor
    fitted = alpha * math.ceil(math.log2(p)) + factor * 2 * (p - 1) * per_step
    beta = model.inter.beta_s_per_byte
    return max(fitted, link_bound(nbytes, shape.nodes, 1 / beta)) if beta > 0 else fitted


def ring(model: CostModel, nbytes: float, shape: Shape, codec=None, seg: int = 1 << 20) -> float:
    """2(p-1) pipelined steps of n/p bytes; (p-1)/p n reduced."""
    if shape.ranks < 2 or nbytes <= 0:
        return 0.0
    return model.call_s + _ring(model, shape, [list(range(shape.ranks))], nbytes, codec, seg)


def recursive_doubling(model: CostModel, nbytes: float, shape: Shape, codec=None, seg: int = 0) -> float:
    """log2(p') exchanges of the whole buffer, each reduced; fold and unfold when p is not a power of 2."""
    p = shape.ranks
    if p < 2 or nbytes <= 0:
        return 0.0
    pof2, rem, fold = _fold_pairs(p)
    wire = nbytes * (0.5 if codec is not None else 1.0)
    per = nbytes * model.reduce_s_per_byte + (3 * nbytes * model.codec_rate(codec))  # reduce, round trip
    t = model.call_s
    if rem:
        t += 2 * _step(model, shape, fold, wire) + per
    mask = 1
    while mask < pof2:
        t += _step(model, shape, _butterfly(pof2, rem, mask), wire) + per
        mask <<= 1
    return t


def rabenseifner(model: CostModel, nbytes: float, shape: Shape, codec=None, seg: int = 1 << 20) -> float:
    """Recursive halving (n/2, n/4, ... reduced) then recursive doubling back, on p' ranks after a fold."""
    p = shape.ranks
    if p < 2 or nbytes <= 0:
        return 0.0
    pof2, rem, fold = _fold_pairs(p)
    ratio = 0.5 if codec is not None else 1.0
    t = model.call_s
    if rem:
        t += 2 * _step(model, shape, fold, nbytes * ratio) + nbytes * model.reduce_s_per_byte
    mask = pof2 >> 1
    while mask:
        part = nbytes * mask / pof2
        pairs = _butterfly(pof2, rem, mask)
        t += _pipelined(model, shape, pairs, part * ratio, part, seg, True)  # the halving step
        t += _step(model, shape, pairs, part * ratio)  # its doubling step on the way back
        t += 5 * part * model.codec_rate(codec)  # encode, widened accumulate, round trip (2), decode
        mask >>= 1
    return t


def codec_inside_nodes(node_count: int, codec):
    """The codec of the hierarchical schedules' phases inside a node: none where there are nodes to cross
    (only what crosses is encoded; see :mod:`.hierarchical`), the codec itself on a single node. The one
    rule the schedules (``hierarchical.intra_codec``) and their formulas here both read."""
    return codec if node_count == 1 else None


def hierarchical(model: CostModel, nbytes: float, shape: Shape, codec=None, seg: int = 1 << 20) -> float:
    """Ring reduce-scatter in each node, allreduce of each of the L shards across nodes (L at once over
    each node's link), ring allgather in each node."""
    if shape.ranks < 2 or nbytes <= 0:
        return 0.0
    nodes = shape.node_groups()
    width = max(len(g) for g in nodes)
    shards = [[g[j] for g in nodes if j < len(g)] for j in range(width)]
    shard_bytes = nbytes / width
    if shard_bytes <= shape.small_message_bytes:
        cross = _rd_groups(model, shape, shards, shard_bytes, codec)
    else:
        cross = _ring(model, shape, shards, shard_bytes, codec, seg)
    inside = codec_inside_nodes(len(nodes), codec)
    return (model.call_s + _ring_half(model, shape, nodes, nbytes, inside, seg, True) + cross
            + _ring_half(model, shape, nodes, nbytes, inside, seg, False))


def hierarchical_pipelined(model: CostModel, nbytes: float, shape: Shape, codec=None,
                           seg: int = 1 << 20) -> float:
    """hierarchical's phases on blocks (:func:`.partition.pipeline_block_bytes`), block b's cross-node rings
    overlapping block b+1's reduce-scatter and block b-1's allgather: per block the slower of the two, plus
    one block's other."""
    if shape.ranks < 2 or nbytes <= 0:
        return 0.0
    nodes = shape.node_groups()
    width = max(len(g) for g in nodes)
    shards = [[g[j] for g in nodes if j < len(g)] for j in range(width)]
    block = min(nbytes, partition.pipeline_block_bytes(seg))
    count = math.ceil(nbytes / block)
    codec_inside = codec_inside_nodes(len(nodes), codec)
    inside = (_ring_half(model, shape, nodes, block, codec_inside, seg, True)
              + _ring_half(model, shape, nodes, block, codec_inside, seg, False))
    cross = _ring(model, shape, shards, block / width, codec, 0)
    return model.call_s + count * max(inside, cross) + min(inside, cross)


def _rd_groups(model, shape, groups, nbytes, codec) -> float:
    """Recursive doubling in every group of ``groups`` at once (their sizes may differ: the largest counts)."""
    p = max(len(g) for g in groups)
    if p < 2:
        return 0.0
    pof2, rem, fold = _fold_pairs(p)
    wire = nbytes * (0.5 if codec is not None else 1.0)
    per = nbytes * model.reduce_s_per_byte + 3 * nbytes * model.codec_rate(codec)

    def pairs_of(local_pairs):
        return [(g[a], g[b]) for g in groups for a, b in local_pairs if a < len(g) and b < len(g)]
    t = 2 * _step(model, shape, pairs_of(fold), wire) + per if rem else 0.0
    mask = 1
    while mask < pof2:
        t += _step(model, shape, pairs_of(_butterfly(pof2, rem, mask)), wire) + per
        mask <<= 1
    return t


def torus2d(model: CostModel, nbytes: float, shape: Shape, codec=None, seg: int = 1 << 20) -> float:
    """Ring reduce-scatter along rows (X ranks), ring allreduce of n/X along columns, allgather along rows."""
    if shape.torus is None:
        return INF
    if shape.ranks < 2 or nbytes <= 0:
        return 0.0
    nx, ny = shape.torus
    rows = [[y * nx + x for x in range(nx)] for y in range(ny)]
    cols = [[y * nx + x for y in range(ny)] for x in range(nx)]
    return (model.call_s + _ring_half(model, shape, rows, nbytes, codec, seg, True)
            + _ring(model, shape, cols, nbytes / nx, codec, seg)
            + _ring_half(model, shape, rows, nbytes, codec, seg, False))


def cma(model: CostModel, nbytes: float, shape: Shape, codec=None, seg: int = 0) -> float:
    """One node: each rank copies its share from p-1 peers, reduces it and writes it back into them; two
    allgathers of a few bytes synchronise."""
    p = shape.ranks
    if not shape.cma or shape.nodes > 1:
        return INF
    if p < 2 or nbytes <= 0:
        return 0.0
    moved = nbytes * (p - 1) / p
    sync = 2 * math.ceil(math.log2(p)) * model.intra.alpha_s
    # each of the p contributions to the share and the result are rounded, on a segment in cache (half the
    # cost of a conversion pass through memory)
    rounding = 0.5 * (p + 1) * nbytes / p * model.codec_rate(codec)
    work = moved * (2 * model.copy_s_per_byte + model.reduce_s_per_byte)
    return model.call_s + sync + model.cma_alpha_s + model.cma_beta_factor * work + rounding


def layout_of(shape: Shape) -> str:
    """The node layout corrections are measured on: ranks per node, in node order (``"2,2"``), and with
    summation servers, their nodes (``"1,1,1,1+servers:4,5,6,7"``)."""
    layout = ",".join(str(len(group)) for group in shape.node_groups())
    if shape.servers:
        layout += "+servers:" + ",".join(str(n) for n in shape.servers)
    return layout


def correction(model: CostModel, algorithm: str, nbytes: float, shape: Shape) -> float:
    """The calibration's measured-over-predicted ratio for ``algorithm`` at ``nbytes`` on ``shape``, or 1."""
    by_size = model.corrections.get(algorithm)
    if not by_size or nbytes <= 0 or model.corrected_for != layout_of(shape):
        return 1.0
    points = sorted((int(size), ratio) for size, ratio in by_size.items())
    if nbytes <= points[0][0]:
        return points[0][1]
    for (a, ra), (b, rb) in zip(points, points[1:]):
        if nbytes <= b:
            w = math.log(nbytes / a) / math.log(b / a)
            return ra + w * (rb - ra)
    return points[-1][1]


def link_bound(nbytes: float, nodes: int, link_bytes_per_s: float, codec=None) -> float:
    """The physical bound across nodes: each node's link must carry 2(n-1)/n of the (wire) buffer each way."""
    if nodes < 2:
        return 0.0
    wire = nbytes * (0.5 if codec is not None else 1.0)
    return 2 * (nodes - 1) / nodes * wire / link_bytes_per_s


# -- the tuning profile -----------------------------------------------------------------------------------
def default_profile_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/commlib/tuning.json``, XDG_CACHE_HOME defaulting to ``~/.cache``."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "commlib" / "tuning.json"


def profile_path(setting: str | None) -> Path | None:
    """The profile to load for ``Config.tuning_file``: that file, none for ``none``, else the default
    location if a profile exists there."""
    if setting is not None:
        return None if setting.strip().lower() == "none" else Path(setting).expanduser()
    default = default_profile_path()
    return default if default.is_file() else None


def read_profile(path: Path) -> dict:
    """The JSON document at ``path``, checked: a clear error for a missing, unreadable or foreign file."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"tuning profile {path} does not exist; create it with commlib-bench --calibrate "
                          "-o FILE, or unset COMMLIB_TUNING_FILE (COMMLIB_TUNING_FILE=none: no profile)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"tuning profile {path} cannot be read: {exc}; recreate it with "
                          "commlib-bench --calibrate") from None
    if not isinstance(data, dict) or data.get("version") != PROFILE_VERSION or "model" not in data:
        raise ConfigError(f"{path} is not a commlib tuning profile of version {PROFILE_VERSION}; recreate it "
                          "with commlib-bench --calibrate")
    return data


def model_from_profile(data: Mapping, source: str) -> CostModel:
    return CostModel.from_json(data["model"], source)


def profile_document(model: CostModel, shape: Shape, command: str, date: str, measurements: Mapping) -> dict:
    """The JSON document ``commlib-bench --calibrate`` writes."""
    return {
        "version": PROFILE_VERSION,
        "command": command,
        "date": date,
        "shape": {"ranks": shape.ranks, "nodes": shape.nodes,
                  "node_sizes": [len(g) for g in shape.node_groups()]},
        "model": model.to_json(),
        "measurements": dict(measurements),
    }


def write_profile(path: Path, document: Mapping) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    tmp.replace(path)  # readers never see half a profile
