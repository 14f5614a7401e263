"""Where the job's summation server listens. ``bind_check.py ADDRESS``: the address it must listen on, and
only there; ``bind_check.py --missing IFACE``: COMMLIB_NETWORK_INTERFACE names an interface the hosts lack,
and init() must fail naming it.

Every worker pushes through the server (it is reachable); a worker on the server's host (same network
namespace) also reads the host's listening TCP sockets (/proc/net/tcp): the server's port is bound to
that address only, never to 0.0.0.0, and a connection to it through another of the host's addresses is
refused (the case is skipped on the other hosts). Named cases on every worker (tests/spmd.py)."""

import socket
import struct
import sys

import numpy as np

import commlib as cl
import spmd
from commlib import lifecycle
from commlib.server import tcp

job = endpoint = None


@spmd.case
def init():
    global job, endpoint
    cl.init()
    job = lifecycle.current().job
    endpoint = job.endpoints[job.servers[0]]


@spmd.case
def listens_on_the_job_address():
    expected = sys.argv[1]
    assert [address for address, _ in endpoint.places] == [expected], (endpoint, expected)


@spmd.case
def push_pull_reaches_the_server():
    out = cl.push_pull(np.full(8, cl.rank() + 1.0, np.float32), op=cl.Sum, name="reach")
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


@spmd.case
def sockets_bound_to_that_address_only():
    if job.hosts[job.servers[0]] != socket.gethostname():
        spmd.skip("the server runs on another host: its sockets are not in this host's table")
    expected = sys.argv[1]
    port = endpoint.places[0][1]
    assert listening(port) == [expected], (listening(port), expected)
    for other in set(tcp.local_addresses()) - {expected}:
        probe = socket.socket()
        probe.settimeout(30)
        try:
            probe.connect((other, port))
        except ConnectionRefusedError:
            pass
        else:
            raise AssertionError(f"the server's port {port} answers on {other} too")
        finally:
            probe.close()


@spmd.case
def shutdown():
    cl.shutdown()


@spmd.case
def init_fails_naming_the_interface():
    interface = sys.argv[2]
    spmd.expect_error(cl.CommlibError, f"COMMLIB_NETWORK_INTERFACE={interface}: this host", cl.init,
                      "init() with an interface the host lacks")


if __name__ == "__main__":
    if sys.argv[1] == "--missing":
        spmd.main(["init_fails_naming_the_interface"])
    else:
        spmd.main(["init", "listens_on_the_job_address", "push_pull_reaches_the_server",
                   "sockets_bound_to_that_address_only", "shutdown"])
