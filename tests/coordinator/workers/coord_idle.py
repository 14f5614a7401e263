"""An initialized but idle job must not burn a core: CPU time over 3 s of idleness stays small.

The bound is on this process's CPU time, which a loaded machine only lowers (a spinning thread would use
most of the 3 s it gets; a sleeping one a few ms), so load cannot fail it."""

import time

import numpy as np

import commlib as cl
import spmd


@spmd.case
def init():
    cl.init()
    cl.allreduce(np.ones(4), name="warm")  # the coordinator has been active once


@spmd.case
def an_idle_job_uses_little_cpu():
    cpu0, wall0 = time.process_time(), time.monotonic()
    time.sleep(3)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    print(f"rank {cl.rank()}: idle cpu {cpu:.3f} s over {wall:.2f} s", flush=True)
    assert cpu < 0.1 * wall, f"idle job used {cpu:.2f} s of CPU in {wall:.2f} s"


@spmd.case
def shutdown():
    cl.shutdown()


if __name__ == "__main__":
    spmd.main()
