"""Prints which MPI the tests run on, and puts the test helpers on the import path."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_report_header(config):
    try:
        import mpi4py

        mpi4py.rc.initialize = False  # only read the version; MPI runs in the launched jobs
        from mpi4py import MPI

        return f"MPI: {MPI.Get_library_version().splitlines()[0].strip()}; mpi4py {__import__('mpi4py').__version__}"
    except Exception as exc:  # the header must never break collection
        return f"MPI: unavailable ({exc})"
