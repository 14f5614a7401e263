"""Summation servers and push_pull (docs/servers.md): real MPMD jobs, workers then servers.

A small partition (4 KiB) makes modest tensors span several partitions and servers."""

import time

import pytest

from mpirun import run_mpi, run_mpmd

SMALL = {"COMMLIB_SERVER_PARTITION": "4096", "COMMLIB_SERVER_TIMEOUT": "3"}
EVERYTHING = "values,orders,wire,ps,sets,mismatch,lonely,reinit"


@pytest.mark.parametrize("workers, servers, cases", [
    (1, 1, "values,orders,wire,ps"),
    (2, 2, EVERYTHING + ",lossy"),
    (3, 3, "values,orders,ps,sets,mismatch"),
    (4, 2, "orders,wire,ps,sets,mismatch,lossy,reinit"),
])
def test_push_pull(workers, servers, cases):
    out = run_mpmd(workers, servers, "server_check.py", cases, env=SMALL, timeout=240)
    for case in cases.split(","):
        if case in ("sets",) and workers < 3 or case in ("mismatch", "lonely") and workers < 2:
            continue
        assert out.count(f"{case} ok on worker") == workers, out[-3000:]
    assert out.count("done") == workers


def test_push_pull_over_mpi():
    """COMMLIB_SERVER_TRANSPORT=mpi: partitions and answers through MPI point-to-point instead of TCP."""
    cases = "values,orders,wire,ps,sets,mismatch,reinit,lossy"
    out = run_mpmd(3, 2, "server_check.py", cases, env=dict(SMALL, COMMLIB_SERVER_TRANSPORT="mpi"), timeout=240)
    for case in cases.split(","):
        assert out.count(f"{case} ok on worker") == 3, out[-3000:]
    assert out.count("done") == 3


@pytest.mark.parametrize("workers, servers, cases", [
    (4, 2, "host,values,wire,ps,sets"),  # hosts of 2 workers
    (3, 2, "host,orders,ps,lossy"),  # hosts of 2 workers and of 1
])
def test_push_pull_reduced_inside_hosts(workers, servers, cases):
    """COMMLIB_SERVER_HOST_REDUCE=on with hosts of 2 workers (COMMLIB_LOCAL_SIZE): the workers of a host
    reduce first and the servers count one push per host; results against numpy, the same bits on every
    worker, the elements pushed (the tensor once per host) and a contributor count declared differently."""
    env = dict(SMALL, COMMLIB_LOCAL_SIZE="2", COMMLIB_SERVER_HOST_REDUCE="on")
    out = run_mpmd(workers, servers, "server_check.py", cases, env=env, timeout=240)
    for case in cases.split(","):
        if case == "sets" and workers < 3:
            continue
        assert out.count(f"{case} ok on worker") == workers, out[-3000:]
    assert out.count("done") == workers


def test_no_servers_is_a_clear_error():
    out = run_mpi(2, "server_failure.py", "none", env=SMALL)
    assert out.count("none ok on rank") == 2, out


def test_a_stopped_server_fails_every_worker_naming_it():
    out = run_mpmd(3, 2, "server_failure.py", "stopped", env=SMALL, expect_fail=True, timeout=90)
    assert out.count("failed after") == 3, out[-3000:]
    assert "COMMLIB_SERVER_TIMEOUT=3" in out and "(rank " in out, out[-3000:]


def test_a_killed_server_ends_the_job_within_seconds():
    start = time.monotonic()
    out = run_mpmd(2, 2, "server_failure.py", "killed", env=SMALL, expect_fail=True, timeout=90)
    assert time.monotonic() - start < 60
    # mpiexec's clean-up ends every process of the job (MPICH's hydra reports the signal)
    assert "signal 9" in out.lower() or "failed after" in out, out[-3000:]


@pytest.mark.parametrize("workers, servers", [(2, 2)])
def test_torch_byteps_names_and_distributed_optimizer_through_servers(workers, servers):
    pytest.importorskip("torch")
    from mpirun import REPO

    env = dict(SMALL, COMMLIB_ALGORITHM="ps", PYTHONWARNINGS="ignore::DeprecationWarning",
               PYTHONPATH=f"{REPO}:{REPO / 'tests' / 'workers'}")
    out = run_mpmd(workers, servers, "torch_server.py", env=env, timeout=240)
    assert out.count("torch_server OK") == workers, out[-3000:]


def test_push_pull_across_emulated_hosts(make_cluster):
    """Workers on two emulated hosts, a server on a third and one beside worker 0: partitions cross real
    (unshaped) links between network namespaces."""
    import sys

    from mpirun import job_env, worker_path

    cluster = make_cluster([1, 1, 1])
    programs = [([0, 1], [sys.executable, str(worker_path("server_check.py")), "values,orders,wire,ps"]),
                ([2, 0], [sys.executable, "-m", "commlib.server"])]
    try:
        out = cluster.mpiexec_mpmd(programs, timeout=300, env=job_env(SMALL)).stdout
    finally:
        cluster.down()
    for case in ("values", "orders", "wire", "ps"):
        assert out.count(f"{case} ok on worker") == 2, out[-3000:]


def test_push_pull_reduced_inside_emulated_hosts(make_cluster):
    """2 emulated hosts of 2 workers and 2 server hosts, COMMLIB_SERVER_HOST_REDUCE left at auto: the cost
    model reduces inside each host first (the host's link would carry both workers' pushes), and the
    results are numpy's on every worker."""
    import sys

    from mpirun import job_env, worker_path

    cluster = make_cluster([2, 2, 1, 1])
    programs = [([0, 0, 1, 1], [sys.executable, str(worker_path("server_check.py")), "host,values,lossy"]),
                ([2, 3], [sys.executable, "-m", "commlib.server"])]
    try:
        out = cluster.mpiexec_mpmd(programs, timeout=300, env=job_env(SMALL)).stdout
    finally:
        cluster.down()
    for case in ("host", "values", "lossy"):
        assert out.count(f"{case} ok on worker") == 4, out[-3000:]


def test_calibrate_with_servers_measures_ps(tmp_path):
    """--calibrate in a job with servers: ps is timed and corrected like every algorithm, and the profile
    names where the servers were (its corrections hold for that placement only)."""
    import json

    profile = tmp_path / "tuning.json"
    out = run_mpmd(2, 1, "bench_cli.py", "-b", "4K", "-n", "1", "-w", "0", "--rounds", "1", "--algo", "auto",
                   "--calibrate", str(profile), "--json", str(tmp_path / "out.json"), timeout=300)
    doc = json.loads(profile.read_text())
    model = doc["model"]
    assert "ps" in model["corrections"] and model["corrections"]["ps"], out[-3000:]
    assert "+servers:" in model["corrected_for"], model["corrected_for"]
    assert model["server"]["beta_s_per_byte"] > 0, model


def test_a_server_that_never_starts_fails_every_worker_naming_it():
    """The last rank initialises MPI and hangs instead of serving: every worker's init() fails within the
    start deadline, naming its rank."""
    import sys

    from mpirun import run_mpi

    start = time.monotonic()
    hang = "from mpi4py import MPI; import time; time.sleep(120)"
    out = run_mpi(2, "server_start.py", env=dict(SMALL, COMMLIB_START_TIMEOUT="3"), expect_fail=True,
                  timeout=90, extra=[":", "-n", "1", sys.executable, "-c", hang])
    assert time.monotonic() - start < 60
    assert out.count("start failed after") == 2 and "rank 2 of the MPI job did not start" in out, out[-3000:]


def test_priority_orders_the_send_queue():
    """The client's queue alone: a tensor's partitions go behind every queued one of the same or a higher
    priority and ahead of the lower ones; equal priorities stay in submission order."""
    import collections
    import types

    from commlib.server.client import ServerClient

    fake = types.SimpleNamespace(queue=collections.deque())

    def submit(name, priority, parts=2):
        job = types.SimpleNamespace(priority=priority)
        ServerClient.enqueue(fake, [types.SimpleNamespace(job=job, name=f"{name}{i}") for i in range(parts)],
                             priority)

    for name, priority in (("a", 0), ("b", 2), ("c", 1), ("d", 2), ("e", 0), ("f", 3), ("g", -1)):
        submit(name, priority)
    assert [p.name for p in fake.queue] == ["f0", "f1", "b0", "b1", "d0", "d1", "c0", "c1", "a0", "a1",
                                              "e0", "e1", "g0", "g1"]


def test_priority_sends_higher_priority_partitions_first():
    """2 workers + 1 server on this host: push_pull(priority=) posts a higher-priority tensor's partitions
    before the queued ones of lower priority (the client's trace), equal priorities in submission order,
    the results numpy's with the same bits on every worker (workers/server_priority.py)."""
    out = run_mpmd(2, 1, "server_priority.py", env={"COMMLIB_SERVER_PARTITION": "262144",
                                                    "COMMLIB_SERVER_TIMEOUT": "20"}, timeout=120)
    assert out.count("priority ok on worker") == 2, out[-3000:]
