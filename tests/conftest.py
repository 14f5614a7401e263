"""Prints which MPI the tests run on, and puts the test helpers on the import path."""

import importlib.util
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

# tests/torch, tests/jax, ... are folders of this tree, and tests/ is on the import path (pytest puts a
# conftest's folder there too): where a framework is not installed, ``import torch`` would find the folder
# as an empty namespace package instead of failing, and ``pytest.importorskip`` would not skip. Such an
# import fails here as it does outside the tests.
for _name in sorted(p.name for p in TESTS.iterdir() if p.is_dir()):
    _spec = importlib.util.find_spec(_name) if _name.isidentifier() and _name not in sys.modules else None
    if _spec is not None and _spec.origin is None and all(
            Path(p).resolve().parent == TESTS for p in _spec.submodule_search_locations or []):
        sys.modules[_name] = None


import mpirun  # noqa: E402 - found through the path above

#: The kinds of test, one marker each (``pytest -m mpi``, ``-m "not cluster"``, ...; docs/testing.md): a test
#: marked neither ``mpi`` nor ``cluster`` runs inside the pytest process; ``slow`` goes with either kind.
MARKERS = {
    "mpi": "launches real MPI jobs (mpiexec, or a process that initialises MPI) on one host",
    "cluster": "runs across emulated hosts (network namespaces; root) or real daemons on them (Slurm, Ray)",
    "slow": "takes 15 s or more alone on a 2-core machine (30 s and more under the usual load)",
    "full": "a further rank count, host layout or failure case of one the default suite runs: with --full only",
}


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="also run the tests marked full (further rank counts, layouts, failure cases); CI "
                          "runs without them")


def pytest_configure(config):
    for name, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


def pytest_collection_modifyitems(config, items):
    """Without --full, the tests marked ``full`` are skipped, saying how to run them: the default suite (CI's)
    keeps within 20 minutes on a 2-core machine, and runs each of those cases in other variants."""
    if config.getoption("--full"):
        return
    skip = pytest.mark.skip(reason="a further variant of a case the suite runs; scripts/test.sh --full runs it")
    for item in items:
        if item.get_closest_marker("full") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def auto_keeps_nothing():
    """No test starts from, or leaves behind, what auto settled in the user's cache directory (jobs get
    the same from tests/mpirun.py's job_env); a test that keeps state names its own directory."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COMMLIB_AUTO_CACHE", "none")
        yield


@pytest.fixture(autouse=True, scope="session")
def mpich_leaves_nothing():
    """What aborted MPICH jobs leave behind (tests/mpirun.py's ``mpich_leftovers``) is removed once the
    tests end, too: jobs that tests launch in other ways (commlib-run, torchrun, a cluster's mpiexec, Ray,
    Slurm) abort on purpose as well."""
    before = mpirun.mpich_leftovers()
    yield
    mpirun.remove_new_leftovers(before)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Tell tests/mpirun.py which test runs and its markers (before its fixtures start anything), so that
    launching a job from a test not marked for it fails (mpirun.require_marker)."""
    mpirun.current_test = (item.nodeid, frozenset(m.name for m in item.iter_markers()))


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
        mpirun.require_marker("cluster")
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
