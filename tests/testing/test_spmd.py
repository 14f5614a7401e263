"""The tests' own machinery: workers' named cases per rank (tests/spmd.py) as run_mpi reads them, and the
markers a test that launches jobs must carry (tests/mpirun.py)."""

import re

import pytest

import mpirun
from mpirun import MPIJobFailed, UnmarkedTest, read_report, run_mpi

DEMO = "spmd_demo.py"


def _line(**fields):
    import json

    return "@spmd " + json.dumps(fields)


def test_the_report_is_read_where_each_line_starts():
    out = "\n".join([
        _line(rank=0, size=2, plan=["a", "b"]),
        "some output " + _line(rank=1, size=2, plan=["a", "b"]),  # another rank's text before it
        _line(rank=0, size=2, case="a", result="ok") + "[1] half a line",
        _line(rank=1, size=2, case="a", result="ok"),
        _line(rank=0, size=2, case="b", result="skipped", reason="one rank"),
        _line(rank=0, size=2, done=2),
        "@spmd {not json",
    ])
    report = read_report(out)
    assert report.plans == {0: ["a", "b"], 1: ["a", "b"]} and report.done == {0}
    assert report.passed("a") == {0, 1} and report.passed("b") == set()
    assert report.unfinished(1) == "in case 'b'" and report.unfinished(0) == "after its last case"
    assert report.problems([0, 1]) == ["rank 1 did not finish its cases: in case 'b'"]
    assert report.problems([0], cases=["b"], size=1) == [
        "case 'b' did not pass on rank 0 (skipped)", "ranks [1] reported cases but the job's script runs on ranks 0-0 only"]
    failed = read_report(_line(rank=1, size=2, case="b", result="failed", error="AssertionError: x"))
    assert failed.failures() == ["case 'b' failed on rank 1: AssertionError: x"]
    assert read_report("").problems([0]) == [
        "rank 0 did not finish its cases: reported no plan (it failed or was killed before its first case)"]


def test_a_test_without_its_marker_cannot_launch_a_job(monkeypatch):
    monkeypatch.setattr(mpirun, "current_test", ("tests/x/test_y.py::test_z", frozenset({"slow"})))
    with pytest.raises(UnmarkedTest, match=r"test_z launches mpi or cluster work.*@pytest.mark.mpi"):
        run_mpi(2, DEMO)
    with pytest.raises(UnmarkedTest, match="@pytest.mark.cluster"):
        mpirun.run_on_cluster(None, DEMO)
    monkeypatch.setattr(mpirun, "current_test", ("tests/x/test_y.py::test_z", frozenset({"mpi"})))
    mpirun.require_marker("mpi", "cluster")


@pytest.mark.mpi
def test_every_rank_reports_every_case():
    out = run_mpi(3, DEMO, "passes,skips_on_rank_0,mpi_barrier", cases=["passes", "mpi_barrier"], timeout=60)
    report = read_report(out)
    assert report.plans == {r: ["passes", "skips_on_rank_0", "mpi_barrier"] for r in range(3)}
    assert report.passed("mpi_barrier") == {0, 1, 2} and report.passed("skips_on_rank_0") == {1, 2}
    assert report.results[0]["skips_on_rank_0"]["reason"] == "this case does not apply to rank 0"


@pytest.mark.mpi
def test_a_failing_case_names_itself_and_its_rank_and_ends_the_job():
    with pytest.raises(MPIJobFailed) as failed:
        run_mpi(3, DEMO, "passes,mpi_barrier,fails_on_the_last_rank,hangs_on_rank_0", timeout=60)
    first = str(failed.value).splitlines()[0]
    assert first == "case 'fails_on_the_last_rank' failed on rank 2: AssertionError: rank 2 is the last", first
    assert "exit code" in str(failed.value)  # the job ended (rank 0 did not go on to hang)


@pytest.mark.mpi
def test_a_case_asked_for_must_pass_on_every_rank():
    with pytest.raises(MPIJobFailed, match=r"case 'skips_on_rank_0' did not pass on rank 0 \(skipped\)"):
        run_mpi(2, DEMO, "passes,skips_on_rank_0", cases=["skips_on_rank_0"], timeout=60)
    with pytest.raises(MPIJobFailed, match=r"case 'mpi_barrier' did not pass on rank 0 \(not run\)"):
        run_mpi(2, DEMO, "passes", cases=["mpi_barrier"], timeout=60)


@pytest.mark.slow
@pytest.mark.mpi
def test_a_timeout_says_where_each_rank_was():
    with pytest.raises(MPIJobFailed) as failed:
        run_mpi(2, DEMO, "passes,hangs_on_rank_0", timeout=8)
    text = str(failed.value)
    assert "rank 0 did not finish its cases: in case 'hangs_on_rank_0'" in text, text
    assert "timed out after 8s; rank 0 in case 'hangs_on_rank_0', rank 1 after its last case" in text, text
    # and every rank's stacks: rank 0's names the function it hung in (a hang in CI shows where it waited)
    assert re.search(r'File ".*spmd_demo.py", line \d+ in hangs_on_rank_0', text), text[-5000:]


@pytest.mark.mpi
def test_a_job_that_ends_on_purpose_ends_after_its_cases():
    """expect_fail: the job must fail, and still every rank must have passed its cases first."""
    with pytest.raises(MPIJobFailed) as failed:
        run_mpi(2, DEMO, "passes,fails_on_the_last_rank", expect_fail=True, timeout=60)
    assert str(failed.value).splitlines()[:2] == [
        "case 'fails_on_the_last_rank' failed on rank 1: AssertionError: rank 1 is the last",
        "rank 1 did not finish its cases: in case 'fails_on_the_last_rank'"], str(failed.value)
    with pytest.raises(MPIJobFailed, match="expected the job to fail, but it succeeded"):
        run_mpi(2, DEMO, "passes", expect_fail=True, timeout=60)
