"""Where the job's summation server listens. argv[1]: the address it must listen on, and only there.

Every worker pushes through the server (it is reachable); a worker on the server's host (same network
namespace) also reads the host's listening TCP sockets (/proc/net/tcp): the server's port is bound to
that address only, never to 0.0.0.0, and a connection to it through another of the host's addresses is
refused. Prints ``bind ok on worker R`` (and ``checked the sockets`` where it could)."""

import socket
import struct
import sys

import numpy as np

import commlib as cl
from commlib.server import tcp

expected = sys.argv[1]
cl.init()
rank = cl.rank()
job = cl.api._rt().job
endpoint = job.endpoints[job.servers[0]]
assert [a for a, _ in endpoint.places] == [expected], (endpoint, expected)
port = endpoint.places[0][1]

out = cl.push_pull(np.full(8, rank + 1.0, np.float32), op=cl.Sum, name="reach")
assert np.all(out == sum(range(1, cl.size() + 1))), out


def listening(port):
    """The local addresses of this host's sockets listening on ``port``."""
    found = []
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:  # TCP_LISTEN
                found.append(socket.inet_ntoa(struct.pack("<I", int(address, 16))))
    return found


if job.hosts[job.servers[0]] == socket.gethostname():
    assert listening(port) == [expected], (listening(port), expected)
    for other in set(tcp.local_addresses()) - {expected}:
        probe = socket.socket()
        probe.settimeout(5)
        try:
            probe.connect((other, port))
        except ConnectionRefusedError:
            pass
        else:
            raise AssertionError(f"the server's port {port} answers on {other} too")
        finally:
            probe.close()
    print(f"bind ok on worker {rank}: checked the sockets ({expected}:{port})", flush=True)
else:
    print(f"bind ok on worker {rank}", flush=True)
cl.shutdown()
