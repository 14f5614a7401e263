"""A job whose last rank never starts commlib (it initialised MPI and hangs): init() must fail on every
worker within COMMLIB_START_TIMEOUT, naming that rank."""

import time

import commlib as cl

start = time.monotonic()
try:
    cl.init()
except cl.CommlibError as exc:
    assert "did not start" in str(exc) and "COMMLIB_START_TIMEOUT" in str(exc), str(exc)
    print(f"start failed after {time.monotonic() - start:.1f} s: {exc}", flush=True)
    time.sleep(0.5)  # let the other worker print too
    from mpi4py import MPI

    MPI.COMM_WORLD.Abort(3)  # the job cannot go on without that rank; end it (and the rank that hangs)
raise AssertionError("init() succeeded without the last rank")
