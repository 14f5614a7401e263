"""Worker: NCCL's set-up and route over real MPI, with a stand-in NCCL library (the machine has no GPU).

The stand-in records what commlib asks of the library: the unique id (rank 0 of each communicator makes
one, every rank of it must receive that one), the communicators (size, id, rank), and queues each
collective on the host implementation of the stream interface, where it runs, when waited for, as MPI's
own collective among the ranks that share the id. So the NCCL route of the device path runs end to end
here: route decided from every rank's facts, one communicator per lane, packing, the reduction on the
lane's stream, unpacking, the events.

    mpiexec -n P python device_nccl_setup.py        (COMMLIB_LOCAL_SIZE=2 on 4 ranks: two "nodes")
"""

from __future__ import annotations

import contextlib
import numpy as np
from mpi4py import MPI

import spmd
from commlib.config import Config
from commlib.coordinator.device_path import DevicePath
from commlib.coordinator.requests import Entry, Handle, Kind, Meta, Response
from commlib.device import DeviceTensor
from commlib.engine import Engine
from commlib.ops import ReduceOp
from commlib.testing.streams import HostStreams
from commlib.topology import Topology
from commlib.transport import nccl as rules
from commlib.transport.mpi import MPITransport

rank, size = spmd.rank_and_size()
MPI_OPS = {0: MPI.SUM, 1: MPI.PROD, 2: MPI.MAX, 3: MPI.MIN}
NUMPY = {v: k for k, v in rules.NCCL_TYPES.items()}


class FakeNccl:
    """What commlib uses of ``cupy.cuda.nccl``, over MPI on host arrays (see the module docstring)."""

    def __init__(self, streams: HostStreams, version: int = 22703):
        self.streams = streams
        self.version = version
        self.ids_made = 0
        self.communicators: list = []

    def get_version(self):
        if not self.version:
            raise RuntimeError("no NCCL library")
        return self.version

    def get_unique_id(self):
        self.ids_made += 1
        return tuple(np.random.default_rng().integers(-128, 128, 128).tolist())

    def NcclCommunicator(self, ndev, unique_id, rank):  # noqa: N802 - CuPy's name
        communicator = FakeCommunicator(self, ndev, tuple(unique_id), rank)
        self.communicators.append(communicator)
        return communicator


class FakeCommunicator:
    def __init__(self, library: FakeNccl, ndev: int, unique_id: tuple, rank: int):
        self.library, self.ndev, self.unique_id, self.rank = library, ndev, unique_id, rank
        # the ranks holding this id find each other: a split of the world by the id (collective over the
        # world; every rank makes its communicators in the same order)
        color = int.from_bytes(bytes((v & 0xFF) for v in unique_id[:4]), "little") & 0x3FFFFFFF
        self.comm = MPI.COMM_WORLD.Split(color, rank)
        assert self.comm.Get_size() == ndev and self.comm.Get_rank() == rank, "ids of one communicator differ"
        self.calls: list = []

    def _queue(self, name, stream, work):
        self.calls.append(name)
        streams = self.library.streams
        streams.enqueue(streams.stream_at(stream), ("nccl_" + name,), work)

    def allReduce(self, send, recv, count, dtype, op, stream):  # noqa: N802
        streams = self.library.streams
        source, target = streams.array_at(send), streams.array_at(recv)

        def run():
            values = source.view(NUMPY[dtype])[:count].copy()
            if NUMPY[dtype].itemsize == 2 and NUMPY[dtype].kind != "i":  # halves: reduce in float64
                wide = np.empty_like(values, np.float64)
                self.comm.Allreduce(values.astype(np.float64), wide, MPI_OPS[op])
                values = wide.astype(NUMPY[dtype])
            else:
                self.comm.Allreduce(MPI.IN_PLACE, values, MPI_OPS[op])
            target.view(NUMPY[dtype])[:count] = values
        self._queue("allReduce", stream, run)

    def reduceScatter(self, send, recv, count, dtype, op, stream):  # noqa: N802
        streams = self.library.streams
        source, target = streams.array_at(send), streams.array_at(recv)

        def run():
            whole = source.view(NUMPY[dtype])[:count * self.ndev].astype(np.float64)
            self.comm.Allreduce(MPI.IN_PLACE, whole, MPI_OPS[op])
            target.view(NUMPY[dtype])[:count] = whole[self.rank * count:(self.rank + 1) * count]
        self._queue("reduceScatter", stream, run)

    def allGather(self, send, recv, count, dtype, stream):  # noqa: N802
        streams = self.library.streams
        source, target = streams.array_at(send), streams.array_at(recv)

        def run():
            gathered = np.empty(count * self.ndev, NUMPY[dtype])
            self.comm.Allgather(source.view(NUMPY[dtype])[:count].copy(), gathered)
            target.view(NUMPY[dtype])[:count * self.ndev] = gathered
        self._queue("allGather", stream, run)

    def destroy(self):
        self.comm.Free()


def engine_pair():
    """Two lanes' engines, as the runtime makes them (each on its own duplicate of the world)."""
    config = Config.load()
    topology = Topology.detect(MPI.COMM_WORLD, config.local_size)
    return [Engine(MPITransport.duplicate(MPI.COMM_WORLD), topology, config) for _ in range(2)], topology


def allreduce(path: DevicePath, streams: HostStreams, arrays, name, op=int(ReduceOp.SUM), algorithm="nccl",
              compression="none"):
    user = streams.new_stream("user")
    tensors = [DeviceTensor.submitted(streams.tensor(a, user), streams) for a in arrays]
    metas = [Meta(f"{name}.{i}", Kind.ALLREDUCE, t.dtype.name, t.shape, op, algorithm=algorithm,
                  compression=compression, device="cuda") for i, t in enumerate(tensors)]
    entries = [Entry(m, t, t, Handle(m.name)) for m, t in zip(metas, tensors)]
    how = path.allreduce(Response(Kind.ALLREDUCE, metas), entries, lambda *a, **k: contextlib.nullcontext())
    return how, [streams.read(e.handle.result().consumed()) for e in entries]



@spmd.case
def init():
    MPI.COMM_WORLD.Barrier()


@spmd.case
def unique_id_from_rank_0_reaches_every_rank_once_per_lane():
    streams = HostStreams(gpu=(0, rank, 0))
    library = FakeNccl(streams)
    (first, second), topology = engine_pair()
    if topology.cross_size > 1:
        spmd.skip("one node only (the hierarchical case has its own)")
    ids = []
    for engine in (first, second):
        comm = rules.NcclComm(library, engine.transport, streams)
        ids.append(comm.comm.unique_id)
        assert (comm.comm.ndev, comm.comm.rank) == (size, rank)
        every = MPI.COMM_WORLD.allgather(comm.comm.unique_id)
        assert all(i == every[0] for i in every), "ranks of one communicator got different unique ids"
        comm.close()
    assert ids[0] != ids[1], "two lanes share a unique id: they would share one communicator"
    assert library.ids_made == (2 if rank == 0 else 0), f"rank {rank} made {library.ids_made} unique ids"
    for engine in (first, second):
        engine.close()


@spmd.case
def route_with_a_gpu_per_rank_is_nccl_and_reduces():
    streams = HostStreams(gpu=(0, rank, 0))
    (engine, other), topology = engine_pair()
    other.close()
    path = DevicePath(engine, 64, nccl=FakeNccl(streams))
    path.bind(streams)
    route, why = path.decide_route()
    want = rules.NCCL if topology.cross_size == 1 else rules.HIERARCHICAL
    assert route == want, (route, why)
    arrays = [np.arange(n, dtype=np.float32) * (rank + 1) for n in (3, 0, 5, 17)]
    for compression, op, rtol in (("none", ReduceOp.SUM, 1e-6), ("fp16", ReduceOp.SUM, 2e-3),
                                  ("none", ReduceOp.MAX, 0)):
        how, got = allreduce(path, streams, arrays, f"nccl.{compression}.{op.name}", op=int(op),
                             compression=compression)
        assert how == want
        for a, g in zip(arrays, got):
            every = np.stack([a / (rank + 1) * (r + 1) for r in range(size)])
            expected = every.sum(0) if op is ReduceOp.SUM else every.max(0)
            np.testing.assert_allclose(g, expected, rtol=rtol)
    average_how, (mean,) = allreduce(path, streams, [np.full(7, rank + 1.0)], "nccl.avg", op=int(ReduceOp.AVERAGE),
                                     algorithm="")   # auto takes the route too (one rank exchanges nothing)
    assert average_how == (want if size > 1 else "local") and np.allclose(mean, (size + 1) / 2), (average_how, mean)
    path.close()
    engine.close()


@spmd.case
def a_shared_gpu_means_staged_and_says_why():
    streams = HostStreams(gpu=(0, 0, 0))  # every rank on "the" GPU, as on the lent one-GPU machines
    (engine, other), topology = engine_pair()
    other.close()
    path = DevicePath(engine, 64, nccl=FakeNccl(streams))
    path.bind(streams)
    route, why = path.decide_route()
    if size > 1 and topology.local_size > 1:
        assert route == rules.STAGED and "share one GPU" in why and "NCCL refuses" in why, why
        how, (got,) = allreduce(path, streams, [np.full(4, rank + 1.0, np.float32)], "shared")
        assert how == rules.STAGED and np.all(got == size * (size + 1) / 2)
    path.close()
    engine.close()


@spmd.case
def no_library_on_one_rank_means_staged_everywhere():
    streams = HostStreams(gpu=(0, rank, 0))
    (engine, other), _ = engine_pair()
    other.close()
    path = DevicePath(engine, 64, nccl=FakeNccl(streams, version=0 if rank == size - 1 else 22703))
    path.bind(streams)
    route, why = path.decide_route()
    assert route == rules.STAGED and f"rank(s) [{size - 1}] cannot load NCCL" in why, why
    path.close()
    engine.close()


@spmd.case
def shutdown():
    MPI.COMM_WORLD.Barrier()


if __name__ == "__main__":
    spmd.main()
