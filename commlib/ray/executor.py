"""``RayExecutor``: Horovod on Ray's API (``horovod.ray``) running commlib jobs in Ray actors.

    import ray
    from commlib.ray import RayExecutor

    ray.init(address="auto")
    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=4, cpus_per_worker=1, use_gpu=False)
    executor.start()
    results = executor.run(train, kwargs={"epochs": 5})     # each worker's return value, in rank order
    executor.shutdown()

One Ray actor per worker, placed by Ray through a placement group (``num_workers``: packed;
``num_hosts`` x ``num_workers_per_host``: one bundle per host, spread). ``start()`` makes every actor a rank
of one MPI job (commlib.ray.member: hydra's proxies started inside the actors, the actors themselves the
MPI processes; no ssh), so ``hvd.init()`` in a function the executor runs finds the job, and Ray's GPU
assignment reaches the ranks. With ``min_workers`` the job is elastic (commlib.ray.elastic).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any, Callable, Dict, List, Optional

import ray
from ray.util.placement_group import get_current_placement_group, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from . import launch as _launch
from . import ray_logger as _logger
from .worker import (Settings, Worker, create_settings, finalize, info, join, kill_group, mpiexec_path, stop_proxy,
                     update_env)


class _Static:
    """A fixed set of workers: the actors, their MPI job (mpiexec on the driver's node) and its server."""

    def __init__(self, settings: Settings, num_workers, num_hosts, num_workers_per_host, cpus_per_worker, use_gpu,
                 gpus_per_worker, use_current_placement_group):
        if num_workers is None and num_hosts is None:
            raise ValueError("give num_workers, or num_hosts and num_workers_per_host")
        if num_workers is not None and num_hosts is not None:
            raise ValueError("give num_workers or num_hosts (with num_workers_per_host), not both")
        self.settings = settings
        self.num_workers = num_workers
        self.num_hosts = num_hosts
        self.per_host = num_workers_per_host
        self.cpus = cpus_per_worker
        self.gpus = (gpus_per_worker or 1) if use_gpu else 0
        self.use_current_placement_group = use_current_placement_group
        self.workers: list = []
        self.placement_group = None
        self.own_placement_group = False
        self.server: _launch.LaunchServer | None = None
        self.mpiexec: subprocess.Popen | None = None
        self.queue = None

    def _bundles(self) -> tuple[list[dict], str, list[int]]:
        """Placement bundles, the strategy, and each worker's bundle."""
        worker = {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {})}
        if self.num_workers is not None:
            return [dict(worker) for _ in range(self.num_workers)], "PACK", list(range(self.num_workers))
        per_host = {k: v * self.per_host for k, v in worker.items()}
        return ([dict(per_host) for _ in range(self.num_hosts)], "STRICT_SPREAD",
                [h for h in range(self.num_hosts) for _ in range(self.per_host)])

    def start(self, executable_cls, executable_args, executable_kwargs, extra_env_vars) -> None:
        bundles, strategy, bundle_of = self._bundles()
        current = get_current_placement_group() if self.use_current_placement_group else None
        if current is not None and len(current.bundle_specs) >= len(bundle_of):
            self.placement_group = current  # inside a Ray Tune trial or a Ray Train worker group: use it
            bundle_of = list(range(len(bundle_of)))
        else:
            self.placement_group = placement_group(bundles, strategy=strategy)
            self.own_placement_group = True
            ready, _ = ray.wait([self.placement_group.ready()], timeout=self.settings.placement_group_timeout_s)
            if not ready:
                self.shutdown()
                raise TimeoutError(
                    f"Ray could not place {len(bundle_of)} worker(s) ({bundles[0]} per "
                    f"{'worker' if strategy == 'PACK' else 'host'}, {strategy}) within "
                    f"placement_group_timeout_s={self.settings.placement_group_timeout_s:g}: the cluster has "
                    f"{ray.cluster_resources()}; ask for fewer workers or resources, or add nodes")
        self.workers = [Worker.options(num_cpus=self.cpus, num_gpus=self.gpus, scheduling_strategy=
                                       PlacementGroupSchedulingStrategy(self.placement_group, bundle)).remote()
                        for bundle in bundle_of]
        try:
            self._start_job(executable_cls, executable_args, executable_kwargs, extra_env_vars or {})
        except BaseException:
            self.shutdown()
            raise

    def _start_job(self, executable_cls, executable_args, executable_kwargs, extra_env_vars) -> None:
        infos = ray.get([w.control.remote(info) for w in self.workers], timeout=self.settings.timeout_s + 60)
        plan = _launch.Plan.of(infos)
        self.workers = [self.workers[i] for i in plan.order]  # rank order
        infos = [infos[i] for i in plan.order]
        plan = _launch.Plan.of(infos)
        gpus = plan.visible_gpus(infos)
        env = {k: str(v) for k, v in extra_env_vars.items()}
        ray.get([w.control.remote(update_env, dict(env, **({"CUDA_VISIBLE_DEVICES": gpus[i]} if i in gpus else {})))
                 for i, w in enumerate(self.workers)])
        self.server = _launch.LaunchServer(plan.proxies, lambda i, f, *a: self.workers[i].control.remote(f, *a))
        nic = sorted(self.settings.nics)[0] if self.settings.nics else None
        argv = plan.argv(mpiexec_path(), self.server.shim(), ray.util.get_node_ip_address(), env, nic)
        if self.settings.verbose:
            print(f"commlib.ray: {' '.join(argv)}", file=sys.stderr, flush=True)
        self.mpiexec = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL)
        joins = [w.apply.remote(join, self.settings.timeout_s) for w in self.workers]
        ready, _ = ray.wait(joins, num_returns=len(joins), timeout=self.settings.timeout_s + 30)
        if len(ready) < len(joins) or self.mpiexec.poll() is not None:
            raise TimeoutError(f"the workers did not all join the MPI job within timeout_s="
                               f"{self.settings.timeout_s:g} (mpiexec "
                               f"{'ended with ' + str(self.mpiexec.poll()) if self.mpiexec.poll() is not None else 'runs'};"
                               f" its messages are above)")
        ranks = ray.get(joins)
        if ranks != list(range(len(self.workers))):
            raise RuntimeError(f"the workers joined as ranks {ranks}, expected 0..{len(self.workers) - 1}")
        ray.get([w.start_executable.remote(executable_cls, executable_args, executable_kwargs)
                 for w in self.workers])

    def logging_to(self, callbacks) -> None:
        """With callbacks, the workers' ray_logger sends to a queue (made on the first such call)."""
        if callbacks and self.queue is None:
            self.queue = _logger.make_queue()
            for w in self.workers:  # before the function: calls in the default group keep their order
                w.apply.remote(_logger.configure_in_actor, self.queue)

    def run_remote(self, fn: Callable, args=None, kwargs=None) -> list:
        args, kwargs = list(args or []), dict(kwargs or {})
        return [w.execute.remote(lambda _: fn(*args, **kwargs)) for w in self.workers]

    def execute_remote(self, fn: Callable) -> list:
        return [w.execute.remote(fn) for w in self.workers]

    def shutdown(self) -> None:
        if self.workers and self.mpiexec is not None and self.mpiexec.poll() is None:
            done, _ = ray.wait([w.apply.remote(finalize) for w in self.workers], num_returns=len(self.workers),
                               timeout=60)
            try:
                self.mpiexec.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        if self.mpiexec is not None and self.mpiexec.poll() is None:
            kill_group(self.mpiexec)
        for w in self.workers:
            try:
                ray.get(w.control.remote(stop_proxy), timeout=10)
            except Exception:  # noqa: BLE001 - a lost actor has no proxy left to stop
                pass
            ray.kill(w)
        self.workers = []
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.queue is not None:
            _logger.close_queue(self.queue)
            self.queue = None
        if self.placement_group is not None and self.own_placement_group:
            remove_placement_group(self.placement_group)
        self.placement_group = None


class RayExecutor:
    """Horovod on Ray's executor over commlib (see the module's docstring).

    Args:
        settings: from :meth:`create_settings`.
        num_workers: workers, placed by Ray (packed); or ``num_hosts`` x ``num_workers_per_host``.
        cpus_per_worker, use_gpu, gpus_per_worker: each worker's Ray resources (``gpus_per_worker``
            defaults to 1 with ``use_gpu``); a worker sees the GPUs of its node's workers, its own first
            at its ``local_rank()``, as in Horovod.
        use_current_placement_group: inside a placement group (Ray Tune, Ray Train), place the workers in
            its bundles.
        min_workers, max_workers, reset_limit, cooldown_range, elastic_timeout: an elastic job
            (commlib.ray.elastic; ``run`` only). Horovod's older names ``num_slots``, ``cpus_per_slot``,
            ``gpus_per_slot`` are accepted.
    """

    create_settings = staticmethod(create_settings)

    def __init__(self, settings: Settings, num_workers: Optional[int] = None, num_hosts: Optional[int] = None,
                 num_workers_per_host: int = 1, cpus_per_worker: int = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[int] = None, use_current_placement_group: bool = True,
                 min_workers: Optional[int] = None, max_workers: Optional[int] = None,
                 reset_limit: Optional[int] = None, cooldown_range: Optional[List[int]] = None,
                 elastic_timeout: int = 600, override_discovery: bool = True, num_slots: Optional[int] = None,
                 cpus_per_slot: Optional[int] = None, gpus_per_slot: Optional[int] = None):
        num_workers_per_host = num_slots if num_slots is not None else num_workers_per_host
        cpus_per_worker = cpus_per_slot if cpus_per_slot is not None else cpus_per_worker
        gpus_per_worker = gpus_per_slot if gpus_per_slot is not None else gpus_per_worker
        if gpus_per_worker and not use_gpu:
            raise ValueError("gpus_per_worker is set but use_gpu is False: set use_gpu=True")
        if use_gpu and gpus_per_worker is not None and gpus_per_worker < 1:
            raise ValueError(f"gpus_per_worker must be at least 1, got {gpus_per_worker}")
        if max_workers is not None and not min_workers:
            raise ValueError("max_workers needs a positive min_workers (an elastic job)")
        if min_workers is not None and num_workers is not None:
            raise ValueError("give num_workers (a fixed job) or min_workers (an elastic one), not both")
        self.settings = settings
        self.elastic = min_workers is not None
        self.settings.elastic = self.elastic
        if self.elastic:
            from .elastic import ElasticJob

            self._job = ElasticJob(settings, min_workers=min_workers, max_workers=max_workers,
                                   cpus_per_worker=cpus_per_worker, use_gpu=use_gpu, gpus_per_worker=gpus_per_worker,
                                   reset_limit=reset_limit, cooldown_range=cooldown_range,
                                   elastic_timeout=elastic_timeout, override_discovery=override_discovery)
        else:
            self._job = _Static(settings, num_workers, num_hosts, num_workers_per_host, cpus_per_worker, use_gpu,
                                gpus_per_worker, use_current_placement_group)
        self._started = False

    def start(self, executable_cls: type = None, executable_args: Optional[List] = None,
              executable_kwargs: Optional[Dict] = None, extra_env_vars: Optional[Dict] = None) -> None:
        """Place the workers and make them one MPI job; each then holds ``executable_cls(*args, **kwargs)``
        (for :meth:`execute`). ``extra_env_vars`` are set in every worker."""
        if not ray.is_initialized():
            ray.init()
        self._job.start(executable_cls, executable_args, executable_kwargs, extra_env_vars)
        self._started = True

    def _check_started(self) -> None:
        if not self._started:
            raise RuntimeError("call start() first")

    def run(self, fn: Callable[..., Any], args: Optional[List] = None, kwargs: Optional[Dict] = None,
            callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``fn(*args, **kwargs)`` on every worker; each worker's return value, in rank order. ``callbacks``
        get every dict rank 0 passes to ``commlib.ray.ray_logger.log``."""
        self._check_started()
        if self.elastic:
            return self._job.run(fn, args, kwargs, callbacks)
        self._job.logging_to(callbacks)
        return _logger.get_with_callbacks(self._job.run_remote(fn, args, kwargs), self._job.queue, callbacks)

    def run_remote(self, fn: Callable[..., Any], args: Optional[List] = None,
                   kwargs: Optional[Dict] = None) -> List["ray.ObjectRef"]:
        """As :meth:`run`, without waiting: one ObjectRef per worker."""
        self._check_started()
        if self.elastic:
            raise NotImplementedError("an elastic job's workers come and go: use run()")
        return self._job.run_remote(fn, args, kwargs)

    def execute(self, fn: Callable[[Any], Any], callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``fn(executable)`` on every worker (the object ``start(executable_cls)`` made there)."""
        self._check_started()
        if self.elastic:
            raise NotImplementedError("an elastic job's workers come and go: use run()")
        self._job.logging_to(callbacks)
        return _logger.get_with_callbacks(self._job.execute_remote(fn), self._job.queue, callbacks)

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on rank 0 only."""
        self._check_started()
        if self.elastic:
            raise NotImplementedError("an elastic job's workers come and go: use run()")
        return ray.get(self._job.workers[0].execute.remote(fn))

    def shutdown(self) -> None:
        """Leave MPI on every worker, end the job and remove the actors and their placement group."""
        self._job.shutdown()
        self._started = False
