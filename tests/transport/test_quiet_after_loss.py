"""Under elastic in-process recovery a rank sends nothing to its peers once it lost one (a send to a dead
rank can crash the sender in MPICH's UCX netmod; docs/elastic.md), and no notice when it runs out of time
(it cannot know which peers are alive). In one process, over MPI_COMM_SELF."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mpi4py import MPI

from commlib.coordinator.lifecycle import Lifecycle
from commlib.errors import PeerLostError
from commlib.transport.control import ControlChannel
from commlib.transport.deadline import Deadline


def _channel(quiet: bool) -> ControlChannel:
    channel = ControlChannel(MPI.COMM_SELF.Dup(), Deadline(timeout_s=5.0))
    channel.quiet_after_loss = quiet
    return channel


@pytest.mark.parametrize("quiet", [False, True])
def test_a_channel_that_lost_a_peer_sends_nothing_under_in_process_recovery(quiet):
    channel = _channel(quiet)
    channel.post(0, "before")
    channel.post_all([0], 5)
    assert [m for _, m in _received(channel)] == ["before", 5]  # before any loss: sent either way
    channel.deadline.lose(PeerLostError("rank 1 never answered", ranks=[1], what="a receive"))
    channel.post(0, "after")
    channel.post_all([0], 6)
    channel.post_notice(0, "gave up", (1,))
    channel.post_goodbye(0)
    received = [m for _, m in _received(channel)]
    assert received == ([] if quiet else ["after", 6])
    assert (channel.notices, channel.farewells) == (([], set()) if quiet else ([(0, "gave up", (1,))], {0}))
    channel.close()


def _received(channel):
    got = []
    for _ in range(100):  # delivery to oneself completes within MPI's progress
        got += channel.receive_all()
        channel.flush_for(0.01)
    return got


class _Recorder:
    def __init__(self):
        self.sent = []

    def post_notice(self, dest, text, lost=()):
        self.sent.append(dest)


@pytest.mark.parametrize("in_process, told", [(False, [0, 3]), (True, [])])
def test_no_notices_under_in_process_recovery(in_process, told):
    """``_tell_peers`` (after a timeout, a stall verdict or a failure) names the lost ranks to every other
    peer, except under in-process recovery: there it sends nothing."""
    coordinator = SimpleNamespace(rank=1, size=4, _world_ranks=[0, 1, 2, 3], _channel=_Recorder(),
                                  _config=SimpleNamespace(recovers_in_process=in_process))
    Lifecycle._tell_peers(coordinator, "rank 1 ran out of time waiting for rank(s) [2]", (2,))
    assert coordinator._channel.sent == told
