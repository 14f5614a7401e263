"""A cut link or a frozen host on the emulated cluster: every rank raises PeerLostError within the
timeout, naming an unreachable peer, a second call fails at once, and the job ends (docs/failures.md).

Each case runs tests/transport/workers/link_cut.py on every rank with COMMLIB_TIMEOUT=5 (one case instead with
COMMLIB_STALL_SHUTDOWN_TIME=5, the default timeout: the stall shutdown alone ends it), waits until every rank
loops, then takes the last host's link down (``ip link set <its bridge-side veth> down``) or stops its
rank processes (SIGSTOP), and checks what each rank recorded and that mpiexec itself exited.

CI runs a representative subset (2 hosts x 1 rank: a large allreduce, a 1 MiB one under stall shutdown, a
small eager one, a barrier and a negotiation round cut; 3 x 1 with a frozen host), about 65 s; every case (2 x 2 and 3 x 1 cuts too):
``.venv/bin/python -m pytest --full tests/transport/test_failures.py`` (the ``full`` marker), about 100 s.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpirun import job_env, run_mpi, worker_path

TIMEOUT_S = 5.0
# The bounds below are the feature (a lost peer is reported once the deadline has passed, and the job ends),
# not a measure of speed, so each is far from what load can reach. A rank raises within the timeout plus the
# grace in which it listens for a peer's notice (1 s): RAISE_SLACK_S is six times that grace. It raises no
# earlier than the timeout after its wait began, and that wait began at most one call before the cut (a
# call takes milliseconds to tens of milliseconds): EARLY_S is far above that.
RAISE_SLACK_S = 30.0
EARLY_S = TIMEOUT_S / 2
#: the job (mpiexec) ends within this after the cut: the raise, the exit path's 1 s grace, MPI_Abort
EXIT_WITHIN_S = TIMEOUT_S + 60.0
#: a second call fails at once with the recorded loss; one that waited again would take a whole timeout
AGAIN_WITHIN_S = TIMEOUT_S

full = pytest.mark.full

#: the limit from the stall settings instead of COMMLIB_TIMEOUT (left at its default of 10 minutes)
STALL = {"COMMLIB_STALL_CHECK_TIME": "2", "COMMLIB_STALL_SHUTDOWN_TIME": str(TIMEOUT_S)}

CASES = [
    pytest.param("large", [1, 1], "cut", None, id="2x1-large-cut"),
    pytest.param("1m", [1, 1], "cut", STALL, id="2x1-1m-cut-stall-shutdown"),
    pytest.param("small", [1, 1], "cut", None, id="2x1-small-eager-cut"),
    pytest.param("barrier", [1, 1], "cut", None, id="2x1-barrier-cut"),
    pytest.param("negotiation", [1, 1], "cut", None, id="2x1-negotiation-cut"),
    pytest.param("large", [1, 1, 1], "stop", None, id="3x1-large-frozen-host"),
    pytest.param("large", [2, 2], "cut", None, id="2x2-large-cut", marks=full),
    pytest.param("small", [2, 2], "cut", None, id="2x2-small-eager-cut", marks=full),
    pytest.param("barrier", [1, 1, 1], "cut", None, id="3x1-barrier-cut", marks=full),
    pytest.param("negotiation", [2, 2], "cut", None, id="2x2-negotiation-cut", marks=full),
    pytest.param("small", [1, 1], "stop", None, id="2x1-small-frozen-host", marks=full),
]


def _wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _unmapped_mpich_shm() -> set[str]:
    """MPICH's shared-memory files in /dev/shm that no process maps (what a dead job left behind)."""
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            mapped.update(part for part in maps.read_text().split() if "/dev/shm/mpich_shm_" in part)
        except OSError:
            pass
    return {str(p) for p in Path("/dev/shm").glob("mpich_shm_*")} - mapped


def _namespace_pids(host: str) -> list[str]:
    return subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True).stdout.split()


@pytest.mark.mpi
def test_transport_deadline_on_one_host():
    """A receive from a rank that never sends raises PeerLostError after the timeout, naming it; later
    waits raise the recorded error without waiting again (workers/deadline_check.py; no cluster needed)."""
    run_mpi(2, "deadline_check.py", timeout=60)


@pytest.mark.cluster
@pytest.mark.parametrize("mode, hosts, how, settings", CASES)
def test_every_rank_raises_and_the_job_ends(make_cluster, tmp_path, mode, hosts, how, settings):
    cluster = make_cluster(hosts)
    try:
        _run_case(cluster, tmp_path, mode, hosts, how, settings or {"COMMLIB_TIMEOUT": str(TIMEOUT_S)})
    finally:
        cluster.down()


def _run_case(cluster, folder: Path, mode: str, hosts: list[int], how: str, settings: dict) -> None:
    size = sum(hosts)
    lost_host = len(hosts) - 1
    lost = {r for r in range(size) if cluster.host_of_rank(r) == lost_host}
    env = job_env(settings)
    shm_before = {str(p) for p in Path("/dev/shm").glob("mpich_shm_*")}
    cmd = cluster.mpiexec_args() + [sys.executable, str(worker_path("link_cut.py")), mode, str(folder)]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                           start_new_session=True)
    try:
        ready = _wait_for(lambda: all((folder / f"ready.{r}").exists() for r in range(size)) or job.poll() is not None, 60)
        assert ready and job.poll() is None, f"the job did not start: {job.poll()}"
        if mode == "negotiation":  # every rank stops between calls; the cut comes before the next round
            (folder / "pause").write_text("")
            assert _wait_for(lambda: all((folder / f"paused.{r}").exists() for r in range(size)), 30)
        if how == "cut":
            subprocess.run(["ip", "link", "set", f"{cluster.name}-h{lost_host}", "down"], check=True)
        else:
            pids = _namespace_pids(cluster.hosts[lost_host])
            ranks = [p for p in pids if "link_cut.py" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")]
            assert ranks, f"no rank process found on {cluster.hosts[lost_host]}"
            for pid in ranks:
                os.kill(int(pid), signal.SIGSTOP)
        cut = time.time()
        if mode == "negotiation":
            (folder / "go").write_text("")
        try:
            out, _ = job.communicate(timeout=EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            out = None
        ended = time.time() - cut
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    expect = set(range(size)) if how == "cut" else set(range(size)) - lost
    results = {}
    for r in range(size):
        path = folder / f"result.{r}"
        if path.exists():
            results[r] = json.loads(path.read_text())
    report = "\n".join(f"rank {r}: {res['type']} at +{res['time'] - cut:.1f} s ranks={res['ranks']} "
                       f"again={res['again']} ({res['again_s']:.3f} s): {res['message'][:300]}"
                       for r, res in sorted(results.items()))
    assert out is not None, f"mpiexec still ran {EXIT_WITHIN_S} s after the {how}; results:\n{report}"
    assert expect <= set(results), f"ranks {sorted(expect - set(results))} recorded no failure:\n{report}\n{out[-3000:]}"
    for r in expect:
        res = results[r]
        unreachable = lost if r not in lost else set(range(size)) - lost
        took = res["time"] - cut
        assert res["type"] in ("PeerLostError", "StallShutdown"), report
        assert TIMEOUT_S - EARLY_S <= took <= TIMEOUT_S + RAISE_SLACK_S, f"rank {r} raised at +{took:.1f} s\n{report}"
        assert set(res["ranks"]) & unreachable, f"rank {r} did not name an unreachable rank\n{report}"
        assert res["again"] == "PeerLostError" and res["again_s"] < AGAIN_WITHIN_S, f"rank {r}'s second call\n{report}"
    # nothing left on the hosts (a frozen rank is killed by its proxy when the others abort)
    left = {}
    for host in cluster.hosts:
        _wait_for(lambda: not _namespace_pids(host), 10)
        if _namespace_pids(host):
            left[host] = _namespace_pids(host)
    assert not left, f"processes left on the hosts after the job ended: {left}"
    # the exit path removes MPICH's segments before MPI_Abort; a rank killed while frozen cannot
    shm_left = _unmapped_mpich_shm() - shm_before
    for path in shm_left:
        Path(path).unlink(missing_ok=True)
    if how == "cut":
        assert not shm_left, f"MPICH shared memory left in /dev/shm: {sorted(shm_left)}"
