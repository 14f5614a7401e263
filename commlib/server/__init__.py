"""Summation servers (BytePS's architecture): extra ranks of the job that only sum.

Each worker pushes every partition of a tensor once to the server that owns it and receives the sum
once: S bytes out and S in per worker, against the ring allreduce's 2(n-1)/n S. That pays when the
servers bring links of their own (extra hosts); on the workers' hosts it costs what an allreduce does.

- :mod:`.protocol`: every message as fixed binary fields (nothing is unpickled), tags, and the rule that
  places a partition on a server (no MPI); :mod:`.mpi_messages` and :mod:`.tcp` carry them;
- :mod:`.discovery`: who is a worker and who a server, and where each server listens (the job's
  interface only), found when the job starts;
- :mod:`.loop`: the server (``python -m commlib.server``, ``commlib-server``);
- :mod:`.client`: the worker side, over a data plane handed to it (:mod:`.mpi_plane`, :mod:`.tcp_plane`);
- :mod:`.geo`, :mod:`.geo_client`: Geo-SGD at the servers and on the workers.

Importing this package does not import MPI. See docs/servers.md.
"""
