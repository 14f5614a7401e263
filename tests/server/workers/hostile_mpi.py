"""Worker 1 sends the summation server what the protocol does not allow, over MPI, on the job's own
communicator (argv[1]: a path a planted pickle would create if ever loaded); then both workers run
push_pull and Geo-SGD, which must give numpy's results. Named cases on every worker (tests/spmd.py)."""

import sys

import numpy as np
from mpi4py import MPI

import commlib as cl
import spmd
from commlib import lifecycle
from commlib.geo import GeoSGD
from commlib.server import protocol
from commlib.server.client import ServerError
from planted import Planted, planted

rank = size = 0
full = server = far_slot = None


@spmd.case
def init():
    global rank, size, full, server, far_slot
    cl.init()
    rank, size = cl.rank(), cl.size()
    assert size == 2 and cl.num_servers() == 1
    job = lifecycle.current().job
    full, server = job.full, job.servers[0]
    far_slot = (full.Get_attr(MPI.TAG_UB) or 32767) - 100  # no slot of the worker's own client comes near


def raw(data, tag):
    full.Send([data, MPI.BYTE], dest=server, tag=tag)


@spmd.case
def hostile_messages():
    """Worker 1 sends them; worker 0 pushes the two rounds whose values worker 1 corrupts, which must be
    refused naming worker 1."""
    if rank == 1:
        pickled = planted(sys.argv[1])
        raw(pickled, protocol.TAG_PUSH)                                  # a pickle where a header belongs
        full.send(Planted(sys.argv[1]), dest=server, tag=protocol.TAG_PUSH)  # mpi4py's own pickling send
        raw(b"\x02" * (protocol.Push.LAYOUT.max_size + 100), protocol.TAG_PUSH)  # longer than any header
        fields = dict(key="x", part=0, total=4, wire="float32", count=4, op=0, contributors=2, worker=1,
                      slot=far_slot)
        raw(protocol.Push(**dict(fields, worker=0)).encode(), protocol.TAG_PUSH)  # naming worker 0
        raw(protocol.Push(**dict(fields, contributors=9)).encode(), protocol.TAG_PUSH)  # more workers than the job's
        huge = 1 << 40
        raw(protocol.Push(**dict(fields, total=huge, count=huge)).encode(), protocol.TAG_PUSH)  # 4 TiB of values
        raw(pickled, protocol.TAG_BYE)                                   # notices are empty: not a pickle
        raw(pickled, protocol.TAG_EXIT)                                  # (an exit that counted would end the server)
        raw(pickled, protocol.TAG_GEO)
        raw(protocol.GeoMessage("open", "geo/evil#0", 0, 4, 4, "float32", 0, 1).encode(), protocol.TAG_GEO)  # worker 1 opens
        # well-formed headers whose values are shorter, then longer, than declared: their rounds are refused
        raw(protocol.Push(**dict(fields, key="short")).encode(), protocol.TAG_PUSH)
        raw(np.ones(3, np.float32), far_slot)
        raw(protocol.Push(**dict(fields, key="long", slot=far_slot + 1)).encode(), protocol.TAG_PUSH)
        raw(np.ones(8, np.float32), far_slot + 1)
    else:
        for key in ("short", "long"):
            spmd.expect_error(ServerError, "worker 1's push carried",
                              lambda: cl.push_pull(np.ones(4, np.float32), op=cl.Sum, name=key),
                              f"push_pull {key!r}, whose other push was corrupted")
    cl.barrier()


@spmd.case
def push_pull_afterwards():
    for n in (1, 1000, 5000):
        x = np.arange(n, dtype=np.float32) * (rank + 1)
        out = cl.push_pull(x, op=cl.Sum, name=f"after.{n}")
        assert np.array_equal(out, np.arange(n, dtype=np.float32) * 3), (n, out[:4])


@spmd.case
def geo_sgd_afterwards():
    w = np.full(100, 1.0 + rank, np.float32)
    geo = GeoSGD({"w": w}, k=1, staleness=0, average=False, overlap=False, name="after")
    w += 1.0
    geo.step()
    assert np.array_equal(w, np.full(100, 3.0, np.float32)), w[:4]  # worker 0's start plus both deltas
    geo.close()


@spmd.case
def shutdown():
    cl.shutdown()


if __name__ == "__main__":
    spmd.main()
