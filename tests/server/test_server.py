"""Summation servers and push_pull (docs/servers.md): real MPMD jobs, workers then servers.

A small partition (4 KiB) makes modest tensors span several partitions and servers."""

import pytest

from mpirun import check_report, run_mpi, run_mpmd

SMALL = {"COMMLIB_SERVER_PARTITION": "4096", "COMMLIB_SERVER_TIMEOUT": "3"}
EVERYTHING = "values,orders,wire,ps,sets,mismatch,lonely,reinit"


def applicable(cases: str, workers: int) -> list[str]:
    """The cases of workers/server_check.py that run with this many workers (the others skip)."""
    return [c for c in cases.split(",") if not (c == "sets" and workers < 3 or c in ("mismatch", "lonely")
                                                and workers < 2)]


@pytest.mark.mpi
@pytest.mark.parametrize("workers, servers, cases", [
    (1, 1, "values,orders,wire,ps"),
    (2, 2, EVERYTHING + ",lossy"),
    (3, 3, "values,orders,ps,sets,mismatch"),
    (4, 2, "orders,wire,ps,sets,mismatch,lossy,reinit"),
])
def test_push_pull(workers, servers, cases):
    run_mpmd(workers, servers, "server_check.py", cases, env=SMALL, timeout=240, cases=applicable(cases, workers))


@pytest.mark.mpi
def test_push_pull_over_mpi():
    """COMMLIB_SERVER_TRANSPORT=mpi: partitions and answers through MPI point-to-point instead of TCP."""
    cases = "values,orders,wire,ps,sets,mismatch,reinit,lossy"
    run_mpmd(3, 2, "server_check.py", cases, env=dict(SMALL, COMMLIB_SERVER_TRANSPORT="mpi"), timeout=240,
             cases=cases.split(","))


@pytest.mark.mpi
@pytest.mark.parametrize("workers, servers, cases", [
    (4, 2, "host,values,wire,ps,sets"),  # hosts of 2 workers
    (3, 2, "host,orders,ps,lossy"),  # hosts of 2 workers and of 1
])
def test_push_pull_reduced_inside_hosts(workers, servers, cases):
    """COMMLIB_SERVER_HOST_REDUCE=on with hosts of 2 workers (COMMLIB_LOCAL_SIZE): the workers of a host
    reduce first and the servers count one push per host; results against numpy, the same bits on every
    worker, the elements pushed (the tensor once per host) and a contributor count declared differently."""
    env = dict(SMALL, COMMLIB_LOCAL_SIZE="2", COMMLIB_SERVER_HOST_REDUCE="on")
    run_mpmd(workers, servers, "server_check.py", cases, env=env, timeout=240, cases=applicable(cases, workers))


@pytest.mark.mpi
def test_no_servers_is_a_clear_error():
    run_mpi(2, "server_failure.py", "none", env=SMALL, cases=["ps_without_servers_is_refused_and_commlib_keeps_working"])


@pytest.mark.mpi
def test_a_stopped_server_fails_every_worker_naming_it():
    out = run_mpmd(3, 2, "server_failure.py", "stopped", env=SMALL, expect_fail=True, timeout=90,
                   cases=["every_worker_fails_naming_the_server"])
    assert "COMMLIB_SERVER_TIMEOUT=3" in out and "(rank " in out, out[-3000:]


@pytest.mark.mpi
def test_a_killed_server_ends_the_job():
    # the job ends within run_mpmd's timeout: mpiexec's clean-up ends every process of the job (MPICH's hydra
    # reports the signal), possibly before a worker reported its failure (ranks=[]: no worker must finish,
    # none may fail otherwise)
    out = run_mpmd(2, 2, "server_failure.py", "killed", env=SMALL, expect_fail=True, timeout=90, ranks=[])
    assert "signal 9" in out.lower() or "failed after" in out, out[-3000:]


@pytest.mark.mpi
@pytest.mark.parametrize("workers, servers", [(2, 2)])
def test_torch_byteps_names_and_distributed_optimizer_through_servers(workers, servers):
    pytest.importorskip("torch")
    from mpirun import REPO

    env = dict(SMALL, COMMLIB_ALGORITHM="ps", PYTHONWARNINGS="ignore::DeprecationWarning")
    run_mpmd(workers, servers, "torch_server.py", env=env, timeout=240)


@pytest.mark.cluster
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
    check_report(out, range(2), ["values", "orders", "wire", "ps"])


@pytest.mark.cluster
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
    check_report(out, range(4), ["host", "values", "lossy"])


@pytest.mark.slow
@pytest.mark.mpi
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


@pytest.mark.mpi
def test_a_server_that_never_starts_fails_every_worker_naming_it():
    """The last rank initialises MPI and hangs instead of serving: every worker's init() fails within the
    start deadline, naming its rank."""
    import sys

    from mpirun import run_mpi

    hang = "from mpi4py import MPI; import time; time.sleep(120)"
    out = run_mpi(2, "server_start.py", env=dict(SMALL, COMMLIB_START_TIMEOUT="3"), expect_fail=True,
                  timeout=90, extra=[":", "-n", "1", sys.executable, "-c", hang])
    assert "rank 2 of the MPI job did not start" in out, out[-3000:]


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


@pytest.mark.mpi
def test_priority_sends_higher_priority_partitions_first():
    """2 workers + 1 server on this host: push_pull(priority=) posts a higher-priority tensor's partitions
    before the queued ones of lower priority (the client's trace), equal priorities in submission order,
    the results numpy's with the same bits on every worker (workers/server_priority.py)."""
    run_mpmd(2, 1, "server_priority.py", env={"COMMLIB_SERVER_PARTITION": "262144", "COMMLIB_SERVER_TIMEOUT": "20"},
             timeout=120, cases=["higher_priorities_are_posted_first"])
