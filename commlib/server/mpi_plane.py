"""push_pull's data plane over MPI point-to-point (``COMMLIB_SERVER_TRANSPORT=mpi``).

A partition's header and data are posted with non-blocking sends, a few partitions at a time (``WINDOW``);
once its data has gone, its answer's receive is posted into the memory it was sent from (MPI forbids a
receive into a buffer a send still reads; the server cannot answer before it has every push anyway). The
client's progress thread polls the requests (``Testsome``), and so does a thread waiting for a handle.
MPI must provide MPI_THREAD_MULTIPLE (the caller's thread posts, another polls).
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from . import mpi_messages, protocol
from .plane import DataPlane, Part, PushPull


#: Partitions a worker sends at a time, to all servers together (see :meth:`MpiPlane.launch`).
#: On 4 + 4 emulated hosts at 1 Gbit/s (64 MiB, machine shared): 2 measured 1.35-1.41x the S/B bound,
#: 1 and 3 1.43-1.68x; a credit on partitions awaiting their answer (6 or 10) 1.7-2.4x (the round trip,
#: which waits for every worker's push, is long beside a partition's time on the link).
WINDOW = 2


class _Transfer:
    """A partition's MPI requests: its sends, then its answer's receive."""

    __slots__ = ("sends", "recv")

    def __init__(self, sends: list):
        self.sends = sends
        self.recv: MPI.Request | None = None


class MpiPlane(DataPlane):
    """push_pull's partitions over MPI, polled."""

    depth = protocol.DEPTH
    polled = True

    def attach(self, client) -> None:
        super().attach(client)
        self.comm = client.comm
        self.servers = client.servers
        self.parts: list[Part] = []  # under the lock: sending, or awaiting their answer
        self.sending = 0  # partitions being sent
        self.status = MPI.Status()

    def launch(self) -> None:
        """Post the next queued partitions while fewer than ``WINDOW`` are being sent.

        A few at a time, not everything at once: partitions sent together share the worker's link and
        all arrive at the end, so the servers could answer none before the last; sent a few at a time,
        the first answers travel back while later partitions still go out. And each worker starts a
        tensor's groups at another partition (:func:`.protocol.sending_order`), so at each moment the
        workers push to different servers."""
        queue, trace = self.client.queue, self.client.trace
        while queue and self.sending < WINDOW:
            part = queue.popleft()
            dest = self.servers[part.server]
            transfer = part.transfer = _Transfer([mpi_messages.post(self.comm, part.header, dest, protocol.TAG_PUSH),
                                                  self.comm.Isend(part.data, dest=dest, tag=part.slot)])
            part.since = time.monotonic()
            if trace is not None:
                trace.append((part.since, "post", part.server, part.slot))
            self.parts.append(part)
            if MPI.Request.Testall(transfer.sends):  # a small partition leaves at once: await its answer now
                transfer.recv = self.comm.Irecv(part.wire.view(np.uint8), source=dest, tag=part.slot)
            else:
                self.sending += 1

    def poll(self) -> bool:
        """Read the servers' refusals; advance every partition: its sends done -> post its answer's
        receive; its answer in -> hand it to the client."""
        client = self.client
        moved = self._refusals()
        finished = []
        with client.lock:
            parts = self.parts
            if not parts:
                return moved
            done = mpi_messages.test_some([p.transfer.recv if p.transfer.recv is not None else p.transfer.sends[-1]
                                           for p in parts])
            if not done:
                return moved
            gone = set()
            for i, nbytes in done:
                part = parts[i]
                transfer = part.transfer
                if transfer.recv is None:  # its data went out (the header, sent first, has gone too)
                    MPI.Request.Waitall(transfer.sends)
                    now = client.heard[part.server] = time.monotonic()
                    if client.trace is not None:
                        client.trace.append((now, "sent", part.server, part.slot))
                    self.sending -= 1
                    if part.job.failed:
                        gone.add(id(part))
                    else:
                        transfer.recv = self.comm.Irecv(part.wire.view(np.uint8), source=self.servers[part.server],
                                                        tag=part.slot)
                        part.since = now
                else:
                    gone.add(id(part))
                    if nbytes != part.wire.nbytes:  # the server answered with another length
                        client.malformed(client.job.describe_server(part.server), f"an answer of {nbytes} bytes to push_pull {part.job.key!r} "
                                                      f"partition {part.index} of {part.wire.nbytes} bytes")
                        client.unreachable(part.server, "it answered with the wrong length", [part])
                        continue
                    finished.append(part)
                    if client.trace is not None:
                        client.trace.append((time.monotonic(), "answered", part.server, part.slot))
            self.parts = [p for p in parts if id(p) not in gone]
            self.launch()
        now = time.monotonic()
        for part in finished:
            client.heard[part.server] = now
            client.answered(part)
        return True

    def _refusals(self) -> bool:
        """A server refused a round: fail that tensor here, naming what the server said."""
        client = self.client
        moved = False
        for source, refusal in mpi_messages.arrived(self.comm, protocol.TAG_ERROR, self.status, protocol.Refusal):
            moved = True
            if source not in self.servers:
                client.malformed(f"rank {source} of the job", "a refusal from a rank that is not a server")
                continue
            server = self.servers.index(source)
            if isinstance(refusal, protocol.ProtocolError):
                client.malformed(client.job.describe_server(server), str(refusal))
                continue
            with client.lock:
                client.refused(server, refusal)
        return moved

    def sent(self) -> list[Part]:
        return list(self.parts)

    def stage(self, part: Part) -> str:
        return "taken its push" if part.transfer is None or part.transfer.recv is None else "answered"

    def forget(self, job: PushPull) -> None:
        """Cancel the receives of ``job``'s partitions (the sends still complete when their servers take
        them) and forget them."""
        keep = []
        for part in self.parts:
            if part.job is job and part.transfer.recv is not None:
                part.transfer.recv.Cancel()
            else:  # still sending: kept until the send completes and frees its place in the window
                keep.append(part)
        self.parts = keep
