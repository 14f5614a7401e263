"""Elastic commlib jobs on Ray: ``RayExecutor(settings, min_workers=..., max_workers=...)`` and Horovod's
``ElasticRayExecutor``, driven by commlib-run's elastic driver (commlib.run.elastic, docs/elastic.md).

The hosts are Ray's live nodes, each with as many slots as it has resources for workers (``CPU //
cpus_per_worker``, and GPUs likewise); a node the autoscaler adds is found within a second and joins at
the workers' next commit (``HostsUpdatedInterrupt``, then a restart from that commit on the larger set).
Each launch places one actor per slot on its node, makes them one MPI job (commlib.ray.member) and runs
the function in each; when a worker's actor or its node is lost, the survivors go on in process (hydra's
connection to a lost proxy is held open by commlib.run.relay, so mpiexec keeps the survivors). ``run``
returns what the workers that finished returned, in rank order.

The driver's directory (``COMMLIB_ELASTIC_DIR``: the committed state, the survivors' reports) must be
reachable by every worker: a shared filesystem on a real cluster, as for commlib-run.
"""

from __future__ import annotations

import subprocess
import threading
from typing import Any, Callable, Dict, List, Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..run import elastic as _elastic
from ..run.hosts import Host
from ..run.options import UsageError
from . import launch as _launch
from . import ray_logger as _logger
from .member import WorkerEnded
from .worker import Settings, Worker, create_settings, info, kill_group, mpiexec_path, stop_proxy, update_env


# functions run in the actors with their Member -----------------------------------------------------------
def _run_elastic(member, fn: Callable, args: list, kwargs: dict, timeout: float, queue) -> Any:
    member.join(timeout)
    member.exit_through_standin()  # a restart (exit code 79) must reach mpiexec through the stand-in
    if queue is not None:
        _logger.configure_in_actor(member, queue)
    return fn(*args, **kwargs)


def _end(member) -> None:
    """End a worker whose function returned, as an elastic process ends: after an in-process recovery
    without MPI_Finalize (a peer is gone; the status goes to the driver's directory, commlib.elastic.recover),
    else leaving MPI with the others."""
    from ..elastic import control, recover
    from ..run import survivors

    directory = control.directory()
    if directory and survivors.read_reports(directory, 0):  # this launch lost a rank and went on
        try:
            recover.exit_now(0)
        except WorkerEnded:
            return
    member.finalize()


class _RayDriver(_elastic.Driver):
    """commlib-run's elastic driver, discovering Ray's nodes."""

    def __init__(self, *args, discover: Callable[[], list], **kwargs):
        super().__init__(*args, **kwargs)
        self._discover = discover

    def discover(self) -> list[Host]:
        return self._discover()


class ElasticJob:
    """An elastic job's driver side (what ``RayExecutor(min_workers=...)`` runs)."""

    def __init__(self, settings: Settings, min_workers: int, max_workers: Optional[int], cpus_per_worker: int,
                 use_gpu: bool, gpus_per_worker: Optional[int], reset_limit: Optional[int],
                 cooldown_range, elastic_timeout: float, override_discovery: bool = True):
        if min_workers < 1 or (max_workers is not None and max_workers < min_workers):
            raise ValueError(f"min_workers {min_workers} and max_workers {max_workers}: need 1 <= min <= max")
        self.settings = settings
        self.options = _elastic.ElasticOptions(
            min_np=min_workers, max_np=max_workers, discovery_script=None, slots_per_host=None,
            elastic_timeout=float(elastic_timeout), reset_limit=reset_limit,
            cooldown=tuple(float(x) for x in cooldown_range) if cooldown_range else None)
        self.cpus = cpus_per_worker
        self.gpus = (gpus_per_worker or 1) if use_gpu else 0
        self.discovery = None if override_discovery else getattr(settings, "discovery", None)
        self.env: dict[str, str] = {}
        self.node_ids: dict[str, str] = {}
        self.workers: list = []
        self.refs: list = []
        self.server: _launch.LaunchServer | None = None
        self.queue = None
        self.call: tuple = ()
        self.lock = threading.Lock()

    def start(self, executable_cls=None, executable_args=None, executable_kwargs=None, extra_env_vars=None) -> None:
        if executable_cls is not None:
            raise NotImplementedError("an elastic job's workers come and go: pass the work to run(), not an "
                                      "executable_cls")
        self.env = {k: str(v) for k, v in (extra_env_vars or {}).items()}

    # -- the hosts --------------------------------------------------------------------------------------
    def hosts(self) -> list[Host]:
        """Ray's live nodes with room for a worker, the driver's node first."""
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        self.node_ids.update({n["NodeManagerAddress"]: n["NodeID"] for n in nodes})
        if self.discovery is not None:  # Horovod's settings.discovery (override_discovery=False)
            found = self.discovery.find_available_hosts_and_slots()
            return [Host(name, int(slots)) for name, slots in found.items() if slots > 0]
        hosts = []
        for node in nodes:
            resources = node.get("Resources", {})
            slots = int(resources.get("CPU", 0) // self.cpus) if self.cpus else 0
            if self.gpus:
                slots = min(slots, int(resources.get("GPU", 0) // self.gpus))
            if slots > 0:
                hosts.append(Host(node["NodeManagerAddress"], slots))
        here = ray.util.get_node_ip_address()
        return sorted(hosts, key=lambda h: (h.name != here, h.name))

    # -- one launch -------------------------------------------------------------------------------------
    def _command(self, hosts: list[Host], np: int, settings: dict) -> tuple[dict, list[str]]:
        self._end_launch()
        fn, args, kwargs = self.call
        workers = []
        for host in hosts:
            node = self.node_ids.get(host.name)
            if node is None:
                raise UsageError(f"host {host.name} is not a node of this Ray cluster")
            strategy = NodeAffinitySchedulingStrategy(node, soft=False)
            workers += [Worker.options(num_cpus=self.cpus, num_gpus=self.gpus, scheduling_strategy=strategy).remote()
                        for _ in range(host.slots)]
        infos = ray.get([w.control.remote(info) for w in workers], timeout=self.settings.timeout_s + 60)
        plan = _launch.Plan.of(infos)
        workers, infos = [workers[i] for i in plan.order], [infos[i] for i in plan.order]
        plan = _launch.Plan.of(infos)
        gpus = plan.visible_gpus(infos)
        ray.get([w.control.remote(update_env, dict(self.env, **({"CUDA_VISIBLE_DEVICES": gpus[i]} if i in gpus else {})))
                 for i, w in enumerate(workers)])
        with self.lock:
            self.workers = workers
            self.server = _launch.LaunchServer(plan.proxies, lambda i, f, *a: workers[i].control.remote(f, *a))
            self.refs = [w.apply.remote(_run_elastic, fn, args, kwargs, self.settings.timeout_s, self.queue)
                         for w in workers]
        threading.Thread(target=self._end_workers_when_done, args=(workers, list(self.refs)), daemon=True,
                         name="commlib-ray-elastic-ends").start()
        nic = sorted(self.settings.nics)[0] if self.settings.nics else None
        argv = plan.argv(mpiexec_path(), self.server.shim(relay=True), ray.util.get_node_ip_address(),
                         dict(settings, **self.env), nic)
        return {}, argv

    def _end_workers_when_done(self, workers: list, refs: list) -> None:
        """Once every worker's function has returned (or ended, or its actor is gone), end the workers whose
        function returned: a rank ends only when no collective of the others can still need it."""
        ray.wait(refs, num_returns=len(refs), timeout=None)
        for worker, ref in zip(workers, refs):
            try:
                ray.get(ref, timeout=0)
            except Exception:  # noqa: BLE001 - it ended already (restart, failure, lost)
                continue
            worker.apply.remote(_end)

    def _ranks_gone(self) -> set[int]:
        """The ranks of the running launch whose function ended without returning (``refs[r]`` is rank r's:
        the workers are in rank order): each actor lost or its process dead."""
        with self.lock:
            refs = list(self.refs)
        if not refs:
            return set()
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        gone = set()
        for rank, ref in enumerate(refs):
            if ref in ready:
                try:
                    ray.get(ref, timeout=0)
                except Exception:  # noqa: BLE001 - lost, crashed, or ended by a restart
                    gone.add(rank)
        return gone

    def _workers_gone(self) -> bool:
        """Every worker's function of the running launch has ended and none returned: each actor was lost or
        its process died (MPICH can crash a rank that sends to a lost peer)."""
        with self.lock:
            count = len(self.refs)
        return count > 0 and len(self._ranks_gone()) == count

    def _kill(self, job: subprocess.Popen) -> None:
        kill_group(job)
        with self.lock:
            for worker in self.workers:
                worker.control.remote(stop_proxy)

    def _end_launch(self) -> None:
        with self.lock:
            for worker in self.workers:
                ray.kill(worker)
            if self.server is not None:
                self.server.close()
            self.workers, self.server = [], None

    # -- the run ----------------------------------------------------------------------------------------
    def run(self, fn: Callable, args=None, kwargs=None, callbacks=None) -> list:
        self.call = (fn, list(args or []), dict(kwargs or {}))
        if callbacks and self.queue is None:
            self.queue = _logger.make_queue()
        launcher = _elastic.Launcher(command=self._command, kill=self._kill, static_hosts=[], in_process=True,
                                     workers_gone=self._workers_gone, ranks_gone=self._ranks_gone)
        driver = _RayDriver(self.options, launcher, {}, discover=self.hosts)
        done = threading.Event()
        drain = threading.Thread(target=self._drain, args=(callbacks, done), daemon=True)
        drain.start()
        try:
            code = driver.run()
        except UsageError as exc:
            raise RuntimeError(f"elastic job on Ray: {exc}") from None
        finally:
            done.set()
            drain.join(timeout=10)
        results = []
        for ref in self.refs:
            try:
                results.append(ray.get(ref, timeout=60))
            except Exception:  # noqa: BLE001 - a worker lost on the way: Horovod returns the others'
                continue
        self._end_launch()
        if code != 0:
            raise RuntimeError(f"the elastic job failed (exit code {code}); its messages are above")
        return results

    def _drain(self, callbacks, done: threading.Event) -> None:
        while not done.wait(0.1):
            while self.queue is not None and callbacks and not self.queue.empty():
                info = self.queue.get_nowait()
                for callback in callbacks:
                    callback(info)

    def shutdown(self) -> None:
        self._end_launch()
        if self.queue is not None:
            _logger.close_queue(self.queue)
            self.queue = None


class ElasticRayExecutor:
    """Horovod's ``ElasticRayExecutor`` (its older elastic API) over :class:`ElasticJob`.

        settings = ElasticRayExecutor.create_settings(min_num_proc=1, max_num_proc=4)
        executor = ElasticRayExecutor(settings, use_gpu=False, cpus_per_slot=1)
        executor.start()
        results = executor.run(train_fn)
    """

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: Optional[int] = None, reset_limit: Optional[int] = None,
                        elastic_timeout: int = 600, timeout_s: int = 30, ssh_identity_file: Optional[str] = None,
                        nics: Optional[set] = None, min_np: Optional[int] = None, max_np: Optional[int] = None,
                        verbose: int = 1, **ignored) -> Settings:
        settings = create_settings(timeout_s=timeout_s, ssh_identity_file=ssh_identity_file, nics=nics,
                                   verbose=verbose, **ignored)
        settings.min_np = min_np if min_np is not None else min_num_proc
        settings.max_np = max_np if max_np is not None else max_num_proc
        settings.reset_limit = reset_limit
        settings.elastic_timeout = float(elastic_timeout)
        return settings

    def __init__(self, settings: Settings, use_gpu: bool = False, cpus_per_slot: int = 1,
                 gpus_per_slot: Optional[int] = None, env_vars: Optional[Dict] = None,
                 override_discovery: bool = True):
        self.env_vars = env_vars
        self._job = ElasticJob(settings, min_workers=settings.min_np or 1, max_workers=settings.max_np,
                               cpus_per_worker=cpus_per_slot, use_gpu=use_gpu, gpus_per_worker=gpus_per_slot,
                               reset_limit=settings.reset_limit, cooldown_range=settings.cooldown_range,
                               elastic_timeout=settings.elastic_timeout, override_discovery=override_discovery)

    def start(self) -> None:
        if not ray.is_initialized():
            ray.init()
        self._job.start(extra_env_vars=self.env_vars)

    def run(self, worker_fn: Callable, callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``worker_fn()`` on every worker of the elastic job; what the finished workers returned."""
        try:
            return self._job.run(worker_fn, callbacks=callbacks)
        finally:
            self._job.shutdown()
