"""The ``commlib`` backend's Work, errors, options and launchers, and a cut link within the group's timeout.

- ``workers/torch_work.py`` on 1-3 ranks: ``wait``/``is_completed``/``result``, futures that complete by
  themselves (also before the slowest rank has called), which synchronous all_reduces take the short path
  (and the same results either way), a callback that runs and waits for another
  collective, 40 calls in flight, the memory of finished calls released, a mismatched shape as an error on
  every rank after which the group still works, the error on the Work and its future, per-group options
  (fp16, an algorithm, a lossy compressor giving what commlib's own allreduce gives) and their errors, a
  send's future, sparse all_reduce (and DDP's sparse gradients) against the dense sum, a group's timeout
  bounding a synchronous call that no peer joins, groups made by their members alone (``new_subgroups(group=...)``,
  ``new_group(..., use_local_synchronization=True)``) giving gloo's results.
- ``workers/torch_launch.py``: ``init_process_group("commlib")`` without importing commlib, under mpiexec (also
  with a summation server in the job) and under torchrun (no MPI launcher: the MPI world is built from
  torch's store).
- ``workers/torch_torchrun_hosts.py``: one torchrun per emulated host; one node per host, and a large
  all_reduce that crosses the shaped link.
- ``workers/torch_link_cut.py`` on 2 emulated hosts: the link cut, every rank raises torch's
  ``DistBackendError`` within the process group's timeout, naming the lost rank.
- In process: the rendezvous decision, Options, the backend known by name to a fresh interpreter, and
  ``import torch`` unharmed where commlib cannot load.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from commlib.testing import daemons
from commlib.testing.cluster import MPI_ENV
from mpirun import check_report, job_env, run_mpi, run_mpmd, worker_path
from torch_jobs import CLUSTER_ENV

# A cut link (as tests/transport/test_failures.py, whose reasons hold here): the bounds are the feature (a
# lost peer is reported once the group's timeout has passed), not a speed, so each is far from what load can
# reach. A rank raises within the timeout plus commlib's grace for a peer's notice (1 s); RAISE_SLACK_S is
# thirty times that. It raises no earlier than the timeout after its wait began, which began at most one
# call (milliseconds) before the cut: EARLY_S is far above that.
TIMEOUT_S = 5.0
RAISE_SLACK_S = 30.0
EARLY_S = TIMEOUT_S / 2
#: the job ends within this after the cut: the raise, commlib's exit path, MPI_Abort
EXIT_WITHIN_S = TIMEOUT_S + 60.0
#: a second call fails at once with the recorded loss; one that waited again would take a whole timeout
AGAIN_WITHIN_S = TIMEOUT_S
#: the link between the hosts of the multi-node torchrun test
LINK_MBIT = 100


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, pytest.param(3, marks=pytest.mark.full)])
def test_work_rules_errors_and_options(ranks):
    run_mpi(ranks, "torch_work.py", timeout=240)


@pytest.mark.mpi
def test_init_process_group_under_mpiexec():
    run_mpi(3, "torch_launch.py", timeout=120)


@pytest.mark.mpi
def test_init_process_group_under_mpiexec_with_summation_servers():
    """2 workers and a summation server in one MPMD job, every allreduce through the server: the
    rendezvous and commlib's init() find the job's layout once (a server answers one roll call)."""
    run_mpmd(2, 1, "torch_launch.py", "1", timeout=180, env={"COMMLIB_ALGORITHM": "ps"})


@pytest.mark.mpi
def test_init_process_group_under_torchrun(tmp_path):
    """torchrun starts plain processes: the backend builds MPI's world from torch's store (its PMI bridge)."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--standalone", "--nproc-per-node", "2", str(worker_path("torch_launch.py"))]
    env = {k: v for k, v in job_env().items() if not k.startswith(("PMI_", "PMIX_", "OMPI_"))}
    env["TMPDIR"] = str(tmp_path)  # torchrun leaves a torchelastic_* folder in the temporary directory
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    check_report(out, range(2), what="torchrun's job")


def _rendezvous(kind: str, cluster, i: int) -> list[str]:
    """torchrun's arguments for host ``i``: a static rendezvous (node ranks given, the store on host 0), or
    the c10d one torchrun's docs recommend (node ranks agreed on, each agent found by its host's name)."""
    if kind == "static":
        return ["--node-rank", str(i), "--master-addr", cluster.host_address(0), "--master-port", "29500"]
    return ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{cluster.host_address(0)}:29500", "--rdzv-id",
            cluster.name]


@pytest.mark.cluster
@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_torchrun_across_emulated_hosts(make_cluster, tmp_path, rendezvous):
    """Multi-node torchrun (one per emulated host, a static or a c10d rendezvous on host 0): commlib's world is
    one rank per host, and its all_reduce crosses the shaped link."""
    cluster = make_cluster([1, 1], rate=f"{LINK_MBIT}mbit")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {k: v for k, v in job_env({**CLUSTER_ENV, **MPI_ENV}).items() if not k.startswith(("PMI_", "PMIX_", "OMPI_"))}
    env["TMPDIR"] = str(tmp_path)
    logs = [tmp_path / f"host{i}.log" for i in range(2)]
    jobs = [daemons.start(host, [torchrun, "--nnodes", "2", "--nproc-per-node", "1",
                                 *_rendezvous(rendezvous, cluster, i),
                                 str(worker_path("torch_torchrun_hosts.py")), "2", str(LINK_MBIT)], log, env)
            for i, (host, log) in enumerate(zip(cluster.hosts, logs))]
    try:
        codes = [job.wait(timeout=180) for job in jobs]
    finally:
        for job in jobs:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
    out = "\n".join(log.read_text(errors="replace") for log in logs)
    assert codes == [0, 0], out[-4000:]
    check_report(out, range(2), what="torchrun's jobs on two hosts")


@pytest.mark.cluster
def test_cut_link_raises_within_the_group_timeout(make_cluster, tmp_path):
    cluster = make_cluster([1, 1])
    cmd = cluster.mpiexec_args() + [sys.executable, str(worker_path("torch_link_cut.py")), str(TIMEOUT_S),
                                    str(tmp_path)]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job_env(CLUSTER_ENV),
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not all((tmp_path / f"ready.{r}").exists() for r in range(2)):
            assert job.poll() is None and time.monotonic() < deadline, f"the job did not start: {job.poll()}"
            time.sleep(0.05)
        subprocess.run(["ip", "link", "set", f"{cluster.name}-h1", "down"], check=True)
        cut = time.time()
        try:
            out, _ = job.communicate(timeout=EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            out = None
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    results = {r: json.loads((tmp_path / f"result.{r}").read_text()) for r in range(2)
               if (tmp_path / f"result.{r}").exists()}
    report = "\n".join(f"rank {r}: {res['type']} at +{res['time'] - cut:.1f} s ranks={res['ranks']} "
                       f"again={res['again']} ({res['again_s']:.3f} s): {res['message'][:300]}"
                       for r, res in sorted(results.items()))
    assert out is not None, f"the job still ran {EXIT_WITHIN_S} s after the cut:\n{report}"
    assert set(results) == {0, 1}, f"ranks without a failure:\n{report}\n{(out or '')[-3000:]}"
    for r, res in results.items():
        took = res["time"] - cut
        assert res["type"] == "CollectiveTimeoutError" and res["backend_error"], report
        assert TIMEOUT_S - EARLY_S <= took <= TIMEOUT_S + RAISE_SLACK_S, f"rank {r} raised at +{took:.1f} s\n{report}"
        assert 1 - r in res["ranks"], f"rank {r} did not name the lost rank\n{report}"
        assert res["again"] == "CollectiveTimeoutError" and res["again_s"] < AGAIN_WITHIN_S, report


# ---- in process --------------------------------------------------------------------------------------------

def test_env_rendezvous_falls_back_to_mpi_only_inside_an_mpi_job(monkeypatch):
    from commlib.torch.distributed import rendezvous

    seen = []
    handler = rendezvous.wrap(lambda url, timeout=None, **kw: seen.append(url) or iter([("store", 0, 1)]))
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PMI_RANK", "PMI_FD", "PMI_PORT", "PMIX_RANK",
                 "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(name, raising=False)
    handler("env://")                                        # no MPI launcher: torch's own (which raises there)
    assert seen == ["env://"]
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "x"), ("MASTER_PORT", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PMI_RANK", "0")
    handler("env://")                                        # torchrun's variables are all set: torch's own
    assert seen == ["env://", "env://"]
    monkeypatch.delenv("MASTER_ADDR")
    assert handler("env://") is not None and len(seen) == 2  # inside mpiexec without them: commlib's (lazy)


def test_options_and_compression_variable():
    from commlib.compression import Compression
    from commlib.config import Config, mpi_launched
    from commlib.errors import ConfigError
    from commlib.torch.distributed import Options

    assert Options(compression="FP16").compression is Compression.fp16
    assert Options(algorithm="Ring").algorithm == "ring"
    topk = Compression.topk(0.01)
    assert Options(compression=topk).compression is topk
    for bad in (dict(compression="lz4"), dict(algorithm="fastest"), dict(settings=[1])):
        with pytest.raises(ConfigError):
            Options(**bad)
    assert Config.load({"COMMLIB_TORCH_COMPRESSION": "bf16"}).torch_compression == "bf16"
    with pytest.raises(ConfigError, match="COMMLIB_TORCH_COMPRESSION"):
        Config.load({"COMMLIB_TORCH_COMPRESSION": "int8"})
    assert mpi_launched({"PMI_RANK": "3"}) and mpi_launched({"OMPI_COMM_WORLD_RANK": "0"})
    assert not mpi_launched({"RANK": "0", "SLURM_PROCID": "0"})


def test_torch_knows_the_backend_by_name():
    """The entry point: a fresh interpreter that imports only torch knows "commlib"."""
    code = "import torch.distributed as dist; print(dist.Backend.COMMLIB, 'commlib' in dist.Backend.backend_list)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=job_env())
    assert done.stdout.split() == ["commlib", "True"], done.stdout + done.stderr


def test_import_torch_survives_a_commlib_that_cannot_load(tmp_path):
    """The entry point never breaks ``import torch``: where commlib cannot be imported (here a ``commlib``
    first on the path that raises, as a missing dependency or MPI library would), torch still imports, and
    the warning says why the backend's name is missing."""
    broken = tmp_path / "commlib"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('no MPI library in this environment')\n")
    env = job_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    code = "import torch.distributed as dist; print('imported', 'commlib' in dist.Backend.backend_list)"
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.split() == ["imported", "False"], done.stdout + done.stderr
    assert "commlib could not register its torch.distributed backend" in done.stderr, done.stderr
    assert "no MPI library in this environment" in done.stderr, done.stderr
