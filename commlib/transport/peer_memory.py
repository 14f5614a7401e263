"""PeerMemory: direct reads and writes of another rank's memory on the same node (Linux cross-memory
attach, ``process_vm_readv``/``process_vm_writev``), the fast path of the ``cma`` allreduce.

MPI's shared-memory transport copies every message twice (into a shared cell, then out of it) and, for
large messages, MPICH touches a fresh scratch buffer on every call. With cross-memory attach a rank
copies a peer's data once, straight from the peer's own buffer. It needs the ranks to be processes of
one kernel that may ptrace each other: same user, and a Yama ``ptrace_scope`` of 0 (or 1 with a
parent-child relation). Whether that holds is not guessed: :meth:`PeerMemory.probe` has every rank read
a token from every other rank, and the path is used only if every read on every rank succeeded.
"""

from __future__ import annotations

import os

import numpy as np

from .. import kernels
from ..ops import ReduceOp
from .base import Transport

try:
    from .. import _peer_memory
except ImportError:  # pragma: no cover - a build without the extension
    _peer_memory = None

_U64 = np.dtype(np.uint64)
_I32 = np.dtype(np.int32)


class PeerMemory:
    """The process ids of a transport's ranks, all on one node, whose memory this rank may access."""

    def __init__(self, pids: list[int], rank: int):
        self.pids = list(pids)
        self.rank = rank
        #: the other ranks' process ids, in rank order (this rank left out), as the C code takes them
        self.peer_pids = np.array([pid for i, pid in enumerate(self.pids) if i != rank], np.int64)
        self._simd = bool(kernels.cpu_features()["simd"])

    def scratch_bytes(self, segment: int, codec) -> int:
        """Scratch that :meth:`allreduce_share_` needs for ``segment``-byte copies."""
        return (1 if len(self.pids) <= 2 else 2) * segment + (segment // 2 if codec is not None else 0)

    def allreduce_share_(self, bufs, peer_addresses: np.ndarray, lo: int, hi: int, op: ReduceOp, *,
                         prescale: float, postscale: float, codec, scratch: np.ndarray, segment: int) -> int:
        """Reduce bytes ``[lo, hi)`` of the concatenation of ``bufs`` with the same bytes of every peer
        (whose buffer k starts at ``peer_addresses[i, k]``, peers in rank order), in place, and write the
        result into every peer. Each contribution is multiplied by ``prescale`` and, with a ``codec``
        (float32 buffers), rounded to what the wire would carry, as is the result before ``postscale``
        multiplies it; returns how many values that rounding overflowed to inf. ``scratch``: 64-byte
        aligned, :meth:`scratch_bytes` long. No synchronisation: the caller's job. Raises OSError when
        the kernel refuses a copy."""
        half = -1 if codec is None else kernels.dtype_code(codec.wire_dtype)
        return _peer_memory.allreduce_share(
            bufs, self.peer_pids, np.ascontiguousarray(peer_addresses, _U64), self.rank, int(lo), int(hi),
            kernels.dtype_code(bufs[0].dtype), int(op.kernel_op), float(prescale), float(postscale), half,
            scratch, int(segment), self._simd)

    @classmethod
    def probe(cls, transport: Transport) -> tuple["PeerMemory | None", str]:
        """Collective over ``transport``: (a PeerMemory, "") when every rank could read every other
        rank's memory, else (None, why not). Call it on all ranks together."""
        size, rank = transport.size, transport.rank
        token = np.frombuffer(os.urandom(16), np.uint64).copy()
        mine = np.array([os.getpid(), token.ctypes.data, token[0], token[1]], _U64)
        every = np.empty(4 * size, _U64)
        transport.allgatherv(mine, every, [4] * size)
        every = every.reshape(size, 4)
        reason = ""
        if _peer_memory is None:
            reason = "commlib._peer_memory is not built"
        else:
            got = np.empty(2, _U64)
            for peer in range(size):
                if peer == rank:
                    continue
                pid, address = int(every[peer, 0]), int(every[peer, 1])
                try:
                    _peer_memory.read(pid, address, got)
                except OSError as exc:
                    reason = f"rank {rank} cannot read rank {peer}'s memory: {exc.strerror or exc}"
                    break
                if not np.array_equal(got, every[peer, 2:]):
                    reason = f"rank {rank} read another process than rank {peer} (separate pid namespaces?)"
                    break
        failed = np.array([1 if reason else 0], _I32)
        transport.allreduce_native_(failed, ReduceOp.MAX)
        if failed[0]:
            return None, reason or "another rank could not read its peers' memory"
        return cls([int(pid) for pid in every[:, 0]], rank), ""

    def __repr__(self) -> str:
        return f"PeerMemory(rank={self.rank}, pids={self.pids})"
