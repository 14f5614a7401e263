"""Worker 1 sends the summation server what the protocol does not allow, over MPI, on the job's own
communicator (argv[1]: a path a planted pickle would create if ever loaded); then both workers run
push_pull and Geo-SGD, which must give numpy's results. Prints ``hostile ok on worker R``."""

import pickle
import sys

import numpy as np
from mpi4py import MPI

import commlib as cl
from commlib.geo import GeoSGD
from commlib.server import protocol
from commlib.server.client import ServerError

planted_path = sys.argv[1]


class Planted:
    def __reduce__(self):
        return (open, (planted_path, "w"))


cl.init()
rank, size = cl.rank(), cl.size()
assert size == 2 and cl.num_servers() == 1
job = cl.api._rt().job
full, server = job.full, job.servers[0]
far_slot = (full.Get_attr(MPI.TAG_UB) or 32767) - 100  # no slot of the worker's own client comes near


def raw(data, tag):
    full.Send([data, MPI.BYTE], dest=server, tag=tag)


if rank == 1:
    pickled = pickle.dumps(Planted())
    raw(pickled, protocol.TAG_PUSH)                                  # a pickle where a header belongs
    full.send(Planted(), dest=server, tag=protocol.TAG_PUSH)         # mpi4py's own pickling send
    raw(b"\x02" * (protocol.Push.LAYOUT.max_size + 100), protocol.TAG_PUSH)  # longer than any header
    fields = dict(key="x", part=0, total=4, wire="float32", count=4, op=0, contributors=2, worker=1, slot=far_slot)
    raw(protocol.Push(**dict(fields, worker=0)).encode(), protocol.TAG_PUSH)  # naming worker 0
    raw(protocol.Push(**dict(fields, contributors=9)).encode(), protocol.TAG_PUSH)  # more workers than the job's
    huge = 1 << 40
    raw(protocol.Push(**dict(fields, total=huge, count=huge)).encode(), protocol.TAG_PUSH)  # 4 TiB of values
    raw(pickle.dumps(None), protocol.TAG_BYE)                        # the old pickled notices: not empty
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
        try:
            cl.push_pull(np.ones(4, np.float32), op=cl.Sum, name=key)
        except ServerError as exc:
            assert "worker 1's push carried" in str(exc), exc
        else:
            raise AssertionError(f"push_pull {key!r}: a corrupted push was summed")
cl.barrier()

# the honest work goes on
for n in (1, 1000, 5000):
    x = np.arange(n, dtype=np.float32) * (rank + 1)
    out = cl.push_pull(x, op=cl.Sum, name=f"after.{n}")
    assert np.array_equal(out, np.arange(n, dtype=np.float32) * 3), (n, out[:4])
w = np.full(100, 1.0 + rank, np.float32)
geo = GeoSGD({"w": w}, k=1, staleness=0, average=False, overlap=False, name="after")
w += 1.0
geo.step()
assert np.array_equal(w, np.full(100, 3.0, np.float32)), w[:4]  # worker 0's start plus both deltas
geo.close()
print(f"hostile ok on worker {rank}", flush=True)
cl.shutdown()
