"""torch's ``env://`` rendezvous inside a job an MPI launcher started (mpiexec, commlib-run, srun).

``init_process_group`` without a store reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``
(torchrun sets them); MPI launchers set none of them. When some are missing and MPI launched the process,
this rendezvous takes the rank and size from MPI's world (its workers, when the job also runs commlib's
summation servers) and has rank 0 host the store: rank 0 starts a
``TCPStore`` on a free port and tells the others its addresses over MPI; each connects to the first one
that answers with rank 0's token. So ``dist.init_process_group("commlib")`` (or ``"gloo"``) runs unchanged
under ``mpiexec -n 4 python train.py``. Everywhere else (all four variables set, or no MPI launcher)
torch's own ``env://`` runs as before.
"""

from __future__ import annotations

import datetime
import os
import uuid
from urllib.parse import parse_qs, urlparse

from ...config import mpi_launched

#: torch's variables of the env:// rendezvous.
ENV_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_TOKEN_KEY = "commlib/rendezvous/token"
_CONNECT_S = 5.0  # how long a rank tries one of rank 0's addresses before the next


def wrap(torch_env_handler):
    """torch's env:// handler, falling back to MPI's world where it would fail inside an MPI job."""

    def handler(url: str, timeout: datetime.timedelta = datetime.timedelta(minutes=30), **kwargs):
        query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
        given = {"RANK": "rank" in query, "WORLD_SIZE": "world_size" in query}
        missing = [v for v in ENV_VARIABLES if not given.get(v) and not os.environ.get(v)]
        if not missing or not mpi_launched():
            return torch_env_handler(url, timeout=timeout, **kwargs)
        return _from_mpi(query, timeout)

    handler.commlib_wrapped = torch_env_handler
    return handler


def _from_mpi(query: dict, timeout: datetime.timedelta):
    """Yield (store, rank, world_size) for MPI's world (a generator, as torch's handlers are)."""
    import torch.distributed as dist

    from ...server.tcp import local_addresses
    from .internals import workers_communicator

    comm = workers_communicator()  # a job's summation servers are not torch ranks
    rank, size = comm.Get_rank(), comm.Get_size()
    for key, mine in (("rank", rank), ("world_size", size)):
        if key in query and int(query[key]) != mine:
            raise ValueError(f"init_process_group: {key}={query[key]} was given, but the MPI launcher started this "
                             f"process as {key} {mine}; leave {key} out (it comes from MPI) or launch accordingly")
    endpoint = None
    if rank == 0:
        store = dist.TCPStore(local_addresses()[0], 0, size, True, timeout=timeout, wait_for_workers=False)
        token = uuid.uuid4().hex
        store.set(_TOKEN_KEY, token)
        endpoint = (local_addresses(), store.port, token)
    addresses, port, token = comm.bcast(endpoint, root=0)
    if rank != 0:
        store = _connect(addresses, port, token, size, timeout)
    yield store, rank, size
    raise RuntimeError("the MPI rendezvous of the commlib backend cannot rendezvous again: start a new job")


def _connect(addresses, port: int, token: str, size: int, timeout: datetime.timedelta):
    """A client of rank 0's store at the first of ``addresses`` that answers with ``token``."""
    import torch.distributed as dist

    tried = []
    for address in addresses:
        try:
            store = dist.TCPStore(address, port, size, False, timeout=datetime.timedelta(seconds=_CONNECT_S))
            if store.get(_TOKEN_KEY).decode() == token:
                store.set_timeout(timeout)
                return store
            tried.append(f"{address}:{port} is another process's store")
        except (RuntimeError, ValueError) as exc:  # torch raises DistNetworkError/DistStoreError (RuntimeErrors)
            tried.append(f"{address}:{port}: {str(exc).splitlines()[0]}")
    raise RuntimeError("commlib's rendezvous could not reach rank 0's store: " + "; ".join(tried))
