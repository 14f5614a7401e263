"""HierarchicalModelAverager on process sets through the coordinator (tests/torch/workers/torch_averagers.py):
its averages against numpy on 1 host x 2-4 ranks and across 2 emulated hosts, a clear error for a group
the user registered already, and a lost peer (a stopped rank, a cut link) raised as PeerLostError on every
live rank within COMMLIB_TIMEOUT, naming a lost rank, after which the job ends."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from mpirun import job_env, mpiexec, run_mpi, run_on_cluster  # noqa: E402

WORKER = Path(__file__).resolve().parent / "workers" / "torch_averagers.py"
TIMEOUT_S = 5
#: the bound on a raise after the loss: the deadline plus ample room for a loaded 2-core machine (the
#: averager this replaced waited in MPI_Allreduce for ever)
RAISE_WITHIN_S = TIMEOUT_S + 40


def _cases(size: int, small_group: int) -> list[str]:
    """The cases each rank must pass (the duplicate group's only where a small group is a real subset)."""
    return ["averages"] + (["duplicate_group_then_recovers"] if 1 < small_group < size else [])


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs, small_group", [(2, 1), (3, 1), (4, 2)])
def test_averages_match_numpy_on_one_host(nprocs, small_group):
    run_mpi(nprocs, WORKER, "check", timeout=180, cases=_cases(nprocs, small_group))


@pytest.mark.cluster
def test_averages_within_hosts_and_across_two_emulated_hosts(make_cluster):
    cluster = make_cluster([2, 2])
    try:
        run_on_cluster(cluster, WORKER, "check", timeout=240, cases=_cases(4, 2))
    finally:
        cluster.down()


def _wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _lose_a_peer(cmd: list[str], env: dict, folder: Path, size: int, live: set, lose) -> tuple[float, dict, str]:
    """Start the ``lose`` job, wait until every rank averages in a loop, call ``lose()``; return when it
    happened, each rank's recorded failure and the job's output."""
    ranks = ",".join(map(str, sorted(live)))
    job = subprocess.Popen(cmd + [sys.executable, str(WORKER), "lose", str(folder), ranks], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=job_env(env), start_new_session=True)
    try:
        ready = _wait_for(lambda: all((folder / f"ready.{r}").exists() for r in range(size)) or
                          job.poll() is not None, 120)
        assert ready and job.poll() is None, f"the job did not start: {job.poll()}\n{job.communicate()[0][-3000:]}"
        lose()
        lost_at = time.time()
        try:
            out, _ = job.communicate(timeout=RAISE_WITHIN_S + 30)
        except subprocess.TimeoutExpired:
            out = None
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    results = {r: json.loads((folder / f"result.{r}").read_text()) for r in range(size)
               if (folder / f"result.{r}").exists()}
    assert out is not None, f"the job still ran {RAISE_WITHIN_S + 30} s after the loss; results: {results}"
    return lost_at, results, out


def _check_every_live_rank(lost_at: float, results: dict, out: str, live: set, lost: set, cut: bool) -> None:
    """Every live rank raised PeerLostError within the bound, naming a rank. A rank may name the peer it
    waited for, which itself waited for a lost one (a host's partner in a hierarchical allreduce), so the
    lost side is checked over all ranks: after a stop some rank names the stopped one; after a cut, ranks
    of each side name ranks of the other."""
    report = "\n".join(f"rank {r}: {res['type']} at +{res['time'] - lost_at:.1f} s ranks={res['ranks']} "
                       f"step {res['step']}: {res['message'][:300]}" for r, res in sorted(results.items()))
    assert live <= set(results), f"ranks {sorted(live - set(results))} raised nothing:\n{report}\n{out[-3000:]}"
    for r in live:
        res = results[r]
        assert res["type"] == "PeerLostError", f"rank {r}\n{report}"
        assert res["time"] - lost_at <= RAISE_WITHIN_S, f"rank {r} raised late\n{report}"
        assert res["ranks"], f"rank {r} named no rank\n{report}"
    sides = [(live - lost, lost), (lost, live - lost)] if cut else [(live, lost)]
    for side, other in sides:
        assert any(set(results[r]["ranks"]) & other for r in side), f"no rank of {sorted(side)} named one of " \
                                                                    f"{sorted(other)}\n{report}"


@pytest.mark.mpi
def test_a_stopped_rank_is_peer_lost_on_every_live_rank(tmp_path):
    """4 ranks as 2 nodes of 2 (COMMLIB_LOCAL_SIZE): rank 3 stops while the pairs and the world average in
    turn; its pair partner fails in the pair's set, the others at the world's average."""
    stopped = 3
    env = {"COMMLIB_TIMEOUT": str(TIMEOUT_S), "COMMLIB_LOCAL_SIZE": "2"}

    def stop():
        os.kill(int((tmp_path / f"ready.{stopped}").read_text()), signal.SIGSTOP)

    try:
        lost_at, results, out = _lose_a_peer([mpiexec(), "-n", "4"], env, tmp_path, 4, {0, 1, 2}, stop)
    finally:  # the others' MPI_Abort ends it; never leave a stopped process behind
        try:
            pid = int((tmp_path / f"ready.{stopped}").read_text())
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass
    _check_every_live_rank(lost_at, results, out, {0, 1, 2}, {stopped}, cut=False)


@pytest.mark.cluster
def test_a_cut_link_is_peer_lost_on_every_rank(make_cluster, tmp_path):
    """2 hosts x 2 ranks: host 1's link goes down; every rank fails, naming a rank of the other host."""
    cluster = make_cluster([2, 2])
    try:
        def cut():
            subprocess.run(["ip", "link", "set", f"{cluster.name}-h1", "down"], check=True)

        lost_at, results, out = _lose_a_peer(cluster.mpiexec_args(), {"COMMLIB_TIMEOUT": str(TIMEOUT_S)},
                                             tmp_path, 4, {0, 1, 2, 3}, cut)
    finally:
        cluster.down()
    _check_every_live_rank(lost_at, results, out, {0, 1, 2, 3}, {r for r in range(4) if cluster.host_of_rank(r) == 1},
                           cut=True)
