"""What the torch backend's tests share: the environment of a job on emulated hosts."""

#: On emulated hosts: MPI's traffic over the hosts' links (UCX would use shared memory), and gloo on the
#: hosts' interface (it would advertise the loopback address its host name resolves to).
CLUSTER_ENV = {"UCX_TLS": "tcp,self", "GLOO_SOCKET_IFNAME": "eth0"}
