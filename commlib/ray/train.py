"""A Ray Train backend for commlib: Ray Train's ``DataParallelTrainer`` runs a commlib job.

    from ray.train import ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
    from commlib.ray.train import CommlibConfig

    def train_loop(config):
        import commlib.torch as hvd
        hvd.init()                      # the job of Ray Train's workers: rank = Ray Train's world rank
        ...                             # hvd.DistributedOptimizer, ray.train.report(...), checkpoints
    trainer = DataParallelTrainer(train_loop, backend_config=CommlibConfig(),
                                  scaling_config=ScalingConfig(num_workers=4, use_gpu=True))
    result = trainer.fit()

Ray Train starts its workers (actors) and, before the training function, calls the backend: here
``on_start`` starts mpiexec on the controller's node with hydra's proxies started inside the workers
(commlib.ray.launch, the same launch as RayExecutor's), and ``on_training_start`` makes each worker the
MPI rank its stand-in hands it (commlib.ray.member), so that ``hvd.init()`` in the training function joins
one job. Ray Train orders its workers node by node, which is hydra's order: commlib's rank equals Ray
Train's world rank and ``local_rank()`` its local rank; each worker sees its node's GPUs
(``share_cuda_visible_devices``), its own at ``local_rank()``. ``on_shutdown`` leaves MPI on every worker
and ends mpiexec. A worker Ray Train restarts after a failure starts a new job (Ray Train's own fault
tolerance: the whole worker group restarts); commlib's in-process recovery is RayExecutor's elastic mode.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Callable, Optional

import ray
from ray.train.backend import Backend, BackendConfig

from . import launch as _launch
from .member import member
from .worker import finalize, info, join, kill_group, mpiexec_path, stop_proxy


def _with_member(function: Callable, *args):
    """Run in a Ray Train worker: ``function(member, *args)`` (RayExecutor's actors do the same)."""
    return function(member(), *args)


@dataclasses.dataclass
class CommlibConfig(BackendConfig):
    """Ray Train's configuration for a commlib job.

    Args:
        timeout_s: how long the workers may take to start the MPI job and join it.
        nic: the network interface of the ranks' traffic (hydra's ``-iface``); default: hydra's choice.
        env: settings for every rank (``COMMLIB_*`` and the like), as ``-genv``.
    """

    timeout_s: float = 120.0
    nic: Optional[str] = None
    env: dict = dataclasses.field(default_factory=dict)

    @property
    def backend_cls(self):
        return _CommlibBackend


class _Job:
    """One worker group's MPI job: the launch server and mpiexec."""

    def __init__(self, server: _launch.LaunchServer, mpiexec: subprocess.Popen):
        self.server = server
        self.mpiexec = mpiexec


class _CommlibBackend(Backend):
    share_cuda_visible_devices: bool = True

    def __init__(self):
        self.jobs: dict[int, _Job] = {}

    def on_start(self, worker_group, backend_config: CommlibConfig) -> None:
        infos = worker_group.execute(_with_member, info)
        plan = _launch.Plan.of(infos)
        if plan.order != list(range(len(infos))):
            raise RuntimeError(f"Ray Train's workers are not grouped by node ({[i['ip'] for i in infos]}); commlib's "
                               "ranks follow hydra's node-by-node order and would differ from Ray Train's")

        def call(index, function, *args):
            return worker_group.execute_single_async(index, _with_member, function, *args)

        server = _launch.LaunchServer(plan.proxies, call)
        argv = plan.argv(mpiexec_path(), server.shim(), ray.util.get_node_ip_address(),
                         {k: str(v) for k, v in backend_config.env.items()}, backend_config.nic)
        print(f"commlib.ray.train: {' '.join(argv)}", file=sys.stderr, flush=True)
        mpiexec = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL)
        self.jobs[id(worker_group)] = _Job(server, mpiexec)
        # the workers serve one call at a time: their proxies must run before they wait for their rank
        if not server.wait_started(backend_config.timeout_s):
            self._end(worker_group)
            raise TimeoutError(f"hydra's proxies did not start in Ray Train's workers within {backend_config.timeout_s:g} s "
                               f"(mpiexec {'ended with ' + str(mpiexec.poll()) if mpiexec.poll() is not None else 'runs'})")

    def on_training_start(self, worker_group, backend_config: CommlibConfig) -> None:
        ranks = worker_group.execute(_with_member, join, backend_config.timeout_s)
        if ranks != list(range(len(ranks))):
            raise RuntimeError(f"Ray Train's workers joined the MPI job as ranks {ranks}, expected 0..{len(ranks) - 1}")

    def on_shutdown(self, worker_group, backend_config: CommlibConfig) -> None:
        job = self.jobs.get(id(worker_group))
        if job is not None and job.mpiexec.poll() is None:
            refs = worker_group.execute_async(_with_member, finalize)
            ray.wait(refs, num_returns=len(refs), timeout=60)
            try:
                job.mpiexec.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self._end(worker_group)

    def _end(self, worker_group) -> None:
        job = self.jobs.pop(id(worker_group), None)
        if job is None:
            return
        if job.mpiexec.poll() is None:
            kill_group(job.mpiexec)
        refs = worker_group.execute_async(_with_member, stop_proxy)  # a proxy mpiexec's end left behind
        ray.wait(refs, num_returns=len(refs), timeout=10)
        job.server.close()
