"""A summation server's MPI messages against a worker that sends what the protocol does not allow
(tests/server/workers/hostile_mpi.py): pickles where headers belong, oversized and impersonating
headers, non-empty notices, a Geo-SGD open from another worker than 0, values shorter and longer than
their header. The server runs none of it, says what it dropped, refuses the corrupted rounds, and
serves the honest push_pull and Geo-SGD that follow."""

import pytest

from mpirun import run_mpmd


@pytest.mark.mpi
@pytest.mark.parametrize("transport", ["mpi", "tcp"])
def test_hostile_mpi_messages_are_dropped_and_the_honest_workers_served(transport, tmp_path):
    planted = tmp_path / "ran"
    env = {"COMMLIB_SERVER_TRANSPORT": transport, "COMMLIB_SERVER_PARTITION": "4096",
           "COMMLIB_SERVER_TIMEOUT": "20"}
    out = run_mpmd(2, 1, "hostile_mpi.py", str(planted), env=env, timeout=180)
    dropped = [line for line in out.splitlines() if "dropped a malformed" in line]
    assert len(dropped) == 10, "\n".join(dropped)
    for what in ("where a Push (kind 2) belongs", "a Push longer than", "names worker 0", "9 contributors",
                 "exceed a push's", "a bye notice that is not empty", "an exit notice that is not empty",
                 "where a GeoMessage (kind 5) belongs", "only worker 0 opens a table"):
        assert any(what in line for line in dropped), (what, dropped)
    assert out.count("carried") >= 2, out[-3000:]  # the short and the long push, named
    assert not planted.exists()
