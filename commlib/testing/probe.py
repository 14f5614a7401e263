"""MPI program that reports what an (emulated) cluster looks like from inside, as one JSON line from rank 0.

    mpiexec ... python -m commlib.testing.probe [NBYTES]

Reports every rank's host name and MPI's shared-memory split (which ranks MPI counts as one node), and
times sending NBYTES (default 64 MiB) from rank 0 to the first rank of the next node and back an ack:
over a shaped link this takes at least NBYTES*8/rate, which shows that the bytes really crossed it.
"""

from __future__ import annotations

import json
import socket
import sys


def main() -> None:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    nbytes = int(sys.argv[1]) if len(sys.argv) > 1 else 64 << 20
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    node_leader = shared.allreduce(rank, op=MPI.MIN)
    local_size = shared.Get_size()
    shared.Free()
    hosts = comm.allgather(socket.gethostname())
    leaders = comm.allgather(node_leader)
    local_sizes = comm.allgather(local_size)
    peer = next((r for r in range(comm.Get_size()) if leaders[r] != leaders[0]), None)
    seconds = None
    if peer is not None and rank in (0, peer):
        payload = np.ones(nbytes, np.uint8)
        ack = np.zeros(1, np.uint8)
        for size in (1 << 16, nbytes):  # the first round opens the connection
            start = MPI.Wtime()
            if rank == 0:
                comm.Send(payload[:size], dest=peer)
                comm.Recv(ack, source=peer)
            else:
                comm.Recv(payload[:size], source=0)
                comm.Send(ack, dest=0)
            seconds = MPI.Wtime() - start
    if rank == 0:
        print(json.dumps({"hosts": hosts, "node_leaders": leaders, "local_sizes": local_sizes,
                          "peer": peer, "nbytes": nbytes, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
