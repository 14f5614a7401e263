"""An initialized but idle job must not burn a core: CPU time over 3 s of idleness stays small."""

import time

import numpy as np

import commlib as cl

cl.init()
cl.allreduce(np.ones(4), name="warm")  # the coordinator has been active once
cpu0, wall0 = time.process_time(), time.monotonic()
time.sleep(3)
cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
print(f"rank {cl.rank()}: idle cpu {cpu:.3f} s over {wall:.2f} s", flush=True)
assert cpu < 0.1 * wall, f"idle job used {cpu:.2f} s of CPU in {wall:.2f} s"
cl.shutdown()
