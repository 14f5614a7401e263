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


@pytest.mark.parametrize("servers", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("count", [0, 1, 2, 999, 1000, 1001, 10 ** 6, 16 * 2 ** 20 + 3])
def test_bounds_cover_the_tensor_and_load_every_server_alike(servers, count):
    b = protocol.bounds(count, 4, 4096000, servers)
    per, n = protocol.partitions(count, 4, 4096000, servers)
    assert b[0] == 0 and b[-1] == count
    assert all(lo < hi for lo, hi in zip(b, b[1:]))  # none empty
    assert all((hi - lo) * 4 <= 4096000 for lo, hi in zip(b, b[1:]))
    if n < 4 * servers:  # too few to taper: partitions() as they are
        assert b == [min(count, p * per) for p in range(n + 1)]
        return
    assert len(b) - 1 == n + 6 * servers
    load = collections.Counter()
    for p, (lo, hi) in enumerate(zip(b, b[1:])):
        load[protocol.server_of("w", p, servers)] += hi - lo
    assert max(load.values()) - min(load.values()) <= per  # at most the one shorter regular partition


def test_bounds_taper_at_both_ends():
    b = protocol.bounds(16 << 20, 4, 4096000, 4)  # 64 MiB of float32 over 4 servers: 1 MiB regular
    sizes = [(hi - lo) * 4 >> 10 for lo, hi in zip(b, b[1:])]
    head = [128] * 8 + [256] * 4 + [512] * 4
    assert sizes[:16] == head and sizes[-16:] == head[::-1]
    assert set(sizes[16:-16]) == {1024} and len(sizes) == 64 + 24
    assert protocol.bounds(16 << 20, 4, 4096000, 4, ramp=False) == [p << 18 for p in range(65)]


@pytest.mark.parametrize("servers", [1, 2, 3, 4])
@pytest.mark.parametrize("nparts", [0, 1, 3, 8, 88, 90])
def test_sending_order_is_a_permutation_rotated_per_group(servers, nparts):
    orders = [protocol.sending_order(nparts, servers, w) for w in range(4)]
    for order in orders:
        assert sorted(order) == list(range(nparts))
    if nparts >= servers > 1:  # in the first group every worker starts at another partition (server)
        firsts = [order[0] for order in orders[:servers]]
        assert len(set(firsts)) == servers
    for order in orders:  # group by group: partition p goes out among the partitions of its own group
        assert all(p // servers == i // servers for i, p in enumerate(order))


def test_tcp_depth_gives_quarter_mebibyte_partitions():
    per, n = protocol.partitions(16 << 20, 4, 4096000, 4, depth=protocol.TCP_DEPTH)  # 64 MiB, 4 servers
    assert n == 4 * protocol.TCP_DEPTH and per * 4 == 256 << 10
