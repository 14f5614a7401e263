"""The cost model of ``ps`` (push_pull through summation servers): what auto predicts for each placement."""

import pytest

from commlib.algorithms import cost, ps, select, spec
from commlib.algorithms.cost import INF, Shape

GBIT = cost.Link(50e-6, 8 / 1e9)
MODEL = cost.CostModel(inter=GBIT, server=GBIT)
MB64 = 64 << 20


def four_hosts(servers):
    return Shape(node_of_rank=(0, 1, 2, 3), servers=tuple(servers))


def test_link_bytes_per_placement():
    # servers on hosts of their own: each worker link and each server link carries S
    assert ps.link_bytes(100.0, four_hosts([4, 5, 6, 7])) == (100.0, True)
    # one server per worker host: 2(n-1)/n S, the ring's bytes
    assert ps.link_bytes(100.0, four_hosts([0, 1, 2, 3])) == (150.0, True)
    # two servers for four workers on hosts of their own: the server links carry 2 S
    assert ps.link_bytes(100.0, four_hosts([4, 5])) == (200.0, True)
    # everything on one node: no link crossed
    assert ps.link_bytes(100.0, Shape(node_of_rank=(0, 0), servers=(0,)))[1] is False


def test_no_servers_is_never_predicted():
    assert ps.cost(MODEL, MB64, Shape(node_of_rank=(0, 1, 2, 3))) == INF
    assert ps.cost(MODEL, 0, four_hosts([4])) == 0.0


def ranking(shape):
    specs = [s for s in spec.SPECS if s.name not in ("cma", "torus2d")]
    return select.rank_all(MODEL, MB64, shape, specs, None, 1 << 20)


def test_auto_prefers_ps_with_server_hosts_and_an_allreduce_with_servers_on_the_workers():
    own = ranking(four_hosts([4, 5, 6, 7]))
    assert own[0].algorithm == "ps", own[:3]
    # S/B plus a partition's round trip, well under the ring's 2(n-1)/n S/B
    assert MB64 * 8 / 1e9 < own[0].predicted_s < 1.2 * MB64 * 8 / 1e9
    beside = ranking(four_hosts([0, 1, 2, 3]))
    assert beside[0].algorithm != "ps", beside[:3]


def test_a_slower_server_link_makes_ps_lose():
    slow = cost.CostModel(inter=GBIT, server=cost.Link(50e-6, 8 / 0.5e9))
    specs = [s for s in spec.SPECS if s.name not in ("cma", "torus2d")]
    best = select.rank_all(slow, MB64, four_hosts([4, 5, 6, 7]), specs, None, 1 << 20)[0]
    assert best.algorithm != "ps"


def test_profile_round_trip_keeps_the_server_link_and_placement():
    model = cost.CostModel(server=cost.Link(1e-5, 1e-8), corrections={"ps": {"1048576": 1.2}},
                           corrected_for=cost.layout_of(four_hosts([4, 5, 6, 7])))
    back = cost.CostModel.from_json(model.to_json(), "test")
    assert back.server == model.server
    assert cost.correction(back, "ps", 1 << 20, four_hosts([4, 5, 6, 7])) == pytest.approx(1.2)
    # measured with the servers elsewhere: the correction does not apply
    assert cost.correction(back, "ps", 1 << 20, four_hosts([0, 1, 2, 3])) == 1.0


def test_reduce_inside_hosts_where_the_host_link_is_the_bottleneck():
    """2 hosts x 2 workers and 2 server hosts: each host's link carries every worker's push unless the host
    reduces first (one push per host): half the link bytes, which the rule finds cheaper at 64 MiB."""
    two_by_two = Shape(node_of_rank=(0, 0, 1, 1), servers=(2, 3))
    flat, host = ps.cost(MODEL, MB64, two_by_two), ps.host_cost(MODEL, MB64, two_by_two)
    assert host < 0.6 * flat, (host, flat)
    assert ps.reduces_in_hosts(MODEL, MB64, two_by_two)
    assert ps.chosen_cost(MODEL, MB64, two_by_two) == host
    # one worker per host: nothing to reduce; servers beside the workers on one host: no link to spare
    assert not ps.reduces_in_hosts(MODEL, MB64, Shape(node_of_rank=(0, 1), servers=(2, 3)))
    assert not ps.reduces_in_hosts(MODEL, MB64, Shape(node_of_rank=(0, 0), servers=(0,)))
    assert not ps.reduces_in_hosts(MODEL, 0, two_by_two)
    # COMMLIB_SERVER_HOST_REDUCE: off never, on wherever a host has several workers
    assert not ps.reduces_in_hosts(MODEL, MB64, Shape((0, 0, 1, 1), servers=(2, 3), server_host_reduce="off"))
    assert ps.reduces_in_hosts(MODEL, 4, Shape((0, 0), servers=(0,), server_host_reduce="on"))
    assert not ps.reduces_in_hosts(MODEL, 4, Shape((0, 1), servers=(0,), server_host_reduce="on"))
