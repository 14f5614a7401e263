"""Geo-SGD across runtimes: each init() gets its own Geo-SGD client on the Runtime (no state kept in a
module), a GeoSGD left open at shutdown() is closed by it, and the next runtime's tables, named alike,
start afresh on the servers. Prints ``cycles ok on worker R``."""

import numpy as np

import commlib as cl
from commlib.geo import GeoSGD
from commlib.server.geo_client import GeoClient

clients = []
for cycle in range(3):
    cl.init()
    rank, size = cl.rank(), cl.size()
    client = cl.api._rt().geo
    assert isinstance(client, GeoClient) and not client.closed and all(client is not c for c in clients)
    clients.append(client)
    w = np.full(3000, 10.0 * cycle + rank, np.float32)  # several 4 KiB partitions over every server
    geo = GeoSGD({"w": w}, k=1, staleness=0, average=False, overlap=False, name="cycle")
    assert geo.key == "geo/cycle#0", geo.key  # the same table name as the last runtime's
    for r in range(1, 4):
        w += rank + 1
        geo.step()
        expected = 10.0 * cycle + r * sum(range(1, size + 1))
        assert np.all(w == expected), (cycle, r, w[:3], expected)
    if cycle != 1:
        geo.close()  # cycle 1 leaves it open: shutdown() closes it
    cl.shutdown()
    assert client.closed
print(f"cycles ok on worker {rank}", flush=True)
