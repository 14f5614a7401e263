"""A rank that starts commlib, reduces once and prints the timeout its configuration holds
(tests/run/test_launcher_config.py): ``TIMEOUT <rank> <seconds> <COMMLIB_TIMEOUT as given>``."""

import os

import numpy as np

import commlib
from commlib.config import FIELDS, Config

commlib.init()
total = commlib.allreduce(np.ones(3), name="timeout.check", op=commlib.Sum)
assert (total == commlib.size()).all(), total
given = os.environ.get(FIELDS["timeout_s"].env, "")
print(f"TIMEOUT {commlib.rank()} {Config.load().timeout_s:g} {given}", flush=True)
commlib.shutdown()
