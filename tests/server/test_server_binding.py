"""Summation servers listen on the job's interface only (docs/servers.md): the address the cluster's
hosts reach each other on (found from the route to the other hosts), loopback when the whole job is on
one host, the interface COMMLIB_NETWORK_INTERFACE names; never every address of the host. Plus the
choice itself, in one process (commlib.server.tcp.job_addresses)."""

import re
import sys

import pytest

from commlib.server import tcp
from mpirun import check_report, job_env, read_report, run_mpmd, worker_path

SOCKETS = "sockets_bound_to_that_address_only"
CASES = ["listens_on_the_job_address", "push_pull_reaches_the_server"]


@pytest.mark.cluster
@pytest.mark.mpi
def test_on_emulated_hosts_the_server_listens_on_the_job_address_only(make_cluster):
    """Workers on hosts 0 and 1, the server beside worker 1: it listens on host 1's address on the
    cluster's link (the route to host 0), not on 0.0.0.0 and not on loopback; worker 0 reaches it, and
    worker 1 reads the host's socket table."""
    cluster = make_cluster([1, 1])
    server_host = cluster.host_address(1)
    programs = [([0, 1], [sys.executable, str(worker_path("bind_check.py")), server_host]),
                ([1], [sys.executable, "-m", "commlib.server"])]
    done = cluster.mpiexec_mpmd(programs, timeout=120, env=job_env({"COMMLIB_SERVER_TIMEOUT": "20"}))
    check_report(done.stdout, range(2), CASES)
    assert read_report(done.stdout).passed(SOCKETS) == {1}, done.stdout[-3000:]


@pytest.mark.mpi
def test_on_one_host_the_server_listens_on_loopback_only():
    run_mpmd(2, 1, "bind_check.py", "127.0.0.1", timeout=120, cases=CASES + [SOCKETS])


def an_interface():
    """A non-loopback interface of this machine and its address, or skip."""
    found = [(name, address) for name, address in tcp.interfaces().items() if not address.startswith("127.")]
    if not found:
        pytest.skip("this machine has no IPv4 interface besides loopback")
    return found[0]


@pytest.mark.mpi
def test_the_server_listens_on_the_interface_named():
    name, address = an_interface()
    run_mpmd(2, 1, "bind_check.py", address, env={"COMMLIB_NETWORK_INTERFACE": name}, timeout=120,
             cases=CASES + [SOCKETS])


@pytest.mark.mpi
def test_an_interface_this_host_lacks_fails_the_job_naming_it():
    """Every process gets the same verdict from the roll call; the server's line is the one certain to be
    printed (it exits non-zero at once, and mpiexec may end the workers before they report)."""
    out = run_mpmd(2, 1, "bind_check.py", "--missing", "nosuch0", env={"COMMLIB_NETWORK_INTERFACE": "nosuch0"},
                   expect_fail=True, timeout=120, report=False)
    assert re.search(r"commlib-server: .*COMMLIB_NETWORK_INTERFACE=nosuch0: this host", out), out[-3000:]


# -- the choice, in one process -------------------------------------------------------------------------
@pytest.fixture
def host(monkeypatch):
    """A host 'b' with eth0 10.1.0.2, docker0 172.17.0.1 and loopback; routes from a table."""
    own = {"lo": "127.0.0.1", "eth0": "10.1.0.2", "docker0": "172.17.0.1"}
    routes = {"10.1.0.3": "10.1.0.2", "10.1.0.4": "10.1.0.2", "192.168.5.9": "10.1.0.2"}
    names = {}
    monkeypatch.setattr(tcp, "interfaces", lambda: dict(own))
    monkeypatch.setattr(tcp, "route_source", lambda destination: routes.get(destination))
    monkeypatch.setattr(tcp, "resolve", lambda name: names.get(name))
    return names


def test_the_interface_named_wins(host):
    assert tcp.job_addresses("docker0", "b", ["a", "b"], [("10.1.0.3",), ()]) == ("172.17.0.1",)
    assert tcp.job_addresses("eth0,lo", "b", ["a", "b"], [(), ()]) == ("10.1.0.2", "127.0.0.1")
    with pytest.raises(tcp.NoInterface, match="COMMLIB_NETWORK_INTERFACE=ib0: this host \\(b\\) has no interface ib0"):
        tcp.job_addresses("ib0", "b", ["a", "b"], [(), ()])


def test_one_host_listens_on_loopback(host):
    assert tcp.job_addresses("", "b", ["b", "b", "b"], [("10.1.0.2",)] * 3) == ("127.0.0.1",)


def test_the_host_name_resolving_to_an_own_address_wins_over_routes(host):
    host["b"] = "10.1.0.2"
    assert tcp.job_addresses("", "b", ["a", "b"], [("192.168.5.9",), ()]) == ("10.1.0.2",)
    host["b"] = "127.0.1.1"  # Debian's /etc/hosts: not an address other hosts reach
    assert tcp.job_addresses("", "b", ["a", "b"], [("10.1.0.3", "127.0.0.1"), ()]) == ("10.1.0.2",)


def test_the_route_to_the_other_hosts_decides_ignoring_addresses_every_host_has(host):
    # every host has a docker0 at 172.17.0.1: that one is this host's own, not a way to the others
    others = [("10.1.0.3", "172.17.0.1", "127.0.0.1"), ("10.1.0.4", "172.17.0.1", "127.0.0.1"), ()]
    assert tcp.job_addresses("", "b", ["a", "c", "b"], others) == ("10.1.0.2",)
    with pytest.raises(tcp.NoInterface, match="set COMMLIB_NETWORK_INTERFACE"):
        tcp.job_addresses("", "b", ["a", "b"], [("172.17.0.1", "8.8.8.8"), ()])
