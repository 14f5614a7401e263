"""Worker for tests/transport/test_control_messages.py: every rank sends every other rank a stream of
messages of every kind back to back (bit vectors in each persistent send's size and beyond, so that a
persistent send is often still under way and an ordinary one follows it; pickled objects in the posted
buffer and past it), and each rank receives every peer's stream complete and in order, with the
notice and the goodbye set aside. ``probe`` (argv): as beyond _POSTED_MAX_RANKS ranks, probing instead of
posted receives. Named cases on every rank (tests/spmd.py).
"""

import sys
import time

from mpi4py import MPI

import spmd
from commlib.transport import control
from commlib.transport.control import ControlChannel
from commlib.transport.deadline import Deadline

if "probe" in sys.argv[1:]:
    control._POSTED_MAX_RANKS = 0

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
channel = ControlChannel(comm.Dup(), Deadline(timeout_s=30.0))
peers = [r for r in range(size) if r != rank]


def stream(source: int) -> list:
    """What ``source`` sends each peer, in order."""
    longest = control._POSTED_BYTES
    ints = [1 << (i % 1100) for i in range(1100)]  # every fixed size, and ints past the largest
    objects = [("meta", source, i) for i in range(50)] + ["x" * 1000, "y" * longest, 1 << (8 * longest)]
    return [source] + ints[:500] + objects + ints[500:] + [source, -source]


@spmd.case
def every_stream_arrives_in_order():
    mine = stream(rank)
    for i, message in enumerate(mine):
        channel.post_all(peers, message)
        if i == 300:
            for peer in peers:
                channel.post_notice(peer, f"from {rank}", (rank,))
    for peer in peers:
        channel.post_goodbye(peer)
    got = {peer: [] for peer in peers}
    expected = {peer: stream(peer) for peer in peers}
    limit = time.monotonic() + 60
    while any(len(got[p]) < len(expected[p]) for p in peers) or channel.farewells != set(peers):
        assert time.monotonic() < limit, {p: len(got[p]) for p in peers}
        for source, message in channel.receive_all():
            got[source].append(message)
        channel.flush_for(0.0)
    for peer in peers:
        assert got[peer] == expected[peer], f"from rank {peer}: the stream differs"
    assert sorted(channel.receive_notices()) == sorted((p, f"from {p}", (p,)) for p in peers)
    channel.flush()


@spmd.case
def close():
    comm.Barrier()
    channel.close()


if __name__ == "__main__":
    spmd.main()
