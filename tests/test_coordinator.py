"""The background coordinator on 1-4 real MPI ranks: results, ordering, fusion, lanes, join, errors."""

import pytest

from mpirun import run_mpi


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_collectives_match_numpy(nprocs):
    out = run_mpi(nprocs, "coord_collectives.py", timeout=240)
    assert out.count("collectives OK") == nprocs


@pytest.mark.parametrize("env", [{"COMMLIB_NUM_STREAMS": "3"}, {"COMMLIB_FUSION_THRESHOLD": "0"},
                                 {"COMMLIB_LOCAL_SIZE": "2", "COMMLIB_ALGORITHM": "hierarchical"},
                                 {"COMMLIB_CYCLE_TIME": "5", "COMMLIB_FUSION_THRESHOLD": "4K",
                                  "COMMLIB_FUSION_INPLACE": "1K"}],
                         ids=["lanes3", "nofusion", "hierarchical2x2", "tinyfusion"])
def test_collectives_under_settings(env):
    out = run_mpi(4 if "COMMLIB_LOCAL_SIZE" in env else 2, "coord_collectives.py", env=env, timeout=240)
    assert "collectives OK" in out


CASES = ["shape", "dtype", "op", "root", "scale", "compression", "allgather_shape", "noncontiguous",
         "unsupported_dtype", "average_int", "bad_algorithm", "reuse", "execution_failure"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_raises_on_every_rank(case):
    env = {"COMMLIB_TORUS_SHAPE": "3x1"} if case == "execution_failure" else None
    out = run_mpi(2, "coord_errors.py", case, env=env, timeout=60)
    assert out.count("raised as expected") == 2 and out.count(f"case {case} OK") == 2, out


def test_bad_input_on_three_ranks():
    out = run_mpi(3, "coord_errors.py", "shape", timeout=60)
    assert out.count("raised as expected") == 3


def test_stall_becomes_an_error():
    env = {"COMMLIB_STALL_CHECK_TIME": "0.5", "COMMLIB_STALL_SHUTDOWN_TIME": "1"}
    out = run_mpi(3, "coord_errors.py", "stall", env=env, timeout=60)
    assert out.count("raised as expected") == 2
    assert "commlib stall" in out and "waiting for rank(s) [0]" in out


def test_peer_shutdown_fails_waiting_ranks():
    out = run_mpi(3, "coord_errors.py", "shutdown_peer", timeout=60)
    assert out.count("raised as expected") == 2
