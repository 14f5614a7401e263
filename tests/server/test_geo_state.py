"""Geo-SGD's state lives on the Runtime (one client per init(), closed by shutdown()), its example runs,
and neither commlib.geo nor commlib.server keeps process state in a module."""

import ast

import pytest

from mpirun import REPO, run_mpmd

ENV = {"COMMLIB_SERVER_PARTITION": "4096", "COMMLIB_SERVER_TIMEOUT": "20"}


@pytest.mark.mpi
def test_geo_tables_start_afresh_in_every_runtime():
    run_mpmd(2, 2, "geo_cycles.py", env=ENV, timeout=180)


@pytest.mark.mpi
def test_the_geo_example_runs():
    """examples/geo_sgd.py (what commlib.geo's docstring shows): it exits non-zero unless every
    worker's held-out loss falls tenfold."""
    out = run_mpmd(2, 1, REPO / "examples" / "geo_sgd.py", timeout=180)
    assert out.count("geo_sgd: worker") == 2, out[-3000:]


def test_the_geo_docstring_example_names_what_exists():
    import commlib.geo

    doc = commlib.geo.__doc__
    assert "from commlib.geo import GeoSGD" in doc and "cl.GeoSGD" not in doc


#: What holds process state at module level: an empty container, or a counter.
STATEFUL = ("dict", "list", "set", "count", "defaultdict", "deque", "OrderedDict", "WeakValueDictionary")


@pytest.mark.parametrize("path", sorted((REPO / "commlib" / "server").glob("*.py")) + [REPO / "commlib" / "geo.py"],
                         ids=lambda p: p.name)
def test_no_module_keeps_process_state(path):
    found = []
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        value = node.value
        empty = isinstance(value, ast.Dict) and not value.keys or isinstance(value, (ast.List, ast.Set)) and not value.elts
        called = isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in STATEFUL
        if empty or called:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    assert not found, f"{path.name} keeps state at module level (it belongs on the Runtime): {found}"
