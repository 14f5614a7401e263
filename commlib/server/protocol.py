"""What workers and summation servers say to each other, and the one rule that places a partition.

Nothing here imports MPI. Every message between workers and servers is fixed binary fields, one
:class:`Layout` per message kind below, decoded by bounds-checked ``struct`` reads: nothing that arrives
from a peer is ever unpickled, a message is at most its layout's ``max_size`` bytes, and the values that
follow a header are at most ``MAX_PUSH_BYTES`` (so a hostile or corrupt header can neither run code nor
make its receiver allocate without bound; :class:`ProtocolError` says what was wrong). The same messages
travel over both data planes: over MPI, each on its tag below, on the job's own duplicate of the user's
communicator (:mod:`.discovery`); over TCP (:mod:`.tcp`), each in a frame of its kind.

push_pull, for one partition of one key:

1. the worker sends a :class:`Push` header (``TAG_PUSH``), then the partition's values (already in the wire
   dtype, or a lossy compressor's payload) on tag ``push.slot``, a tag the worker chose that no other of its
   messages in flight uses (over TCP: one frame, the header then the values);
2. once every contributor has pushed that key's round, the server answers every contributor with the same
   reduced bytes on the same ``slot`` tag (over TCP: an :class:`Answer` frame, then the values); a round
   that cannot be reduced (the contributors declared it differently, or a push was malformed) is answered
   with a :class:`Refusal` (``TAG_ERROR``) instead, and the worker cancels its receive.

``TAG_BYE`` (worker -> server, an empty message): the worker's runtime shut down; a server drops the rounds
still open once every worker has said it. ``TAG_EXIT`` (worker -> server, empty): the worker's process is
exiting; a server exits once every worker has sent it.

Geo-SGD (:mod:`.geo`, :mod:`.geo_client`; over MPI only): a :class:`GeoMessage` on ``TAG_GEO`` (its values,
if any, follow on ``TAG_GEO_DATA``), answered by a :class:`GeoReply` on ``TAG_GEO_REPLY`` (with the values
on ``TAG_GEO_VALUES``). MPI does not overtake on one tag between two processes, so each header's values
are the next message on the data tag from the same sender.

The job's start (:mod:`.discovery`): every process's :class:`Report` and every server's
:class:`Listening` go to rank 0, which answers each with a :func:`pack_table` of them all.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import itertools
import struct
import zlib
from typing import ClassVar

from ..compression.pushed import ONEBIT, SPARSE
from ..dtypes import TABLE
from ..ops import ReduceOp

TAG_PUSH = 1
TAG_ERROR = 2
TAG_BYE = 3
TAG_EXIT = 4
#: Geo-SGD: a GeoMessage header (worker -> server), its values, the answer's GeoReply and its values. Fixed
#: tags, matched in order per sender (MPI does not overtake on one tag).
TAG_GEO, TAG_GEO_DATA, TAG_GEO_REPLY, TAG_GEO_VALUES = 12, 13, 14, 15
#: Slot tags start here (below: the control tags above).
FIRST_SLOT = 16

#: The largest ``COMMLIB_SERVER_PARTITION`` a worker may use: what a server accepts in one push is bounded
#: by it (:data:`MAX_PUSH_BYTES`), whatever a header declares.
MAX_PARTITION_BYTES = 256 << 20
#: The most bytes one push (or one Geo-SGD message's values) may carry: a partition holds at most
#: ``COMMLIB_SERVER_PARTITION`` bytes plus a few elements (:func:`bounds`' ramp rounds its middle partitions up).
MAX_PUSH_BYTES = MAX_PARTITION_BYTES + 4096
#: The longest tensor or table name (UTF-8 bytes) that goes to the servers.
MAX_KEY_BYTES = 1024
#: The longest text in a refusal or a Geo-SGD reply (longer texts are cut).
MAX_TEXT_BYTES = 4096
#: The dtypes push_pull carries (every reducible dtype but bool), by their code on the wire.
WIRE_DTYPES = tuple(row.name for row in TABLE if row.kind != "bool")
#: The payload formats of a lossy compressor's push (:mod:`commlib.compression.pushed`); "" is dense.
CODECS = ("", SPARSE, ONEBIT)
#: Geo-SGD tables' dtypes.
GEO_DTYPES = ("float32", "float64")


class ProtocolError(ValueError):
    """A message that is not what the protocol allows here: the wrong kind or length, a field out of
    range, text that is not UTF-8. Its receiver drops it (and, over TCP, the connection it came on)."""


@dataclasses.dataclass(frozen=True)
class Text:
    """A UTF-8 field of at most ``limit`` bytes (its length travels in the fixed part)."""

    limit: int


@dataclasses.dataclass(frozen=True)
class Choice:
    """A field that is one of ``options`` (its index travels as one byte)."""

    options: tuple[str, ...]


class Layout:
    """The binary form of one message kind: a byte naming the kind, the fields in order (``struct``
    format characters for numbers and fixed bytes, :class:`Choice` as an index, :class:`Text` as a
    length), then the texts' bytes. :meth:`unpack` accepts exactly that and nothing else."""

    def __init__(self, kind: int, fields: tuple[tuple[str, object], ...]):
        self.kind = kind
        self.names = tuple(name for name, _ in fields)
        self.specs = tuple(spec for _, spec in fields)
        codes = "".join("H" if isinstance(s, Text) else "B" if isinstance(s, Choice) else s for s in self.specs)
        self.fixed = struct.Struct("<B" + codes)
        self.max_size = self.fixed.size + sum(s.limit for s in self.specs if isinstance(s, Text))

    def pack(self, message) -> bytes:
        values, texts = [], []
        for name, spec in zip(self.names, self.specs):
            value = getattr(message, name)
            if isinstance(spec, Text):
                raw = value.encode()
                if len(raw) > spec.limit:
                    raise ProtocolError(f"{type(message).__name__}.{name} is {len(raw)} bytes of UTF-8; the "
                                        f"servers take at most {spec.limit}")
                texts.append(raw)
                values.append(len(raw))
            elif isinstance(spec, Choice):
                if value not in spec.options:
                    raise ProtocolError(f"{type(message).__name__}.{name} {value!r} is not one of {spec.options}")
                values.append(spec.options.index(value))
            else:
                values.append(value)
        try:
            return self.fixed.pack(self.kind, *values) + b"".join(texts)
        except struct.error as exc:
            raise ProtocolError(f"{type(message).__name__}: a field does not fit its binary form ({exc})") from None

    def unpack(self, data, what: str) -> dict:
        """The fields of ``data`` (bytes-like), which must be one whole message of this kind; ``what``
        names the message kind in errors."""
        data = bytes(data)
        if len(data) < self.fixed.size:
            raise ProtocolError(f"a {what} of {len(data)} bytes is shorter than its {self.fixed.size}-byte fixed part")
        kind, *raw = self.fixed.unpack_from(data)
        if kind != self.kind:
            raise ProtocolError(f"a message of kind {kind} where a {what} (kind {self.kind}) belongs")
        fields, at = {}, self.fixed.size
        for name, spec, value in zip(self.names, self.specs, raw):
            if isinstance(spec, Text):
                if value > spec.limit:
                    raise ProtocolError(f"a {what}'s {name} declares {value} bytes, more than its {spec.limit}")
                chunk = data[at:at + value]
                at += value
                if len(chunk) != value:
                    raise ProtocolError(f"a {what} of {len(data)} bytes is cut short in its {name}")
                try:
                    fields[name] = chunk.decode()
                except UnicodeDecodeError:
                    raise ProtocolError(f"a {what}'s {name} is not UTF-8") from None
            elif isinstance(spec, Choice):
                if value >= len(spec.options):
                    raise ProtocolError(f"a {what}'s {name} is code {value}, not one of {len(spec.options)}")
                fields[name] = spec.options[value]
            else:
                fields[name] = value
        if at != len(data):
            raise ProtocolError(f"a {what} of {len(data)} bytes carries {len(data) - at} bytes past its fields")
        return fields


class Message:
    """A message kind with a :class:`Layout` (``LAYOUT``): :meth:`encode`, :meth:`decode` (which also
    runs :meth:`check`, the rules on the values that the layout alone does not state)."""

    LAYOUT: ClassVar[Layout]

    def encode(self) -> bytes:
        return self.LAYOUT.pack(self)

    @classmethod
    def decode(cls, data):
        message = cls(**cls.LAYOUT.unpack(data, cls.__name__))
        message.check()
        return message

    def check(self) -> None:
        """Raise :class:`ProtocolError` when a field's value is out of what the protocol allows."""


def cut(text: str, limit: int = MAX_TEXT_BYTES) -> str:
    """``text`` shortened to at most ``limit`` bytes of UTF-8 (on a character boundary)."""
    raw = text.encode()
    return text if len(raw) <= limit else raw[:limit - 3].decode(errors="ignore") + "..."


@dataclasses.dataclass(frozen=True)
class Push(Message):
    """One partition's header. ``key`` names the tensor (equal on every contributor), ``part`` the
    partition, ``total`` the tensor's element count (so that a size mismatch shows in every partition),
    ``wire`` the dtype name on the wire, ``count`` the partition's elements, ``op`` the kernel ReduceOp's
    value, ``contributors`` how many workers push this key (the process set's size), ``worker`` the
    sender's rank among the workers, ``slot`` the tag of its data and of the answer. ``codec``: empty, or
    the format of a lossy compressor's payload of ``nbytes`` bytes (:mod:`commlib.compression.pushed`),
    which the server decodes to ``count`` float32 values; the answer is then dense ``wire`` values."""

    key: str
    part: int
    total: int
    wire: str
    count: int
    op: int
    contributors: int
    worker: int
    slot: int
    codec: str = ""
    nbytes: int = 0

    LAYOUT: ClassVar[Layout] = Layout(2, (
        ("key", Text(MAX_KEY_BYTES)), ("part", "I"), ("total", "Q"), ("wire", Choice(WIRE_DTYPES)), ("count", "Q"),
        ("op", "B"), ("contributors", "I"), ("worker", "I"), ("slot", "I"), ("codec", Choice(CODECS)),
        ("nbytes", "Q")))

    def check(self) -> None:
        if self.op not in _OPS:
            raise ProtocolError(f"push {self.key!r}: op {self.op} is not a reduction")
        if not self.contributors or self.count > self.total or self.slot < FIRST_SLOT:
            raise ProtocolError(f"push {self.key!r} partition {self.part}: {self.contributors} contributors, "
                                f"{self.count} of {self.total} elements, slot {self.slot}")
        dense = self.count * (4 if self.codec else _ITEMSIZE[self.wire])  # what the server holds for it
        if self.data_bytes > MAX_PUSH_BYTES or dense > MAX_PUSH_BYTES:
            raise ProtocolError(f"push {self.key!r} partition {self.part}: {self.count} elements in "
                                f"{self.data_bytes} bytes exceed a push's {MAX_PUSH_BYTES} bytes")

    @property
    def data_bytes(self) -> int:
        """The bytes of values that follow this header."""
        return self.nbytes if self.codec else self.count * _ITEMSIZE[self.wire]

    def declaration(self) -> tuple:
        """What every contributor must declare alike."""
        return (self.total, self.wire, self.count, self.op, self.contributors, self.codec)

    def describe(self) -> str:
        codec = f" ({self.codec}-compressed)" if self.codec else ""
        return (f"{self.wire}[{self.total}]{codec} {ReduceOp(self.op).name.lower()} among {self.contributors} "
                "workers")


_ITEMSIZE = {row.name: row.numpy.itemsize for row in TABLE}
_OPS = frozenset(int(op) for op in ReduceOp)


@dataclasses.dataclass(frozen=True)
class Answer(Message):
    """Over TCP, the header of a server's answer: the push's ``slot``; the reduced values follow."""

    slot: int

    LAYOUT: ClassVar[Layout] = Layout(3, (("slot", "I"),))


@dataclasses.dataclass(frozen=True)
class Refusal(Message):
    """A server's refusal of the round that the push on ``slot`` belongs to, and why."""

    slot: int
    text: str

    LAYOUT: ClassVar[Layout] = Layout(4, (("slot", "I"), ("text", Text(MAX_TEXT_BYTES))))


@dataclasses.dataclass(frozen=True)
class Hello(Message):
    """A TCP connection's introduction, either way: the job's ``token`` (16 hex digits: a connection that
    reached another process is told apart) and the sender's index (a worker's, or the server's)."""

    token: bytes
    index: int

    LAYOUT: ClassVar[Layout] = Layout(1, (("token", "16s"), ("index", "q")))


#: What a Geo-SGD message asks (:mod:`.geo`).
GEO_KINDS = ("open", "push", "pull", "leave")
#: What a Geo-SGD reply says.
GEO_REPLIES = ("values", "waiting", "error")


@dataclasses.dataclass(frozen=True)
class GeoMessage(Message):
    """A worker's message about partition ``part`` of table ``key``: ``kind`` (open, push, pull, leave);
    ``total``/``count``/``dtype``: the table's and this partition's element counts and dtype;
    ``staleness``: the bound in rounds (-1: unbounded); ``round``: the push's round (from 1)."""

    kind: str
    key: str
    part: int
    total: int
    count: int
    dtype: str
    staleness: int
    worker: int
    round: int = 0

    LAYOUT: ClassVar[Layout] = Layout(5, (
        ("kind", Choice(GEO_KINDS)), ("key", Text(MAX_KEY_BYTES)), ("part", "I"), ("total", "Q"), ("count", "Q"),
        ("dtype", Choice(GEO_DTYPES)), ("staleness", "q"), ("worker", "I"), ("round", "Q")))

    def check(self) -> None:
        if self.count > self.total or self.staleness < -1 or self.data_bytes > MAX_PUSH_BYTES:
            raise ProtocolError(f"Geo-SGD {self.kind} {self.key!r} partition {self.part}: {self.count} of "
                                f"{self.total} {self.dtype} elements, staleness {self.staleness}")

    @property
    def data_bytes(self) -> int:
        """The bytes of values this message's values message carries (none for pull and leave)."""
        return self.count * _ITEMSIZE[self.dtype] if self.kind in ("open", "push") else 0

    def declaration(self) -> tuple:
        return (self.total, self.count, self.dtype, self.staleness)

    def describe(self) -> str:
        bound = "unbounded" if self.staleness < 0 else str(self.staleness)
        return f"{self.dtype}[{self.total}] (partition of {self.count}), staleness {bound}"


@dataclasses.dataclass(frozen=True)
class GeoReply(Message):
    """A server's answer about partition ``part`` of ``key`` to one worker: ``kind`` values (the values
    follow: ``nbytes`` of them), waiting (``text`` names whom it waits for) or error (``text``); ``round``
    echoes the push's; ``slowest``: the lowest clock among the workers that have not left, when answered."""

    kind: str
    key: str
    part: int
    round: int = 0
    slowest: int = 0
    text: str = ""
    nbytes: int = 0

    LAYOUT: ClassVar[Layout] = Layout(6, (
        ("kind", Choice(GEO_REPLIES)), ("key", Text(MAX_KEY_BYTES)), ("part", "I"), ("round", "Q"),
        ("slowest", "Q"), ("text", Text(MAX_TEXT_BYTES)), ("nbytes", "Q")))

    def check(self) -> None:
        if self.nbytes > MAX_PUSH_BYTES or (self.kind != "values" and self.nbytes):
            raise ProtocolError(f"a Geo-SGD {self.kind} reply announcing {self.nbytes} bytes of values")


ROLES = ("worker", "server")
#: The most bytes of addresses a roll call report carries (about 64 IPv4 addresses).
REPORT_ADDRESS_BYTES = 1024


@dataclasses.dataclass(frozen=True)
class Report(Message):
    """One process's part in the job's roll call: its ``role``, ``host`` name and IPv4 ``addresses``
    (comma-separated, loopback last), from which a server finds the interface to listen on."""

    role: str
    host: str
    addresses: str

    LAYOUT: ClassVar[Layout] = Layout(7, (("role", Choice(ROLES)), ("host", Text(255)),
                                          ("addresses", Text(REPORT_ADDRESS_BYTES))))

    def check(self) -> None:
        _addresses(self.addresses, "report")

    @property
    def address_list(self) -> tuple[str, ...]:
        return tuple(self.addresses.split(",")) if self.addresses else ()


@dataclasses.dataclass(frozen=True)
class Listening(Message):
    """Where a server takes push_pull over TCP: ``places`` (``address:port``, comma-separated) and the
    ``token`` that proves a connection reached it; or ``error``, why it could not listen. Empty from a
    worker, or from a server that takes push_pull over MPI."""

    places: str = ""
    token: str = ""
    error: str = ""

    LAYOUT: ClassVar[Layout] = Layout(8, (("places", Text(1024)), ("token", Text(16)), ("error", Text(MAX_TEXT_BYTES))))

    def check(self) -> None:
        for place in filter(None, self.places.split(",")):
            address, _, port = place.rpartition(":")
            _addresses(address, "listening place")
            if not port.isdigit() or not 0 < int(port) < 65536:
                raise ProtocolError(f"a listening place {place!r} has no port")


def _addresses(text: str, what: str) -> None:
    for address in filter(None, text.split(",")):
        try:
            ipaddress.IPv4Address(address)
        except ValueError:
            raise ProtocolError(f"a {what} names {address!r}, not an IPv4 address") from None


#: The roll call's answer (rank 0 -> every process): how many reports, how many ranks missing; then the
#: missing ranks (``I`` each), then each report's length (``H``) and bytes.
TABLE_HEAD = struct.Struct("<II")
_RANK = struct.Struct("<I")
_LENGTH = struct.Struct("<H")


def pack_table(reports: list[bytes], missing: list[int]) -> bytes:
    """Rank 0's answer to the roll call: every report received (by rank; those of ``missing`` ranks
    empty), and the ranks missing."""
    parts = [TABLE_HEAD.pack(len(reports), len(missing))] + [_RANK.pack(r) for r in missing]
    for report in reports:
        parts += [_LENGTH.pack(len(report)), report]
    return b"".join(parts)


def unpack_table(data, size: int, limit: int) -> tuple[list[bytes], list[int]]:
    """``(reports, missing)`` of a :func:`pack_table` for a job of ``size`` processes whose reports are at
    most ``limit`` bytes each; :class:`ProtocolError` when it is anything else."""
    data = bytes(data)
    if len(data) < TABLE_HEAD.size:
        raise ProtocolError(f"a roll call table of {len(data)} bytes")
    count, nmissing = TABLE_HEAD.unpack_from(data)
    if count != size or nmissing > size:
        raise ProtocolError(f"a roll call table of {count} reports and {nmissing} missing ranks in a job of {size}")
    at = TABLE_HEAD.size
    if at + nmissing * _RANK.size > len(data):
        raise ProtocolError("a roll call table cut short")
    missing = [_RANK.unpack_from(data, at + i * _RANK.size)[0] for i in range(nmissing)]
    at += nmissing * _RANK.size
    reports = []
    for _ in range(count):
        if at + _LENGTH.size > len(data):
            raise ProtocolError("a roll call table cut short")
        (length,) = _LENGTH.unpack_from(data, at)
        at += _LENGTH.size
        if length > limit or at + length > len(data):
            raise ProtocolError(f"a roll call table's report of {length} bytes")
        reports.append(data[at:at + length])
        at += length
    if at != len(data) or any(r >= size for r in missing):
        raise ProtocolError("a roll call table with bytes past its reports or ranks outside the job")
    return reports, missing


def table_limit(size: int, limit: int) -> int:
    """The most bytes a roll call table of ``size`` reports of at most ``limit`` bytes takes."""
    return TABLE_HEAD.size + size * (_RANK.size + _LENGTH.size + limit)


#: A tensor that spans several partitions gets at least this many per server (while partitions stay at
#: least ``MIN_PARTITION_BYTES``): a server answers a partition once every worker has pushed it, so the
#: answers overlap the pushes only from the second partition on; with k partitions per server the last
#: answer ends about 1/k of the tensor's time after the last push. Over MPI, on 4 + 4 emulated hosts at
#: 1 Gbit/s, 64 MiB in 1 MiB partitions (16 per server) took 0.80 s, in 2 MiB (8 per server) 0.82-0.87 s,
#: in 256 KiB 0.93 s (one run each, machine shared; scripts/bench_servers.py).
DEPTH = 16
#: The same over TCP (:mod:`.tcp`), where a partition costs little CPU: 64 MiB in 256 KiB partitions (64
#: per server) took 0.62-0.64 s, in 1 MiB 0.65-0.67 s, in 128 KiB 0.68-0.75 s (5 rounds each, machine
#: shared).
TCP_DEPTH = 64
MIN_PARTITION_BYTES = 256 << 10


def partitions(count: int, itemsize: int, partition_bytes: int, servers: int, depth: int = DEPTH) -> tuple[int, int]:
    """``(elements per partition, number of partitions)`` of a tensor of ``count`` elements: partitions of
    at most ``partition_bytes`` (at least one element); when there are several, at least ``depth`` per
    server (down to ``MIN_PARTITION_BYTES``) and as many as a multiple of ``servers``, of equal size, so
    that a large tensor loads every server's link alike (17 partitions of 4 MB over 4 servers would give
    one server 5, a quarter more than the others, and its link the whole tensor's time). The last
    partition may be shorter; an empty tensor has none."""
    if count == 0:
        return 1, 0
    per = max(1, partition_bytes // itemsize)
    nparts = -(-count // per)
    if nparts > 1:
        nparts = max(nparts, min(depth * servers, count * itemsize // MIN_PARTITION_BYTES))
        if nparts % servers:
            nparts += servers - nparts % servers
    per = -(-count // nparts)
    return per, -(-count // per)


#: Partitions of a large tensor's first and last groups, as fractions of the regular size (each entry a
#: group of one partition per server): the head ramps up, the tail down (reversed).
RAMP = (8, 8, 4, 2)


def bounds(count: int, itemsize: int, partition_bytes: int, servers: int, ramp: bool = True,
           depth: int = DEPTH) -> list[int]:
    """The partitions of push_pull: offsets ``[0, b1, ..., count]`` (partition ``p`` is ``[b[p], b[p+1])``).

    :func:`partitions`' equal partitions, except that a tensor of at least ``4 x servers`` of them starts
    and ends with smaller ones (``RAMP``): ``servers`` of 1/8, ``servers`` of 1/8, then 1/4, then 1/2 of the
    regular size at the start, the same reversed at the end. A server answers a partition once every
    worker has pushed it, so the workers' links carry no answers until the first partitions are complete,
    and nothing but answers after the last: small partitions there shorten both. Each group holds one
    partition per server (consecutive partitions go to consecutive servers), so every server's link still
    carries the same share."""
    per, n = partitions(count, itemsize, partition_bytes, servers, depth)
    if n == 0:
        return [0]
    if not ramp or n < 4 * servers or per < 2 * RAMP[0]:
        return [min(count, p * per) for p in range(n + 1)]
    head = [per // d for d in RAMP for _ in range(servers)]
    middle_total = count - 2 * sum(head)
    m = n - 2 * servers  # the regular partitions left (a multiple of servers, at least 2 x servers)
    mid = -(-middle_total // m)
    sizes = head + [mid] * (middle_total // mid) + ([middle_total % mid] if middle_total % mid else []) \
        + head[::-1]
    out = list(itertools.accumulate(sizes, initial=0))
    assert out[-1] == count
    return out


def sending_order(nparts: int, servers: int, worker: int) -> list[int]:
    """The order in which ``worker`` pushes a tensor's ``nparts`` partitions: group by group (``servers``
    consecutive partitions, one per server, of equal size under :func:`bounds`), each group's order rotated
    by the worker, so that at each moment the workers push to different servers (every server's link takes
    one worker's stream at a time) and a group's partitions are complete, and answered, one group's time
    after its first push. (Rotating the whole tensor instead, worker w starting at partition w, left the
    first partitions' answers waiting for the last worker to come round to them at the end.)"""
    order = []
    for start in range(0, nparts, servers):
        group = list(range(start, min(start + servers, nparts)))
        k = worker % len(group)
        order += group[k:] + group[:k]
    return order


def server_of(key: str, part: int, servers: int) -> int:
    """The server (index among the servers) that reduces partition ``part`` of ``key``: a hash of the key
    (CRC-32, equal in every process, unlike Python's ``hash``) plus the partition index, so one tensor's
    consecutive partitions go to consecutive servers (an even spread) and no start-up exchange per key is
    needed."""
    return (zlib.crc32(key.encode()) + part) % servers
