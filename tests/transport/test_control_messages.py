"""The control channel delivers every kind of message, in order, whatever way it travels: bare ints as
raw bytes (by the persistent send while it is free, else an ordinary one; longer ints always by an
ordinary one), pickled objects, small ones into the persistent receive's buffer and longer ones announced
there and received under the deadline, with a receive kept posted per peer or (many ranks) probed for;
notices and goodbyes set aside. In one process, over MPI_COMM_SELF."""

from __future__ import annotations

import pytest
from mpi4py import MPI

from commlib.transport import control
from commlib.transport.control import ControlChannel
from commlib.transport.deadline import Deadline
from mpirun import run_mpi


def _received(channel: ControlChannel, expected: int) -> list:
    got = []
    for _ in range(1000):  # delivery to oneself completes within MPI's progress
        got += channel.receive_all()
        if len(got) >= expected:
            break
        channel.flush_for(0.001)
    return [message for _, message in got]


@pytest.mark.parametrize("posted_max_ranks", [16, 0])  # 0: as beyond 16 ranks, probing instead of posted receives
def test_every_kind_of_message_arrives_in_order(monkeypatch, posted_max_ranks):
    monkeypatch.setattr(control, "_POSTED_MAX_RANKS", posted_max_ranks)
    channel = ControlChannel(MPI.COMM_SELF.Dup(), Deadline(timeout_s=5.0))
    edge = control._FIXED_BELOW  # the persistent send's ints are below it
    ints = [0, 1, 1 << 5, 1 << 5, 1 << 63, 1 << 64, edge - 1, edge, (1 << 3000) + 7, 1 << 5]
    many = list(range(700))  # back to back: the persistent send is often still under way
    longest = control._POSTED_BYTES  # longer messages are announced, then follow on a tag of their own
    objects = [(["meta"], 3, {"join": True}), "x" * 1000, "y" * longest, 1 << (8 * longest), -4]  # -4: pickled
    sent = ints[:4] + objects[:1] + ints[4:] + objects[1:] + many + many[:10]
    for message in sent[:6]:
        channel.post_all([0], message)
    channel.post_notice(0, "gave up", (3,))
    for message in sent[6:]:
        channel.post_all([0], message)
    channel.post_goodbye(0)
    assert _received(channel, len(sent)) == sent
    assert channel.receive_notices() == [(0, "gave up", (3,))]
    assert channel.farewells == {0}
    channel.flush()
    channel.close()


@pytest.mark.mpi
@pytest.mark.parametrize("ranks, mode", [(2, "posted"), (4, "posted"), (3, "probe")])
def test_every_peers_stream_arrives_in_order(ranks, mode):
    """On 2-4 ranks, each sending every other rank a stream of every kind back to back
    (workers/control_order.py)."""
    run_mpi(ranks, "control_order.py", mode, timeout=120)
