"""Importing commlib starts nothing: MPI is initialized by init(), so mpi4py.rc can still be set."""

import subprocess
import sys

import pytest

from mpirun import REPO

pytestmark = pytest.mark.mpi

CHECK = """
import sys
import commlib, commlib.torch, commlib.bench.cli
assert 'mpi4py.MPI' not in sys.modules, 'importing commlib imported mpi4py.MPI'
try:
    commlib.bench.cli.main(['--help'])
except SystemExit:
    pass
assert 'mpi4py.MPI' not in sys.modules, 'commlib-bench --help imported mpi4py.MPI'
import mpi4py
mpi4py.rc.thread_level = 'multiple'   # still possible: MPI is not initialized yet
commlib.init()
from mpi4py import MPI
assert MPI.Is_initialized() and MPI.Query_thread() == MPI.THREAD_MULTIPLE
assert commlib.size() == 1 and commlib.global_process_set.size() == 1
commlib.shutdown()
print('import OK')
"""


def test_import_does_not_initialize_mpi():
    out = subprocess.run([sys.executable, "-c", CHECK], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "import OK" in out.stdout, out.stdout + out.stderr
