"""A job whose last rank never starts commlib (it initialised MPI and hangs): init() must fail on every
worker within COMMLIB_START_TIMEOUT, naming that rank."""

import sys
import time

import commlib as cl

start = time.monotonic()
try:
    cl.init()
except cl.CommlibError as exc:
    assert "did not start" in str(exc) and "COMMLIB_START_TIMEOUT" in str(exc), str(exc)
    print(f"start failed after {time.monotonic() - start:.1f} s: {exc}", flush=True)
    sys.exit(3)
raise AssertionError("init() succeeded without the last rank")
