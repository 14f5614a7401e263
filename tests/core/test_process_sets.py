"""Process sets (commlib.process_sets) on 1-4 real MPI ranks: collectives inside sets against numpy,
sets beside the world, each set's own node layout, and the errors; a rank that never adds a set is named
within commlib's deadline; sets registered by their members alone (members_only), and a member that
never registers one named within the deadline too."""

import pytest

from mpirun import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_process_sets(nprocs):
    run_mpi(nprocs, "process_sets.py", timeout=180)


@pytest.mark.parametrize("env", [{"COMMLIB_LOCAL_SIZE": "2"}, {"COMMLIB_DIRECT_MAX_RANKS": "0"}],
                         ids=["two_nodes", "relay"])
def test_process_sets_on_four_ranks(env):
    run_mpi(4, "process_sets.py", env=env, timeout=240)


def test_half_type_mpi_ops_are_shared_between_sets_and_lanes():
    run_mpi(4, "process_sets_ops.py", timeout=240)


def test_a_rank_that_never_adds_the_set_is_named_within_the_deadline():
    # a lost peer ends the job at exit (MPI_Abort): the job fails, after rank 0 passed its case
    run_mpi(2, "process_set_absent.py", env={"COMMLIB_TIMEOUT": "1"}, timeout=90, expect_fail=True, ranks=[0],
            cases=["the_set_is_not_agreed_and_the_absent_rank_is_named"])


def test_a_peer_lost_in_the_world_ends_a_wait_in_another_set(tmp_path):
    # rank 0 waits in a set with rank 1, which loses rank 2 in a world allreduce: rank 0 fails at once,
    # naming rank 2 (not when rank 1 exits much later)
    run_mpi(3, "process_set_loss_elsewhere.py", str(tmp_path), env={"COMMLIB_TIMEOUT": "1"}, timeout=120,
            expect_fail=True, ranks=[0, 1], cases=["a_loss_in_the_world_fails_the_wait_in_the_pair"])


def test_members_only_sets_made_by_their_ranks_alone():
    run_mpi(4, "process_sets_members_only.py", timeout=240)


def test_a_member_that_never_adds_the_members_only_set_is_named_within_the_deadline():
    run_mpi(3, "process_set_absent.py", "members_only", env={"COMMLIB_TIMEOUT": "1"}, timeout=90, expect_fail=True,
            ranks=[0, 1], cases=["the_set_is_not_agreed_and_the_absent_rank_is_named"])
