"""Eager small allreduces: the data travels inside the negotiation round, so no collective follows.

A named 4 KiB allreduce costs a negotiation round and then MPI's (or commlib's) allreduce: two network
latencies where MPI alone pays one, and between hosts each is hundreds of microseconds. But the round
already sends one message from every rank to every other rank: when a small tensor's bytes ride along
with its request, every rank holds every contribution the moment the round that decides the tensor is
complete, and reduces them itself, in rank order, with the engine's kernels
(:meth:`~commlib.engine.Engine.reduce_gathered_`): the same bits on every rank, one latency in all.

Which tensors go eagerly is a rule on the agreed request and the set's shape alone (:func:`eligible`),
so every rank sends the bytes of the same tensors and treats the same responses as eager: an allreduce
on the host, without compression, with ``auto`` as its algorithm (a named algorithm is honoured), whose
bytes times the number of peers are at most ``COMMLIB_EAGER_BYTES`` and that is itself at most
``TENSOR_BYTES`` (16 KiB), on a set that spans more than one
node and whose rounds go directly from rank to rank (not relayed through rank 0). Within one node the
allreduce it saves costs less than reducing the contributions in Python; between nodes it saves a
network latency (docs/results/design_choices.md). A rank sends a tensor's bytes once, in the message that carries its
request; the round that decides it is that one or a later one, so every contribution has arrived when
the decision is made. Contributions wait here, by name, until their response runs (or fails). Ranks
that joined contribute zeros, as in the collective.
"""

from __future__ import annotations

import numpy as np

from ..cache import BoundedCache
from .requests import Entry, Kind, Meta, Response


#: The largest tensor that travels eagerly, whatever ``COMMLIB_EAGER_BYTES`` allows: a larger one is
#: bandwidth-bound between hosts (64 KiB takes ~0.5 ms at 1 Gbit/s, against a latency of ~0.1 ms saved),
#: and an eager tensor is reduced alone, never fused with the tensors ready beside it
#: (docs/results/design_choices.md).
TENSOR_BYTES = 16 << 10


def eligible(meta: Meta, peers: int, limit_bytes: int, default_algorithm: str, nodes: int,
             relayed: bool) -> bool:
    """Whether ``meta``'s data travels in the negotiation round (equal on every rank: agreed inputs)."""
    return (meta.kind is Kind.ALLREDUCE and nodes > 1 and not relayed and meta.nbytes <= TENSOR_BYTES
            and meta.nbytes * peers <= limit_bytes
            and meta.compression == "none" and meta.device == "cpu" and not meta.error
            and (meta.algorithm or default_algorithm) == "auto")


class EagerStore:
    """The contributions of eager tensors received from peers, until their response runs."""

    def __init__(self, rank: int, size: int, limit_bytes: int, default_algorithm: str, nodes: int,
                 relayed: bool):
        self._rank = rank
        self._size = size
        self._rule = (size - 1, limit_bytes, default_algorithm, nodes, relayed)
        self._never = limit_bytes <= 0 or nodes < 2 or relayed
        self._verdicts = BoundedCache(4096)  # id(meta) -> (meta, eligible): asked several times per call
        self._received: dict[str, dict[int, bytes]] = {}
        self.runs = 0  # tensors reduced eagerly on this rank (for tests and diagnostics)

    def applies(self, meta: Meta) -> bool:
        if self._never:
            return False
        known = self._verdicts.get(id(meta))
        if known is not None and known[0] is meta:
            return known[1]
        return self._verdicts.put(id(meta), (meta, eligible(meta, *self._rule)))[1]

    def outgoing(self, entry: Entry) -> tuple[str, bytes]:
        """What this rank's message carries for ``entry``: its name and its buffer's bytes."""
        return entry.meta.name, entry.output.tobytes()

    def receive(self, source: int, payloads: list[tuple[str, bytes]]) -> None:
        for name, data in payloads:
            self._received.setdefault(name, {})[source] = data

    def discard(self, name: str) -> None:
        self._received.pop(name, None)

    def clear(self) -> None:
        self._received.clear()

    def run(self, engine, response: Response, entry: Entry | None) -> np.ndarray:
        """Reduce the contributions of ``response``'s one tensor into this rank's output (a joined rank,
        ``entry`` None, gets the result in a new array)."""
        meta = response.metas[0]
        received = self._received.pop(meta.name, {})
        output = entry.output if entry is not None else np.zeros(meta.shape, np.dtype(meta.dtype))
        flat = output.reshape(-1)
        dtype = flat.dtype
        zeros = None
        contributions = []
        for rank in range(self._size):
            if rank == self._rank and entry is not None:
                contributions.append(flat.copy())
            elif rank in received:
                contributions.append(np.frombuffer(received[rank], dtype))
            else:  # a joined rank: zeros, as it contributes to the collective
                if rank not in response.joined:
                    raise RuntimeError(f"eager allreduce of {meta.name!r}: no data from rank {rank}")
                zeros = zeros if zeros is not None else np.zeros(flat.size, dtype)
                contributions.append(zeros)
        engine.reduce_gathered_(flat, contributions, meta.op, meta.prescale, meta.postscale)
        self.runs += 1
        return output
