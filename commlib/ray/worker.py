"""What RayExecutor and the elastic job share: the settings, the worker actor, the functions they run in it
(each takes the actor's Member, commlib.ray.member), and where mpiexec is."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import warnings
from typing import Callable, Optional

import ray

from .member import member


@dataclasses.dataclass
class Settings:
    """What ``create_settings`` gives (Horovod's MiniSettings' fields; the ssh ones are accepted and unused:
    the actors start hydra's proxies, nobody uses ssh)."""

    timeout_s: float = 30.0                 # how long the workers may take to join the MPI job
    placement_group_timeout_s: float = 100.0
    nics: Optional[set] = None              # the network interface the ranks use (one: hydra's -iface)
    verbose: int = 1
    ssh_identity_file: Optional[str] = None
    ssh_port: Optional[int] = None
    elastic: bool = False
    # ElasticRayExecutor.create_settings (Horovod's older elastic API)
    min_np: Optional[int] = None
    max_np: Optional[int] = None
    reset_limit: Optional[int] = None
    elastic_timeout: float = 600.0
    cooldown_range: Optional[tuple] = None


def create_settings(timeout_s: float = 30, ssh_identity_file: str | None = None, ssh_str: str | None = None,
                    placement_group_timeout_s: float = 100, nics: set | None = None, verbose: int = 1,
                    **ignored) -> Settings:
    """Horovod's ``RayExecutor.create_settings``: ``timeout_s`` bounds the start of the job;
    ``ssh_identity_file``/``ssh_str`` are accepted for compatibility (no ssh is used)."""
    if ignored:
        warnings.warn(f"create_settings: {', '.join(sorted(ignored))} not used by commlib.ray", stacklevel=2)
    return Settings(timeout_s=float(timeout_s), placement_group_timeout_s=float(placement_group_timeout_s),
                    nics=set(nics) if nics else None, verbose=int(verbose), ssh_identity_file=ssh_identity_file)


@ray.remote(concurrency_groups={"control": 4})
class Worker:
    """One worker: an actor that becomes a rank of the job. Calls in the default group run one at a time
    in order (the user's functions, so their collectives keep their order); the "control" group serves
    the launch (its node's proxy) beside them."""

    def __init__(self):
        self.executable = None
        member()

    @ray.method(concurrency_group="control")
    def control(self, function: Callable, *args):
        return function(member(), *args)

    def apply(self, function: Callable, *args):
        return function(member(), *args)

    def start_executable(self, executable_cls, executable_args, executable_kwargs) -> None:
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or []), **(executable_kwargs or {}))

    def execute(self, function: Callable):
        return function(self.executable)


# functions run in the actors with their Member ------------------------------------------------------------
def info(m) -> dict:
    return m.info()


def update_env(m, env: dict) -> None:
    m.update_env(env)


def join(m, timeout: float) -> int:
    return m.join(timeout)


def finalize(m) -> None:
    m.finalize()


def stop_proxy(m) -> None:
    m.stop_proxy()


def mpiexec_path() -> str:
    from commlib.testing.cluster import find_mpiexec

    return find_mpiexec()


def kill_group(process: subprocess.Popen) -> None:
    """End a process group of its own (mpiexec and what it started here): SIGTERM, then SIGKILL."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue
