"""Worker wrapper for jobs on an emulated cluster: check that commlib sees the cluster's hosts (the case
``node_layout``, which every rank's plan then begins with), then run another worker as if launched directly.

    python on_cluster.py RANKS_PER_HOST WORKER [ARGS...]     (RANKS_PER_HOST: e.g. 2,1)

The node layout must come from MPI's shared-memory split, so COMMLIB_LOCAL_SIZE must not be set; every
rank checks its local/cross rank and size against the hosts that hydra filled in order.
"""

import os
import runpy
import socket
import sys

import spmd


def main() -> None:
    layout, worker, *args = sys.argv[1:]
    ranks_per_host = [int(k) for k in layout.split(",")]

    @spmd.first_case
    def node_layout() -> None:
        import commlib as cl

        assert "COMMLIB_LOCAL_SIZE" not in os.environ, "the node layout must come from MPI, not COMMLIB_LOCAL_SIZE"
        cl.init()
        try:
            rank = cl.rank()
            assert cl.size() == sum(ranks_per_host), (cl.size(), ranks_per_host)
            host = next(i for i in range(len(ranks_per_host)) if rank < sum(ranks_per_host[:i + 1]))
            got = (cl.cross_size(), cl.cross_rank(), cl.local_size(), cl.local_rank())
            want = (len(ranks_per_host), host, ranks_per_host[host], rank - sum(ranks_per_host[:host]))
            assert got == want, (f"rank {rank} on {socket.gethostname()}: (cross_size, cross_rank, local_size, "
                                 f"local_rank) = {got}, expected {want} for hosts {ranks_per_host}")
            assert socket.gethostname().endswith(f"-h{host}"), f"rank {rank} runs on {socket.gethostname()}"
        finally:
            cl.shutdown()

    sys.argv = [worker, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(worker)))
    runpy.run_path(worker, run_name="__main__")


if __name__ == "__main__":
    main()
