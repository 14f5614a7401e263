"""A Ray actor's side of a commlib job: it starts hydra's proxy for its node, and becomes an MPI rank itself.

hydra starts one proxy per host, and each proxy starts its host's ranks. Here the proxy of a node is started
by that node's first actor (:meth:`Member.start_proxy`, asked by the driver's launch server, which hydra
reaches through ``commlib.ray.shim`` where it would use ssh). The "rank" each proxy starts is a stand-in
(``commlib.ray.standin``): it hands the PMI address hydra gave it (``PMI_PORT``, ``PMI_ID``: hydra's
``-pmi-port`` mode, where a rank connects to its proxy over TCP) and the job's settings to its actor,
which then initializes MPI with them (:meth:`Member.join`) and so joins the job as that rank. The actor
process is the MPI process: the user's functions run there, as in Horovod on Ray, with the GPUs Ray gave
it. The stand-in lives as long as its actor's rank and ends with the status the actor gives it
(:meth:`Member.leave`), or with 1 when the actor is gone (killed, its node lost).

The stand-in and its actor meet on an abstract Unix socket (no file; the node's network namespace), named
with a random token that the stand-in must also send.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import threading

#: what a stand-in hands its actor: how to reach the proxy (PMI), MPI's own settings and the job's
#: settings (hydra passes mpiexec's environment and -genv values to the processes it starts)
HANDED = ("PMI_", "MPI_LOCAL", "MPIR_CVAR_", "UCX_", "FI_", "COMMLIB_", "HOROVOD_", "NCCL_", "OMP_NUM_THREADS")


def endpoint_name(token: str) -> str:
    """The abstract socket a stand-in finds its actor at."""
    return f"\0commlib-ray-{token}"


def send(conn: socket.socket, message: dict) -> None:
    conn.sendall((json.dumps(message) + "\n").encode())


def receive(conn: socket.socket, buffer: bytearray) -> dict | None:
    """The next newline-terminated JSON message, or None at EOF."""
    while b"\n" not in buffer:
        chunk = conn.recv(1 << 16)
        if not chunk:
            return None
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return json.loads(line)


class WorkerEnded(BaseException):
    """An elastic worker ended (commlib.elastic asked the process to exit with ``code``): raised through the
    user's function so the actor process stays (see :meth:`Member.exit_through_standin`)."""

    def __init__(self, code: int):
        super().__init__(f"the worker ended with status {code}")
        self.code = code


class JoinError(RuntimeError):
    """The actor could not join the job as an MPI rank; the message says why."""


class Member:
    """What one actor process does for the job (one per process: :func:`member`)."""

    def __init__(self):
        self.token = secrets.token_hex(12)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(endpoint_name(self.token))
        self.listener.listen(1)
        self.proxy: subprocess.Popen | None = None
        self.standin: socket.socket | None = None
        self.rank: int | None = None
        self.lock = threading.Lock()

    # -- where it is ------------------------------------------------------------------------------------
    def info(self) -> dict:
        import ray

        context = ray.get_runtime_context()
        return {"node_id": context.get_node_id(), "ip": ray.util.get_node_ip_address(),
                "hostname": socket.gethostname(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "token": self.token, "pid": os.getpid()}

    def update_env(self, env: dict) -> None:
        os.environ.update({k: str(v) for k, v in env.items()})

    # -- the node's proxy -------------------------------------------------------------------------------
    def start_proxy(self, command: str) -> int:
        """Start hydra's proxy command (as ssh would: one shell command line); return its pid."""
        with self.lock:
            if self.proxy is not None and self.proxy.poll() is None:
                raise RuntimeError("this actor already runs a proxy")
            self.proxy = subprocess.Popen(command, shell=True, stdin=subprocess.DEVNULL)
            return self.proxy.pid

    def proxy_status(self) -> int | None:
        """The proxy's exit status, or None while it runs."""
        return None if self.proxy is None else self.proxy.poll()

    def stop_proxy(self) -> None:
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.kill()
            self.proxy.wait()

    # -- becoming a rank --------------------------------------------------------------------------------
    def join(self, timeout: float) -> int:
        """Wait for this actor's stand-in, take its PMI address and settings, and initialize MPI with them:
        this process is then a rank of the job. Returns the rank."""
        if self.rank is not None:
            return self.rank
        self.listener.settimeout(timeout)
        try:
            conn, _ = self.listener.accept()
        except socket.timeout:
            raise JoinError(f"no process of the MPI job reached this actor within {timeout:g} s (did mpiexec "
                            "start? its output is in the driver's log)") from None
        buffer = bytearray()
        conn.settimeout(timeout)
        message = receive(conn, buffer)
        if not message or message.get("token") != self.token:
            conn.close()
            raise JoinError("a process that is not this job's stand-in connected to this actor")
        conn.settimeout(None)
        self.standin = conn
        env = dict(message["env"])
        # the proxy listens on every address of this node; its host name may resolve nowhere
        env["PMI_PORT"] = "127.0.0.1:" + env["PMI_PORT"].rsplit(":", 1)[1]
        os.environ.update(env)
        from mpi4py import MPI  # MPI_Init: through PMI_PORT/PMI_ID this process is the stand-in's rank

        self.rank = MPI.COMM_WORLD.Get_rank()
        return self.rank

    def leave(self, code: int) -> None:
        """Tell the stand-in to end with ``code`` (mpiexec's view of this rank's end)."""
        with self.lock:
            if self.standin is not None:
                try:
                    send(self.standin, {"exit": int(code)})
                except OSError:
                    pass

    def exit_through_standin(self) -> None:
        """From now on ``os._exit(code)`` (how commlib's elastic workers end: a restart, a rank left out, the
        end after an in-process recovery) hands ``code`` to the stand-in, which ends with it, and raises
        :class:`WorkerEnded` instead of ending the process: the actor, and the proxy it may run for its
        node, stay until the executor ends them, so that hydra hears every rank's status from its proxy."""
        if getattr(os._exit, "__commlib_standin__", False):
            return

        def end_with_status(code):
            self.leave(code)
            raise WorkerEnded(code)

        end_with_status.__commlib_standin__ = True
        os._exit = end_with_status

    def finalize(self) -> None:
        """Leave MPI (a collective over every rank: all actors call it together), then end the stand-in."""
        import commlib

        if commlib.is_initialized():
            commlib.shutdown()
        if self.rank is not None:
            from mpi4py import MPI

            if not MPI.Is_finalized():
                MPI.Finalize()
        self.leave(0)


_member: Member | None = None
_member_lock = threading.Lock()


def member() -> Member:
    """This process's Member (made on first use)."""
    global _member
    with _member_lock:
        if _member is None:
            _member = Member()
        return _member
