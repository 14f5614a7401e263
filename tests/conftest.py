"""Prints which MPI the tests run on, and puts the test helpers on the import path."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


#: The kinds of test, one marker each (``pytest -m mpi``, ``-m "not cluster"``, ...): a test marked with none
#: of the first three runs inside the pytest process.
MARKERS = {
    "mpi": "launches real MPI jobs (mpiexec) on one host",
    "cluster": "runs across emulated hosts (network namespaces; root) or real daemons on them (Slurm, Ray)",
    "slow": "takes more than about 30 seconds",
}


def pytest_configure(config):
    for name, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


@pytest.fixture(autouse=True, scope="session")
def auto_keeps_nothing():
    """No test starts from, or leaves behind, what auto settled in the user's cache directory (jobs get
    the same from tests/mpirun.py's job_env); a test that keeps state names its own directory."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COMMLIB_AUTO_CACHE", "none")
        yield


def pytest_report_header(config):
    try:
        import mpi4py

        mpi4py.rc.initialize = False  # only read the version; MPI runs in the launched jobs
        from mpi4py import MPI

        return f"MPI: {MPI.Get_library_version().splitlines()[0].strip()}; mpi4py {__import__('mpi4py').__version__}"
    except Exception as exc:  # the header must never break collection
        return f"MPI: unavailable ({exc})"


# -- emulated clusters (commlib.testing.cluster; docs/cluster.md) -----------------------------------------


@pytest.fixture(scope="session")
def make_cluster():
    """Factory ``make_cluster(hosts, rate=None)`` -> an up Cluster; every cluster made during the pytest
    run is torn down at its end, and the teardown asserts that none left anything behind. Skips (saying what is
    missing) where this machine cannot run namespaces."""
    from commlib.testing import netns
    from commlib.testing.cluster import Cluster, leftovers

    made = []

    def make(hosts, rate=None):
        missing = netns.missing_prerequisites(shaped=rate is not None)
        if missing:
            pytest.skip("emulated cluster impossible here: missing " + "; ".join(missing))
        cluster = Cluster(hosts, rate=rate)
        made.append(cluster)
        return cluster.up()

    yield make
    for cluster in made:
        cluster.down()
    left = leftovers([c.name for c in made if c.name])
    assert not left, f"emulated clusters left behind: {left}"
