"""The background coordinator on 1-4 real MPI ranks: results, ordering, fusion, lanes, join, errors."""

import ml_dtypes
import numpy as np
import pytest

from mpirun import run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_collectives_match_numpy(nprocs):
    run_mpi(nprocs, "coord_collectives.py", timeout=240)  # every case passed on every rank


@pytest.mark.mpi
@pytest.mark.parametrize("env", [{"COMMLIB_NUM_STREAMS": "3"}, {"COMMLIB_FUSION_THRESHOLD": "0"},
                                 {"COMMLIB_LOCAL_SIZE": "2", "COMMLIB_ALGORITHM": "hierarchical"},
                                 {"COMMLIB_CYCLE_TIME": "5", "COMMLIB_FUSION_THRESHOLD": "4K",
                                  "COMMLIB_FUSION_INPLACE": "1K"},
                                 {"COMMLIB_LOCAL_SIZE": "1"}],
                         ids=["lanes3", "nofusion", "hierarchical2x2", "tinyfusion", "eager4nodes"])
def test_collectives_under_settings(env):
    run_mpi(4 if "COMMLIB_LOCAL_SIZE" in env else 2, "coord_collectives.py", env=env, timeout=240)


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs,local_size", [(2, "1"), (3, "1"), (4, "2")])
def test_eager_small_allreduces_across_nodes(nprocs, local_size):
    """Small allreduces whose data rides in the negotiation round: numpy's results, the same bits on every
    rank, in any submission order, with process sets and join; larger ones take the collective."""
    run_mpi(nprocs, "coord_eager.py", env={"COMMLIB_LOCAL_SIZE": local_size}, timeout=180)


@pytest.mark.mpi
def test_idle_job_does_not_spin():
    run_mpi(2, "coord_idle.py", timeout=60, cases=["an_idle_job_uses_little_cpu"])


CASES = ["readonly", "shape", "dtype", "op", "root", "scale", "compression", "allgather_shape", "noncontiguous",
         "unsupported_dtype", "average_bool", "bad_algorithm", "reuse", "execution_failure", "persistent"]


@pytest.mark.mpi
@pytest.mark.parametrize("case", CASES)
def test_bad_input_raises_on_every_rank(case):
    env = {"COMMLIB_TORUS_SHAPE": "3x1"} if case == "execution_failure" else None
    run_mpi(2, "coord_errors.py", case, env=env, timeout=60, cases=[case, "still_usable"])


@pytest.mark.mpi
def test_bad_input_on_three_ranks():
    run_mpi(3, "coord_errors.py", "shape", timeout=60, cases=["shape", "still_usable"])


@pytest.mark.mpi
def test_stall_becomes_an_error():
    env = {"COMMLIB_STALL_CHECK_TIME": "0.5", "COMMLIB_STALL_SHUTDOWN_TIME": "1"}
    out = run_mpi(3, "coord_errors.py", "stall", env=env, timeout=60, cases=["stall", "still_usable"])
    assert "commlib stall" in out and "waiting for rank(s) [0]" in out  # the stall warning came first


@pytest.mark.mpi
@pytest.mark.parametrize("case", ["shutdown_peer", "shutdown_root"])
def test_peer_shutdown_fails_waiting_ranks(case):
    run_mpi(3, "coord_errors.py", case, timeout=60, cases=[case])


RELAY = {"COMMLIB_DIRECT_MAX_RANKS": "0"}  # negotiation messages through rank 0 even on a few ranks


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 4])
def test_collectives_through_the_relay(nprocs):
    run_mpi(nprocs, "coord_collectives.py", env=RELAY, timeout=240)


@pytest.mark.mpi
@pytest.mark.parametrize("case", ["shape", "reuse", "shutdown_peer", "shutdown_root"])
def test_errors_through_the_relay(case):
    run_mpi(3, "coord_errors.py", case, env=RELAY, timeout=60, cases=[case])


@pytest.mark.mpi
def test_stall_through_the_relay():
    env = {**RELAY, "COMMLIB_STALL_CHECK_TIME": "0.5", "COMMLIB_STALL_SHUTDOWN_TIME": "1"}
    out = run_mpi(3, "coord_errors.py", "stall", env=env, timeout=60, cases=["stall", "still_usable"])
    assert "waiting for rank(s) [0]" in out


def _results(tmp_path, nprocs, env):
    out_dir = tmp_path / "_".join(f"{k}{v}" for k, v in env.items())
    out_dir.mkdir()
    run_mpi(nprocs, "coord_results.py", str(out_dir), env=env, timeout=120)
    per_rank = []
    for rank in range(nprocs):
        with np.load(out_dir / f"rank{rank}.npz") as data:
            per_rank.append([data[f"arr_{i}"] for i in range(len(data.files))])
    for other in per_rank[1:]:  # every rank holds the very same result
        assert all(np.array_equal(a, b) for a, b in zip(per_rank[0], other))
    return per_rank[0]


def _as_float(array, index):
    if index % 5 == 2:  # stored as the bits of bfloat16
        return array.view(ml_dtypes.bfloat16).astype(np.float64)
    return array.astype(np.float64)


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_results_do_not_depend_on_lanes(tmp_path, nprocs):
    """Lanes change only which thread runs a response. Fusion grouping (which depends on timing) can move
    a tensor to another chunk of a ring, whose partial sums round in another order, so the comparison
    allows the rounding of the tensor's type (and of float16 on the wire for the compressed ones)."""
    one = _results(tmp_path, nprocs, {"COMMLIB_NUM_STREAMS": "1"})
    three = _results(tmp_path, nprocs, {"COMMLIB_NUM_STREAMS": "3"})
    for i, (a, b) in enumerate(zip(one, three)):
        atol = {0: 0.2 if i % 3 == 0 else 1e-4, 1: 1e-9, 2: 1.0, 3: 0.2, 4: 0}[i % 5]
        assert np.allclose(_as_float(a, i), _as_float(b, i), rtol=0, atol=atol), i


@pytest.mark.mpi
def test_timeline_records_every_phase(tmp_path):
    import json

    path = tmp_path / "trace.json"
    run_mpi(2, "coord_results.py", str(tmp_path), env={"COMMLIB_TIMELINE": str(path), "COMMLIB_NUM_STREAMS": "2"},
            timeout=120)
    for rank in range(2):
        events = json.loads((tmp_path / ("trace.json" if rank == 0 else f"trace.rank{rank}.json")).read_text())
        phases = {e["name"] for e in events if e.get("ph") == "X"}
        # Horovod's activity names, so its timeline documentation reads the file
        assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE",
                "MEMCPY_OUT_FUSION_BUFFER"} <= phases, phases
        comm = [e for e in events if e.get("name") == "MPI_ALLREDUCE"]
        assert all("algorithm" in e["args"] and "lane" in e["args"] for e in comm)
        assert any(e["args"]["compression"] == "fp16" for e in comm)
        # each tensor is a row of its own, named after it (Horovod's layout)
        rows = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name" and e["pid"]}
        assert len(set(rows.values())) == len(rows) > 1
        assert all(rows[e["pid"]] for e in comm)


def test_fusion_groups_bound_the_packed_bytes_only():
    from commlib.coordinator.fusion import fuse
    from commlib.coordinator.requests import Kind, Meta, Response

    def allreduce(name, count, dtype="float32", op=0):
        return Response(Kind.ALLREDUCE, [Meta(name, Kind.ALLREDUCE, dtype, (count,), op=op)])

    def groups(responses, threshold, inplace):
        return [[m.name for m in r.metas] for r in fuse(responses, threshold, inplace)]

    def small():  # 400 B each: packed (fresh responses each time: fuse extends the first of a group)
        return [allreduce(f"s{i}", 100) for i in range(5)]

    def large():  # 40 KB each: in place
        return [allreduce(f"L{i}", 10_000) for i in range(2)]

    # in-place tensors never count against the threshold: one group, whatever their size
    assert groups(small()[:2] + large() + small()[2:], 4096, 1024) == [["s0", "s1", "L0", "L1", "s2", "s3", "s4"]]
    # packed bytes are bounded: 1000 B holds two 400 B tensors
    assert groups(small(), 1000, 1024) == [["s0", "s1"], ["s2", "s3"], ["s4"]]
    # incompatible dtypes or ops never share a group; other kinds stay as they are, in order
    barrier = Response(Kind.BARRIER, [Meta("b", Kind.BARRIER, "float32", ())])
    mixed = [*small()[:1], allreduce("d", 100, "float64"), barrier, allreduce("m", 100, op=3), small()[1]]
    assert groups(mixed, 4096, 1024) == [["s0", "s1"], ["d"], ["b"], ["m"]]
    # a threshold of 0 turns fusion off
    assert groups(small()[:2] + large(), 0, 1024) == [["s0"], ["s1"], ["L0"], ["L1"]]


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_settings_that_must_agree_are_checked_at_init(nprocs):
    run_mpi(nprocs, "config_mismatch.py", timeout=60)


# The leave tests need no clock: the others' errors say how they learned of the rank (it left, exited without
# shutdown(), sent no coordinator message); had they waited for a timeout instead (COMMLIB_TIMEOUT is 10
# minutes by default), the job would have run past run_mpi's timeout and failed.
FAILS_NAMING_IT = ["a_call_fails_naming_the_rank_that_left", "the_next_call_fails_too"]


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_a_rank_that_exits_without_shutdown_fails_the_others(nprocs):
    out = run_mpi(nprocs, "coord_leave.py", "exit", timeout=60, ranks=range(nprocs - 1), cases=FAILS_NAMING_IT)
    assert out.count("left: its process exited without calling commlib.shutdown()") >= nprocs - 1, out


@pytest.mark.mpi
@pytest.mark.parametrize("env", [{}, RELAY], ids=["direct", "relay"])
def test_rank_0_leaving_fails_the_others(env):
    out = run_mpi(3, "coord_leave.py", "exit", "0", env=env, timeout=60, ranks=[1, 2], cases=FAILS_NAMING_IT)
    assert "rank 0 left" in out, out


@pytest.mark.mpi
def test_a_rank_that_leaves_fails_the_others_join():
    run_mpi(3, "coord_leave.py", "join", timeout=60, ranks=[0, 1], cases=["join_fails_naming_the_rank_that_left"])


@pytest.mark.mpi
def test_a_rank_that_dies_of_an_exception_fails_the_others():
    # mpiexec ends the job on the non-zero exit; a rank that reported before that passed (ranks=[]: none must)
    out = run_mpi(3, "coord_leave.py", "raise", timeout=60, expect_fail=True, ranks=[])
    assert "rank leaves by an uncaught exception" in out


@pytest.mark.mpi
@pytest.mark.parametrize("env", [{}, RELAY], ids=["direct", "relay"])
def test_stall_shutdown_without_the_silent_rank(env, tmp_path):
    env = {**env, "COMMLIB_STALL_CHECK_TIME": "1", "COMMLIB_STALL_SHUTDOWN_TIME": "2",
           "COORD_LEAVE_MARKER": str(tmp_path / "reported")}
    # a lost peer ends the job (MPI_Abort at exit, docs/failures.md): the job fails, after every rank (the silent
    # one too, once it woke) passed its cases
    out = run_mpi(3, "coord_leave.py", "hold", env=env, timeout=90, expect_fail=True, cases=FAILS_NAMING_IT)
    assert "sent no coordinator message" in out, out


@pytest.mark.mpi
@pytest.mark.parametrize("env", [{}, RELAY], ids=["direct", "relay"])
def test_a_rank_silent_between_rounds_is_given_up_on(env, tmp_path):
    """The last rank goes silent after the others' round announcing a tensor it never submits, with no
    round open (as a killed Ray actor did in an elastic run): the others start an empty round, it stays
    unanswered, and they give up on it naming it, with COMMLIB_TIMEOUT and no stall shutdown time. Without
    that round they would wait until it woke (and then go on as if nothing had happened)."""
    env = {**env, "COMMLIB_TIMEOUT": "3", "COORD_LEAVE_MARKER": str(tmp_path / "reported")}
    out = run_mpi(3, "coord_leave.py", "quiet", env=env, timeout=120, expect_fail=True, cases=FAILS_NAMING_IT)
    assert "sent no coordinator message" in out, out
