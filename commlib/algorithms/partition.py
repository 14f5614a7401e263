"""Chunk boundaries: how a buffer of ``count`` elements is cut into ``parts`` pieces.

Every function works for any count (0, 1, fewer elements than parts, not divisible): pieces differ by at
most one element and the earlier pieces take the extra ones, so every rank computes the same cut.
"""

from __future__ import annotations


def offsets(count: int, parts: int) -> list[int]:
    """``parts + 1`` boundaries; piece i is ``[offsets[i], offsets[i + 1])``.

    >>> offsets(10, 4)
    [0, 3, 6, 8, 10]
    >>> offsets(2, 4)
    [0, 1, 2, 2, 2]
    """
    if parts < 1:
        raise ValueError(f"cannot cut {count} elements into {parts} pieces")
    base, extra = divmod(count, parts)
    return [i * base + min(i, extra) for i in range(parts + 1)]


def segments(start: int, stop: int, segment: int) -> list[tuple[int, int]]:
    """``[start, stop)`` as consecutive ranges of at most ``segment`` elements (one empty range if the
    interval is empty, so a message is still exchanged and both sides agree on the count)."""
    segment = max(1, segment)
    if stop <= start:
        return [(start, start)]
    return [(s, min(s + segment, stop)) for s in range(start, stop, segment)]


#: hierarchical_pipelined's block: this many pipeline segments ...
PIPELINE_BLOCK_SEGMENTS = 8
#: ... and at most this many bytes. On 2 emulated hosts at 1 Gbit/s, DDP's step with its backward pass
#: computing on every core while buckets cross: 2 MiB blocks 878 ms, 4 and 8 MiB 898-903 ms, gloo 866 ms
#: (docs/results/design_choices.md); alone, a 16.8 MB allreduce 142 ms against 151 ms (bound 140 ms).
PIPELINE_BLOCK_MAX_BYTES = 2 << 20


def pipeline_block_bytes(segment_bytes: int) -> int:
    """Bytes per block of hierarchical_pipelined at pipeline segment ``segment_bytes`` (the schedule and
    its cost model both use this)."""
    return min(PIPELINE_BLOCK_SEGMENTS * segment_bytes, PIPELINE_BLOCK_MAX_BYTES)
