"""Worker for tests/torch/test_torch_work.py: all_reduce in a loop on the ``commlib`` backend with a process
group timeout of TIMEOUT seconds while the test cuts a host's link; every rank records how its call failed.

    python torch_link_cut.py TIMEOUT DIR

Files in DIR: ``ready.RANK`` once the loop runs; ``result.RANK`` (JSON): when the call failed, the
exception's type, whether it is a ``torch.distributed.DistBackendError``, its ``ranks`` and message, and how a
second call failed. The error is raised again, so the process leaves through commlib's exit path.
"""

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

timeout, folder = float(sys.argv[1]), sys.argv[2]
dist.init_process_group("commlib", timeout=datetime.timedelta(seconds=timeout))
rank = dist.get_rank()


def mark(name, data=""):
    path = os.path.join(folder, f"{name}.{rank}")
    with open(path + ".tmp", "w") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


grad = torch.ones(1 << 20)  # a 4 MiB bucket
calls = 0
try:
    while True:
        dist.all_reduce(grad)
        calls += 1
        if calls == 3:
            mark("ready")
except Exception as exc:  # noqa: BLE001 - recorded for the test
    failed_at = time.time()
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        again = "returned"
    except Exception as second:  # noqa: BLE001
        again = type(second).__name__
    mark("result", json.dumps({
        "time": failed_at, "type": type(exc).__name__, "backend_error": isinstance(exc, dist.DistBackendError),
        "ranks": list(getattr(exc, "ranks", ())), "message": str(exc)[:1000], "calls": calls, "again": again,
        "again_s": time.monotonic() - start}))
    raise
