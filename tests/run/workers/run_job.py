"""A job started by commlib-run (tests/run/test_run.py): one allreduce, then rank 0 prints what every rank ran
with (one writer: lines of several ranks may interleave in mpiexec's output)."""

import json
import os
import socket
import sys

import numpy as np

import commlib
from commlib.config import Config

commlib.init()
r, n = commlib.rank(), commlib.size()
total = commlib.allreduce(np.full(5, r + 1.0), name="run.check", op=commlib.Sum)
assert np.array_equal(total, np.full(5, n * (n + 1) / 2)), total
config = Config.load()
report = {"rank": r, "size": n, "host": socket.gethostname(), "local_size": commlib.local_size(),
          "fusion": config.fusion_threshold_bytes, "cycle": config.cycle_time_ms, "algorithm": config.algorithm,
          "timeline": config.timeline, "marks": config.timeline_mark_cycles, "stall": config.stall_check_time_s,
          "argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items() if k.startswith("COMMLIB_")}}
commlib.shutdown()
from mpi4py import MPI  # noqa: E402

reports = MPI.COMM_WORLD.gather(report)
if r == 0:
    for one in reports:
        print("RUNJOB " + json.dumps(one), flush=True)
