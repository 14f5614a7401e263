"""A Ray driver (tests/ray/test_ray_executor.py) checking RayExecutor's API on a Ray cluster of emulated
hosts that declare one GPU each: every check prints "CHECK <name> ok" or raises, naming what differed."""

import os
import socket

import numpy as np
import ray

from commlib.ray import ElasticRayExecutor, RayExecutor, ray_logger

ray.init(address="auto", logging_level="WARNING")
settings = RayExecutor.create_settings(timeout_s=120)


def check(name, got, expected):
    assert got == expected, f"{name}: got {got!r}, expected {expected!r}"
    print(f"CHECK {name} ok", flush=True)


def where(offset):
    import commlib

    commlib.init()
    total = commlib.allreduce(np.array([commlib.rank() + offset], dtype=np.float64), op=commlib.Sum)
    return {"rank": commlib.rank(), "size": commlib.size(), "local_rank": commlib.local_rank(),
            "cross_size": commlib.cross_size(), "host": socket.gethostname(), "sum": float(total[0]),
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "extra": os.environ.get("EXTRA_SETTING")}


class Counter:
    """An executable: state that lives in each worker between calls."""

    def __init__(self, start):
        self.value = start

    def add(self, amount):
        import commlib

        commlib.init()
        self.value += amount * (commlib.rank() + 1)
        return self.value


# 2 hosts x 1 worker, GPUs passed through: each worker sees its node's GPU
executor = RayExecutor(settings, num_hosts=2, num_workers_per_host=1, use_gpu=True)
executor.start(executable_cls=Counter, executable_args=[10], extra_env_vars={"EXTRA_SETTING": "on"})
results = executor.run(where, args=[100])
check("ranks in order", [r["rank"] for r in results], [0, 1])
check("sizes", [r["size"] for r in results], [2, 2])
check("allreduce", [r["sum"] for r in results], [201.0, 201.0])
check("one worker per host", len({r["host"] for r in results}), 2)
check("cross size", [r["cross_size"] for r in results], [2, 2])
check("gpu per worker", [r["gpus"] for r in results], ["0", "0"])
check("extra env", [r["extra"] for r in results], ["on", "on"])
check("kwargs", [r["sum"] for r in executor.run(where, kwargs={"offset": 1})], [3.0, 3.0])
refs = executor.run_remote(where, args=[0])
check("run_remote refs", [r["rank"] for r in ray.get(refs)], [0, 1])
check("execute keeps state", executor.execute(lambda counter: counter.add(1)), [11, 12])
check("execute again", executor.execute(lambda counter: counter.add(1)), [12, 14])
check("execute_single", executor.execute_single(lambda counter: counter.value), 12)
seen = []


def logs(offset):
    import commlib

    commlib.init()
    if commlib.rank() == 0:
        ray_logger.log({"offset": offset, "size": commlib.size()})
    return commlib.rank()


check("callbacks", (executor.run(logs, args=[5], callbacks=[seen.append]), seen), ([0, 1], [{"offset": 5, "size": 2}]))
executor.shutdown()

# 2 workers of one node: one node, both GPUs visible in local-rank order (Horovod's rule)
executor = RayExecutor(settings, num_hosts=1, num_workers_per_host=2, use_gpu=False)
executor.start()
results = executor.run(where, args=[0])
check("local ranks on one host", [r["local_rank"] for r in results], [0, 1])
check("one host", len({r["host"] for r in results}), 1)
executor.shutdown()

# Horovod's older names, as its tensorflow2_mnist_ray.py passes them
executor = RayExecutor(settings, num_hosts=2, num_slots=1, cpus_per_slot=1)
executor.start()
check("older names", [r["size"] for r in executor.run(where, kwargs={"offset": 0})], [2, 2])
executor.shutdown()

# Horovod's ElasticRayExecutor, as its pytorch_ray_elastic.py calls it (a job that loses nobody)
settings_elastic = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=2, verbose=True)
executor = ElasticRayExecutor(settings_elastic, use_gpu=False, cpus_per_slot=2)
executor.start()
check("elastic run", [r["rank"] for r in executor.run(lambda: where(0))], [0, 1])

# more than the cluster has: a clear error, nothing left placed
try:
    RayExecutor(RayExecutor.create_settings(placement_group_timeout_s=2), num_workers=50).start()
except TimeoutError as exc:
    check("too many workers named", "could not place 50 worker(s)" in str(exc), True)
else:
    raise AssertionError("50 workers were placed on a 3-CPU cluster")
print("ALL OK", flush=True)
