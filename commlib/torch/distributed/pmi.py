"""One MPI world for processes no MPI launcher started (torchrun, ``multiprocessing``), from torch's store.

An MPI process finds its peers through its launcher's process manager interface (PMI): ``MPI_Init`` asks it
for its rank and the world's size, publishes its address (``put``), waits for everyone (``barrier``) and
reads the others' addresses (``get``). Started without a launcher, MPI makes each process a world of its
own, and such singletons cannot even join later (MPICH gives every singleton the same identity, so
``MPI_Comm_connect`` between two of them fails: "Local and remote groups ... must not overlap").

Every process of a torch job shares a key-value store, so the few PMI-1 requests ``MPI_Init`` makes can
be answered from it: :func:`start` sets ``PMI_FD``, ``PMI_RANK`` and ``PMI_SIZE`` as a launcher would, and
a helper process answers on that socket: ``put`` and ``get`` become store keys, ``barrier_in`` a counter
every rank adds to. ``MPI_Init`` then builds one world of torch's size with torch's ranks. The helper is
forked before ``MPI_Init`` because ``MPI_Init`` holds Python's GIL while it waits for the answers (a
thread could not answer), and it exits when the process does (its socket closes).

This is MPICH's PMI-1 wire protocol (``cmd=... key=value``), which MPICH's ``MPI_Init`` speaks to hydra and
to Slurm's PMI-2 plugin alike; an MPI that does not speak it raises in ``MPI_Init``.
"""

from __future__ import annotations

import os
import socket
import uuid

#: The store keys of this exchange live under this prefix of the process group's store.
PREFIX = "commlib/pmi/"


def start(store, rank: int, size: int) -> None:
    """Before MPI is initialized: make ``MPI_Init`` in this process find the other ``size - 1`` ranks
    through ``store`` (a torch.distributed Store shared by all of them)."""
    if rank == 0:
        store.set(PREFIX + "kvsname", f"commlib-{uuid.uuid4().hex[:16]}")
    kvsname = store.get(PREFIX + "kvsname").decode()
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the child forks the helper and exits at once, so nobody has to reap the helper
        try:
            ours.close()
            if os.fork() == 0:
                _serve(theirs, store.clone(), rank, size, kvsname)
        finally:
            os._exit(0)
    theirs.close()
    os.waitpid(pid, 0)
    fd = ours.detach()  # MPI owns it now: open until the process ends (MPI_Finalize runs after Python's teardown)
    os.environ.update(PMI_FD=str(fd), PMI_RANK=str(rank), PMI_SIZE=str(size))


def _serve(conn: socket.socket, store, rank: int, size: int, kvsname: str) -> None:
    """Answer MPI's PMI-1 requests on ``conn`` until it says ``finalize`` or the socket closes."""
    stream = conn.makefile("rwb", buffering=0)
    barriers = 0

    def reply(text: str) -> None:
        stream.write(text.encode() + b"\n")

    while True:
        line = stream.readline()
        if not line:
            return
        fields = dict(token.split("=", 1) for token in line.decode().split() if "=" in token)
        cmd = fields.get("cmd", "")
        if cmd == "init":
            reply("cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0")
        elif cmd == "get_maxes":
            reply("cmd=maxes kvsname_max=256 keylen_max=256 vallen_max=1024 rc=0")
        elif cmd == "get_appnum":
            reply("cmd=appnum appnum=0 rc=0")
        elif cmd == "get_my_kvsname":
            reply(f"cmd=my_kvsname kvsname={kvsname} rc=0")
        elif cmd == "get_universe_size":
            reply(f"cmd=universe_size size={size} rc=0")
        elif cmd == "put":
            store.set(PREFIX + "kvs/" + fields.get("key", ""), fields.get("value", ""))
            reply("cmd=put_result rc=0")
        elif cmd == "get":
            key = PREFIX + "kvs/" + fields.get("key", "")
            if store.check([key]):  # gets follow a barrier after the puts: a missing key is optional
                reply(f"cmd=get_result rc=0 value={store.get(key).decode()}")
            else:
                reply("cmd=get_result rc=-1 msg=key_not_found")
        elif cmd == "barrier_in":
            barriers += 1
            key = f"{PREFIX}barrier/{barriers}"
            if store.add(key, 1) == size:
                store.set(key + "/done", "1")
            store.wait([key + "/done"])
            reply("cmd=barrier_out")
        elif cmd == "finalize":
            reply("cmd=finalize_ack")
            return
        elif cmd == "abort":
            return
        else:
            reply(f"cmd={cmd or 'unknown'} rc=-1 msg=commlib's PMI bridge does not serve {cmd or line!r}")
