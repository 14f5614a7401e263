"""Geo-SGD across runtimes: each init() gets its own Geo-SGD client on the Runtime (no state kept in a
module), a GeoSGD left open at shutdown() is closed by it, and the next runtime's tables, named alike,
start afresh on the servers. One named case per cycle on every worker (tests/spmd.py)."""

import numpy as np

import commlib as cl
import spmd
from commlib import lifecycle
from commlib.geo import GeoSGD
from commlib.server.geo_client import GeoClient

clients = []


def cycle(number: int, close: bool) -> None:
    """One init() ... shutdown(): a fresh client, a table named as the last runtime's starting from this
    cycle's values, three exact rounds; ``close``: the GeoSGD is closed before shutdown(), else
    shutdown() closes it."""
    cl.init()
    rank, size = cl.rank(), cl.size()
    client = lifecycle.current().geo
    assert isinstance(client, GeoClient) and not client.closed, client
    assert all(client is not earlier for earlier in clients), "a runtime reused an earlier runtime's client"
    clients.append(client)
    w = np.full(3000, 10.0 * number + rank, np.float32)  # several 4 KiB partitions over every server
    geo = GeoSGD({"w": w}, k=1, staleness=0, average=False, overlap=False, name="cycle")
    assert geo.key == "geo/cycle#0", geo.key  # the same table name as the last runtime's
    for r in range(1, 4):
        w += rank + 1
        geo.step()
        expected = 10.0 * number + r * sum(range(1, size + 1))
        assert np.all(w == expected), (number, r, w[:3], expected)
    if close:
        geo.close()
    cl.shutdown()
    assert client.closed, "shutdown() left the runtime's Geo-SGD client open"


@spmd.case
def first_runtime():
    cycle(0, close=True)


@spmd.case
def second_runtime_leaves_its_geosgd_open():
    cycle(1, close=False)


@spmd.case
def third_runtime_starts_afresh():
    cycle(2, close=True)


if __name__ == "__main__":
    spmd.main()
