"""What workers and summation servers say to each other, and the one rule that places a partition.

Nothing here imports MPI. All traffic runs on the job's own duplicate of the user's communicator (workers
and servers both in it; :mod:`.discovery`).

A push (worker -> server), for one partition of one key:

1. a pickled :class:`Push` header on tag ``TAG_PUSH``;
2. the partition's values (already in the wire dtype) on tag ``push.slot``, a tag the worker chose that no
   other of its messages in flight uses.

The server answers on the same ``slot`` tag with the reduced partition (same wire dtype and length) once
every contributor has pushed that key's round; it answers every contributor with the same bytes. When the
round cannot be reduced (the contributors declared it differently), it answers on ``TAG_ERROR`` with a
pickled ``(slot, message)`` instead, and the worker cancels its receive.

``TAG_BYE`` (worker -> server, ``None``): the worker's runtime shut down; a server drops the rounds still open once
every worker has said it. ``TAG_EXIT`` (worker -> server, ``None``): the worker's
process is exiting; a server exits once every worker has sent it.
"""

from __future__ import annotations

import dataclasses
import itertools
import zlib

TAG_PUSH = 1
TAG_ERROR = 2
TAG_BYE = 3
TAG_EXIT = 4
#: Geo-SGD (:mod:`.geo`): a pickled GeoMessage header (worker -> server), its values, the answer's pickled
#: GeoReply and its values. Fixed tags, matched in order per sender (MPI does not overtake on one tag).
TAG_GEO, TAG_GEO_DATA, TAG_GEO_REPLY, TAG_GEO_VALUES = 12, 13, 14, 15
#: Slot tags start here (below: the control tags above).
FIRST_SLOT = 16


@dataclasses.dataclass(frozen=True)
class Push:
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

    def declaration(self) -> tuple:
        """What every contributor must declare alike."""
        return (self.total, self.wire, self.count, self.op, self.contributors, self.codec)

    def describe(self) -> str:
        from ..ops import ReduceOp

        codec = f" ({self.codec}-compressed)" if self.codec else ""
        return (f"{self.wire}[{self.total}]{codec} {ReduceOp(self.op).name.lower()} among {self.contributors} "
                "workers")


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
