"""Geo-SGD through summation servers (docs/servers.md): real MPMD jobs on one host, workers then servers.

A small partition (4 KiB) spreads modest tables over several partitions and every server."""

import pytest

from mpirun import REPO, run_mpmd

pytestmark = pytest.mark.mpi

ENV = {"COMMLIB_SERVER_PARTITION": "4096", "COMMLIB_SERVER_TIMEOUT": "5",
       "PYTHONWARNINGS": "ignore::DeprecationWarning", "PYTHONPATH": str(REPO)}


@pytest.mark.parametrize("workers, servers, cases", [
    (2, 1, "exact,unbounded,average,mismatch,torch"),
    (3, 2, "exact,bound,finish"),
])
def test_geo_sgd(workers, servers, cases):
    if "torch" in cases:
        pytest.importorskip("torch")
    run_mpmd(workers, servers, "geo_check.py", cases, env=ENV, timeout=240, cases=cases.split(","))


def test_a_stopped_server_fails_every_geo_worker_naming_it():
    # every worker's next exchange fails, naming the server; then the job ends (within run_mpmd's timeout)
    out = run_mpmd(2, 2, "geo_check.py", "stopped", env=dict(ENV, COMMLIB_SERVER_TIMEOUT="3"), expect_fail=True,
                   timeout=90, cases=["stopped"])
    assert "COMMLIB_SERVER_TIMEOUT=3" in out and "(rank " in out, out[-3000:]
