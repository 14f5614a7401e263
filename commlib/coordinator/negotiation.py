"""The ready table: which named tensors every rank has submitted, and whether they match.

Every rank keeps one, fed with the same messages in the same order (:mod:`.rounds`), so every rank
draws the same decisions from it. Two paths feed it. A name negotiated before has a cache id (assigned
here when it is first decided, so every rank assigns the same); a rank whose new requests equal its
cached ones sends only a bit vector of their ids, which is ORed into that rank's vector. The bitwise AND
of the vectors of all active ranks is the set of cached tensors ready everywhere: one AND decides them
all at once. Anything else (a first negotiation, a changed shape, a cache that is full) arrives as full
metadata and is matched field by field, so a disagreement can be reported with every rank's value.
"""

from __future__ import annotations

from .requests import AUTO_NAME_MARK, Kind, Meta, Response


class ReadyTable:
    """Collects every rank's requests and turns complete ones into responses."""

    def __init__(self, size: int, cache_capacity: int, world_ranks: list[int] | None = None):
        self.size = size
        self._names = world_ranks or list(range(size))  # how messages name a set's ranks: world ranks
        self._pending: dict[str, dict[int, Meta]] = {}
        self._first_seen: dict[str, float] = {}
        self._cache_metas: list[Meta] = []
        self._equal: list[Meta] = []          # per cache id: the last object found equal to its metadata
        self._responses: list[Response] = []  # per cache id: its response when no rank has joined
        self._cache_ids: dict[str, int] = {}
        self._capacity = cache_capacity
        # One bit vector per rank (a Python int: bit k = cached tensor k submitted and not yet run).
        self._bits = [0] * size
        self._bits_dirty = False
        self._joined: list[int] = []
        self._waiting_for = list(range(size))   # ranks that have not joined
        self._gone: dict[int, str] = {}

    # ---- input -------------------------------------------------------------------------------------

    def add_full(self, rank: int, meta: Meta, now: float) -> None:
        """A request that arrived with its metadata."""
        cache_id = self._cache_ids.get(meta.name)
        if cache_id is not None:
            # Other ranks may have hit the cache for this name while this one did not: compare in full.
            for other in self._ranks_with(cache_id):
                self._pending.setdefault(meta.name, {})[other] = self._cache_metas[cache_id]
            self._clear(cache_id)
        self._pending.setdefault(meta.name, {})[rank] = meta
        self._first_seen.setdefault(meta.name, now)

    def add_cached(self, rank: int, hits: int, now: float) -> None:
        """Requests that arrived as a bit vector of cache ids (their metadata equals the negotiated one)."""
        if not hits:
            return
        pending, first_seen = self._pending, self._first_seen
        for cache_id in iter_bits(hits):
            name = self._cache_metas[cache_id].name
            if name in pending:  # this name is being compared in full: join that comparison
                pending[name][rank] = self._cache_metas[cache_id]
                hits &= ~(1 << cache_id)
            elif name not in first_seen:
                first_seen[name] = now
        self._bits[rank] |= hits
        self._bits_dirty = True

    def cache_id(self, meta: Meta) -> int:
        """The cache id that stands for ``meta`` (negotiated before with exactly this metadata), or -1."""
        cache_id = self._cache_ids.get(meta.name, -1)
        if cache_id >= 0 and self._equal[cache_id] is not meta:
            if self._cache_metas[cache_id] != meta:
                return -1
            self._equal[cache_id] = meta  # the caller's object, usually reused: next time one `is`
        return cache_id

    def decide_alone(self, cache_id: int, message: int, messages: list) -> Response | None:
        """What :meth:`add_cached` and :meth:`take_ready` would decide from a complete round in which every
        rank's message is ``message``, the bit of ``cache_id`` alone, while nothing else is pending, joined
        or gone: that cached tensor's response, the table left as it was. None where any of that does not
        hold (the caller then feeds the round in the general way)."""
        if self._pending or self._first_seen or self._joined or self._gone:
            return None
        for bits in self._bits:
            if bits:
                return None
        for _, other in messages:
            if other != message:
                return None
        return self._responses[cache_id]

    def _ranks_with(self, cache_id: int) -> list[int]:
        bit = 1 << cache_id
        return [r for r in range(self.size) if self._bits[r] & bit]

    def _clear(self, cache_id: int) -> None:
        mask = ~(1 << cache_id)
        self._bits = [b & mask for b in self._bits]

    def join(self, rank: int) -> None:
        if rank not in self._joined:
            self._joined.append(rank)
            self._waiting_for.remove(rank)

    def rank_gone(self, rank: int, reason: str) -> None:
        """``rank`` shut down or failed: whatever still needs it fails on every rank (also when it had
        joined: it will not contribute its zeros any more)."""
        self._gone[rank] = reason
        if rank in self._joined:
            self._joined.remove(rank)
            self._waiting_for = sorted(self._waiting_for + [rank])

    # ---- output ------------------------------------------------------------------------------------

    def take_ready(self) -> list[Response]:
        """Responses for everything now decided: complete and matching, mismatched, or impossible."""
        waiting_for = self._waiting_for
        responses: list[Response] = []
        if self._bits_dirty and waiting_for:
            self._bits_dirty = False
            bits = self._bits
            ready = -1
            for r in waiting_for:  # the bitwise AND that decides every cached tensor at once
                ready &= bits[r]
            if ready:
                for r in range(len(bits)):
                    bits[r] &= ~ready
                joined = tuple(self._joined)
                for cache_id in iter_bits(ready):
                    meta = self._cache_metas[cache_id]
                    self._first_seen.pop(meta.name, None)
                    if joined:
                        responses.append(self._decide_joined(meta) or Response(meta.kind, [meta], joined=joined))
                    else:  # the same object every time: nobody modifies a response (fuse copies)
                        responses.append(self._responses[cache_id])
        if self._pending:
            for name in list(self._pending):
                by_rank = self._pending[name]
                response = self._decide(name, by_rank, waiting_for)
                if response is not None:
                    del self._pending[name]
                    self._first_seen.pop(name, None)
                    responses.append(response)
        if self._gone:
            responses.extend(self._decide_gone())
        if self._joined and self._gone:  # the ranks that left will never join: the join fails
            why = "; ".join(reason for _, reason in sorted(self._gone.items()))
            self._joined = []
            self._waiting_for = list(range(self.size))
            responses.append(Response(Kind.JOIN, [], error=f"join cannot complete: {why}"))
        elif self._joined and len(self._joined) == self.size:
            last = self._joined[-1]
            self._joined = []
            self._waiting_for = list(range(self.size))
            responses.append(Response(Kind.JOIN, [], last_joined=last))
        return responses

    def _decide(self, name: str, by_rank: dict[int, Meta], waiting_for: list[int]) -> Response | None:
        errors = [f"rank {self._names[r]}: {m.error}" for r, m in sorted(by_rank.items()) if m.error]
        if errors:
            return Response(Kind.ALLREDUCE, [next(iter(by_rank.values()))],
                            error=f"tensor {name!r} is invalid on some ranks: " + "; ".join(errors))
        if not all(r in by_rank for r in waiting_for):
            return None
        mismatch = describe_mismatch(name, by_rank, self._names)
        metas = [by_rank[min(by_rank)]]
        if mismatch:
            return Response(metas[0].kind, metas, error=mismatch)
        joined = self._decide_joined(metas[0])
        if joined:
            return joined
        # A cache id, once given, always means the same metadata: a rank may send a hit computed before
        # it had seen the latest rounds. A name renegotiated with new metadata stays on the full path, as
        # do barriers and unnamed tensors (each call has a new name: a cache id would be wasted on it).
        if name not in self._cache_ids and len(self._cache_metas) < self._capacity \
                and metas[0].kind is not Kind.BARRIER and AUTO_NAME_MARK not in name:
            self._cache_ids[name] = len(self._cache_metas)
            self._cache_metas.append(metas[0])
            self._equal.append(metas[0])
            self._responses.append(Response(metas[0].kind, [metas[0]]))
        return Response(metas[0].kind, metas, joined=tuple(self._joined))

    def _decide_joined(self, meta: Meta) -> Response | None:
        """Only allreduce can run while some ranks have joined (they contribute zeros)."""
        if self._joined and meta.kind is not Kind.ALLREDUCE:
            return Response(meta.kind, [meta], error=(
                f"tensor {meta.name!r}: {meta.kind.label} cannot run while rank(s) {sorted(self._joined)} "
                "have joined; only allreduce continues with zeros from joined ranks"))
        return None

    def _decide_gone(self) -> list[Response]:
        if not self._gone:
            return []
        responses = []
        why = "; ".join(reason for _, reason in sorted(self._gone.items()))
        for name in list(self._pending):
            meta = next(iter(self._pending.pop(name).values()))
            self._first_seen.pop(name, None)
            responses.append(Response(meta.kind, [meta], error=f"tensor {name!r} cannot complete: {why}"))
        anyone = 0
        for bits in self._bits:
            anyone |= bits
        self._bits = [0] * self.size
        for cache_id in iter_bits(anyone):
            meta = self._cache_metas[cache_id]
            self._first_seen.pop(meta.name, None)
            responses.append(Response(meta.kind, [meta], error=f"tensor {meta.name!r} cannot complete: {why}"))
        return responses

    # ---- stall inspection ------------------------------------------------------------------------------

    def stalled(self, older_than: float, now: float) -> list[tuple[str, list[int]]]:
        """(name, missing ranks) for tensors some ranks submitted more than ``older_than`` s ago."""
        out = []
        for name, since in self._first_seen.items():
            if now - since >= older_than:
                missing = self._missing(name)
                if missing:
                    out.append((name, missing))
        return out

    def _missing(self, name: str) -> list[int]:
        if name in self._pending:
            present = set(self._pending[name])
        else:
            present = set(self._ranks_with(self._cache_ids[name]))
        return [r for r in range(self.size) if r not in present and r not in self._joined]

    def fail_stalled(self, names: list[str], seconds: float, describe=None) -> list[Response]:
        """Error responses for ``names``, found stalled for ``seconds`` (by rank 0's clock), that are still
        undecided here; names decided meanwhile are skipped."""
        responses = []
        for name in names:
            if name not in self._first_seen:
                continue
            missing = self._missing(name)
            if name in self._pending:
                meta = next(iter(self._pending.pop(name).values()))
            else:
                cache_id = self._cache_ids[name]
                meta = self._cache_metas[cache_id]
                self._clear(cache_id)
            self._first_seen.pop(name, None)
            responses.append(Response(meta.kind, [meta], error=(
                f"tensor {name!r} stalled: {describe(missing) if describe else f'rank(s) {missing}'} did not submit it within {seconds:g} s "
                "(COMMLIB_STALL_SHUTDOWN_TIME); check that every rank calls the same collectives")))
        return responses

    def has_pending(self) -> bool:
        return bool(self._first_seen) or bool(self._joined)


def iter_bits(bits: int):
    """The indices of the set bits of a non-negative int, lowest first (for the common single bit, a
    tuple: no generator to build)."""
    if bits & (bits - 1) == 0:
        return (bits.bit_length() - 1,) if bits else ()
    return _each_bit(bits)


def _each_bit(bits: int):
    while bits:
        low = bits & -bits
        yield low.bit_length() - 1
        bits ^= low


def describe_mismatch(name: str, by_rank: dict[int, Meta], names: list[int] | None = None) -> str:
    """'' if every rank's request agrees, else a message naming each field and every rank's value."""
    metas = iter(by_rank.values())
    first = next(metas)
    if all(m == first for m in metas):  # the usual case, without building the field tables
        return ""
    fields = {r: m.matched_fields() for r, m in by_rank.items()}
    first = fields[min(fields)]
    problems = []
    for key in first:
        values = {r: f[key] for r, f in sorted(fields.items())}
        if len(set(map(repr, values.values()))) > 1:
            listing = ", ".join(f"rank {names[r] if names else r}: {v}" for r, v in values.items())
            problems.append(f"mismatched {key.replace('_', ' ')} ({listing})")
    if not problems:
        return ""
    return f"tensor {name!r}: " + "; ".join(problems) + ". Every rank must submit the same collective."
