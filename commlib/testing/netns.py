"""The network plumbing of an emulated cluster: namespaces, veth pairs, one bridge, tbf shaping.

Every object carries the cluster's name as a prefix, so that several clusters (and other people's
namespaces) live side by side, and :func:`leftovers` can find exactly what a cluster left behind. Inside a
host's namespace the link is called ``eth0``, as on a real host; outside, its peer end (a bridge port)
is ``<name>-h<i>``. Addresses are a /24 that no interface of this machine (in any namespace) overlaps.
Each host's name resolves to its address on every host, as a cluster's DNS would: ``ip netns exec`` mounts
``/etc/netns/<host>/hosts`` over ``/etc/hosts`` (torchrun's c10d rendezvous, for one, resolves its own name).
"""

from __future__ import annotations

import ipaddress
import os
import random
import re
import shutil
import subprocess
from typing import Iterable, Sequence

HOST_IFACE = "eth0"  # the link's name inside every host's namespace
ETC_NETNS = "/etc/netns"  # ``ip netns exec <ns>`` bind-mounts the files of <this>/<ns>/ over /etc's
TBF_BURST = "256kb"
TBF_LATENCY = "50ms"
# Where subnets are drawn from: private space that machines rarely use (10.200.0.0 - 10.254.255.0).
_SUBNET_POOL = [(a, b) for a in range(200, 255) for b in range(256)]


class ClusterUnavailable(RuntimeError):
    """This machine cannot host an emulated cluster; the message says what is missing."""


def sh(*args: str, check: bool = True, netns: str | None = None) -> subprocess.CompletedProcess:
    """Run a command (inside ``netns`` when given), capturing its output; raise with stderr on failure."""
    cmd = (["ip", "netns", "exec", netns] if netns else []) + list(args)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done


def missing_prerequisites(shaped: bool) -> list[str]:
    """What this machine lacks to run a cluster (empty when nothing): root, the tools, namespaces."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces, veth and tc need CAP_NET_ADMIN; run as root)")
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux")) + ((("tc", "iproute2"),) if shaped else ()):
        if shutil.which(tool) is None:
            missing.append(f"the `{tool}` command (Debian package {package})")
    if not missing:
        probe = subprocess.run(["unshare", "--net", "--uts", "true"], capture_output=True, text=True)
        if probe.returncode != 0:
            missing.append(f"network/UTS namespaces (`unshare --net --uts true`: {probe.stderr.strip()})")
    return missing


def namespaces() -> list[str]:
    """Names of every named network namespace on this machine."""
    out = sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def links() -> list[str]:
    """Names of the network interfaces in the root namespace."""
    out = sh("ip", "-o", "link", "show", check=False).stdout
    return [m.group(1).split("@")[0] for m in re.finditer(r"^\d+:\s+(\S+?):", out, re.M)]


def used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network configured on any interface, in the root namespace and every named one."""
    nets = []
    for ns in [None, *namespaces()]:
        cmd = ["ip"] + (["-n", ns] if ns else []) + ["-o", "-4", "addr", "show"]
        out = subprocess.run(cmd, capture_output=True, text=True).stdout
        for cidr in re.findall(r"\binet (\d+\.\d+\.\d+\.\d+/\d+)", out):
            nets.append(ipaddress.ip_network(cidr, strict=False))
    return nets


def free_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    """A /24 from 10.200-254.x.0 that overlaps no network in use (call under the cluster lock)."""
    used = used_networks()
    for a, b in rng.sample(_SUBNET_POOL, len(_SUBNET_POOL)):
        net = ipaddress.ip_network(f"10.{a}.{b}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise ClusterUnavailable("no free /24 left in 10.200.0.0-10.254.255.0")


def shape(dev: str, rate: str, netns: str | None = None) -> None:
    """Cap the egress of ``dev`` at ``rate`` (tc syntax, e.g. ``1gbit``) with a token bucket."""
    done = sh("tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", TBF_BURST,
              "latency", TBF_LATENCY, netns=netns, check=False)
    if done.returncode != 0:
        hint = (" (this kernel lacks the tbf qdisc: load sch_tbf)" if "No such file" in done.stderr
                or "Unknown qdisc" in done.stderr else "")
        raise ClusterUnavailable(f"cannot shape {dev} with tbf rate {rate}: {done.stderr.strip()}{hint}")


def create(name: str, hosts: Sequence[str], subnet: ipaddress.IPv4Network,
           rate: str | Sequence[str | None] | None) -> None:
    """Bridge ``<name>-br`` holding the subnet's first address, and per host a namespace with ``eth0`` at
    the next addresses, its peer on the bridge; both ends shaped at ``rate`` (or host i's at ``rate[i]``)
    when given."""
    rates = list(rate) if isinstance(rate, (list, tuple)) else [rate] * len(hosts)
    addresses = list(subnet.hosts())
    bridge = f"{name}-br"
    sh("ip", "link", "add", bridge, "type", "bridge")
    sh("ip", "addr", "add", f"{addresses[0]}/{subnet.prefixlen}", "dev", bridge)
    sh("ip", "link", "set", bridge, "up")
    for i, host in enumerate(hosts):
        outer = f"{name}-h{i}"
        sh("ip", "netns", "add", host)
        sh("ip", "link", "add", outer, "type", "veth", "peer", "name", HOST_IFACE, "netns", host)
        sh("ip", "link", "set", outer, "master", bridge)
        sh("ip", "link", "set", outer, "up")
        sh("ip", "-n", host, "addr", "add", f"{addresses[1 + i]}/{subnet.prefixlen}", "dev", HOST_IFACE)
        sh("ip", "-n", host, "link", "set", HOST_IFACE, "up")
        sh("ip", "-n", host, "link", "set", "lo", "up")
        if rates[i]:
            shape(outer, rates[i])                  # what the host receives
            shape(HOST_IFACE, rates[i], netns=host)  # what the host sends
    names = "".join(f"{addresses[1 + i]}\t{host}\n" for i, host in enumerate(hosts))
    for host in hosts:
        os.makedirs(os.path.join(ETC_NETNS, host), exist_ok=True)
        with open(os.path.join(ETC_NETNS, host, "hosts"), "w") as f:
            f.write(f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{names}")


def kill_processes(ns: str) -> None:
    """SIGKILL every process still running inside the namespace (a rank a failed job left behind)."""
    out = sh("ip", "netns", "pids", ns, check=False).stdout
    for pid in out.split():
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass


def destroy(name: str, hosts: Iterable[str]) -> list[str]:
    """Remove the namespaces, veths and bridge of cluster ``name`` (the qdiscs go with their links);
    return the errors (empty when everything is gone). Safe to call on a half-built cluster."""
    errors = []
    present_ns = set(namespaces())
    for host in hosts:
        if host in present_ns:
            kill_processes(host)
            done = sh("ip", "netns", "del", host, check=False)
            if done.returncode != 0:
                errors.append(f"ip netns del {host}: {done.stderr.strip()}")
    for link in links():
        if link.startswith(f"{name}-"):
            done = sh("ip", "link", "del", link, check=False)
            if done.returncode != 0 and link in links():
                errors.append(f"ip link del {link}: {done.stderr.strip()}")
    for names in _name_files(f"{name}-"):
        shutil.rmtree(names, ignore_errors=True)
        if os.path.exists(names):
            errors.append(f"cannot remove {names}")
    return errors


def _name_files(prefix: str) -> list[str]:
    """The folders of host-name files (``/etc/netns/<host>``) whose host name starts with ``prefix``."""
    if not os.path.isdir(ETC_NETNS):
        return []
    return [os.path.join(ETC_NETNS, d) for d in sorted(os.listdir(ETC_NETNS)) if d.startswith(prefix)]


def leftovers(prefix: str) -> list[str]:
    """Namespaces, root-namespace interfaces (with their qdiscs) and host-name files whose name starts with
    ``prefix``."""
    found = [f"netns {ns}" for ns in namespaces() if ns.startswith(prefix)]
    found += [f"link {link}" for link in links() if link.startswith(prefix)]
    found += [f"names {names}" for names in _name_files(prefix)]
    return found
