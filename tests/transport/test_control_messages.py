"""The control channel delivers every kind of message, in order, whatever way it travels: bare ints as
raw bytes (their encoding kept for the next send of the same int, a bounded number of them), pickled
objects, small ones received into the kept buffer and larger ones under the deadline; notices and
goodbyes set aside. In one process, over MPI_COMM_SELF."""

from __future__ import annotations

from mpi4py import MPI

from commlib.transport import control
from commlib.transport.control import ControlChannel
from commlib.transport.deadline import Deadline


def _received(channel: ControlChannel, expected: int) -> list:
    got = []
    for _ in range(1000):  # delivery to oneself completes within MPI's progress
        got += channel.receive_all()
        if len(got) >= expected:
            break
        channel.flush_for(0.001)
    return [message for _, message in got]


def test_every_kind_of_message_arrives_in_order():
    channel = ControlChannel(MPI.COMM_SELF.Dup(), Deadline(timeout_s=5.0))
    ints = [0, 1, 1 << 5, 1 << 5, 1 << 63, 1 << 64, 1 << 64, (1 << 3000) + 7, 1 << 5]  # repeats: kept encodings
    many = list(range(3 * control._KEEP))  # more distinct ints than the channel keeps
    objects = [(["meta"], 3, {"join": True}), "x" * 1000, -4]  # -4: not a bare non-negative int: pickled
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
