"""The lone path (a synchronous call with nothing else under way, run by its own thread) against the general
cycle, driven by a waiting thread or by the background thread: the same results and the same errors, with
lanes, process sets, priorities, mismatches and a rank that leaves (docs/coordinator.md, "Who drives")."""

import re

import pytest

from mpirun import run_mpi

RESULTS = ["results_match_every_dtype_size_and_op", "a_priority_goes_to_the_cycle_and_matches"]
#: auto as the model's choice alone: while auto learns, two calls of one size may run different algorithms,
#: whose float sums may differ in the last bits whichever path runs them (docs/algorithms.md)
SAME_ALGORITHM = {"COMMLIB_AUTO_LEARN": "0"}


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_results_match_the_general_cycle(nprocs):
    cases = RESULTS + (["a_process_set_matches"] if nprocs >= 3 else [])
    run_mpi(nprocs, "coord_inline.py", "results", env=SAME_ALGORITHM, timeout=300, cases=cases)


@pytest.mark.mpi
@pytest.mark.parametrize("env", [{"COMMLIB_NUM_STREAMS": "2"}, {"COMMLIB_DIRECT_MAX_RANKS": "0"}],
                         ids=["lanes2", "relay"])
def test_results_match_with_lanes_and_the_relay(env):
    run_mpi(2, "coord_inline.py", "results", env={**SAME_ALGORITHM, **env}, timeout=300, cases=RESULTS)


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_a_mismatch_is_the_same_error_on_every_path(nprocs):
    run_mpi(nprocs, "coord_inline.py", "mismatch", timeout=120,
            cases=["a_mismatch_is_the_same_error_on_every_path"])


@pytest.mark.mpi
def test_a_rank_that_leaves_is_the_same_error_on_every_path():
    errors = {}
    for how in ("sync", "background"):
        out = run_mpi(3, "coord_inline.py", "leave", how, timeout=120, ranks=[0, 1],
                      cases=["a_rank_that_leaves_is_named"])
        # (each error up to the next rank's, should two ranks' lines still share one)
        found = re.findall(rf"rank \d {how} error: (.*?)(?=rank \d {how} error: |$)", out, re.M)
        assert len(found) == 2, out
        errors[how] = {re.sub(r"'grad'", "NAME", text) for text in found}
    assert errors["sync"] == errors["background"], errors
