"""The placement rule of push_pull (commlib.server.protocol), without MPI."""

import collections

import pytest

from commlib.server import protocol


@pytest.mark.parametrize("servers", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("count", [0, 1, 2, 999, 1000, 1001, 10 ** 6, 16 * 2 ** 20 + 3])
def test_partitions_cover_the_tensor_and_spread_evenly(servers, count):
    per, n = protocol.partitions(count, 4, 4096000, servers)
    if count == 0:
        assert n == 0
        return
    assert per * (n - 1) < count <= per * n  # every element in exactly one partition, none empty
    assert per * 4 <= 4096000 or per == 1
    if n > 1:  # several: every server owns as many as any other, give or take one
        owners = collections.Counter(protocol.server_of("w", p, servers) for p in range(n))
        assert max(owners.values()) - min(owners.values()) <= 1, owners


def test_a_large_tensor_gets_depth_partitions_per_server():
    per, n = protocol.partitions(16 << 20, 4, 4096000, 4)  # 64 MiB of float32 over 4 servers
    assert n == 4 * protocol.DEPTH and per * 4 == 1 << 20


def test_placement_is_the_same_in_every_process():
    # CRC-32, not Python's salted hash: a fixed value for a fixed name
    assert [protocol.server_of("layer1.weight", p, 3) for p in range(4)] == \
        [(protocol.zlib.crc32(b"layer1.weight") + p) % 3 for p in range(4)]
