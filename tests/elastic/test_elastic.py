"""Elastic training (commlib/elastic, commlib.torch.elastic, commlib-run's driver in commlib/run/elastic.py):
the state's commit/restore/snapshot and the driver's pieces without MPI, then real elastic jobs on a 3-host
emulated cluster: a worker killed with SIGKILL mid-epoch, a host added back through the discovery script,
and too few hosts for --min-np."""

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mpirun import REPO, require_marker, worker_path

from commlib.elastic import HostsUpdatedInterrupt, ObjectState, control
from commlib.run import elastic as driver
from commlib.run.hosts import Host
from commlib.run.options import UsageError, parse

WORKER = str(worker_path("elastic_train.py"))
PEER_TIMEOUT_S = 3  # COMMLIB_TIMEOUT of the elastic jobs: how long a lost rank takes to be noticed


# ---- without MPI ----------------------------------------------------------------------------------------

def _state(**kwargs):
    return ObjectState(bcast_object=lambda obj, root_rank=0: obj, get_rank=lambda: 0, **kwargs)


def test_object_state_commit_restore_and_the_driver_snapshot(tmp_path, monkeypatch):
    monkeypatch.delenv("COMMLIB_ELASTIC_DIR", raising=False)
    state = _state(epoch=1, seen=[1])
    state.epoch, state.seen = 2, [1, 2]
    state.restore()
    assert (state.epoch, state.seen) == (1, [1])
    state.seen.append(5)  # a deep copy was saved: the live list changes alone
    state.restore()
    assert state.seen == [1]
    state.epoch = 3
    state.commit()  # no driver: nothing written, no host check
    state.epoch = 4
    state.restore()
    assert state.epoch == 3 and not state.resume()

    monkeypatch.setenv("COMMLIB_ELASTIC_DIR", str(tmp_path))
    state.epoch = 7
    state.commit()
    assert pickle.loads((tmp_path / control.SNAPSHOT).read_bytes()) == {"epoch": 7, "seen": [1]}
    fresh = _state(epoch=0, seen=[])
    assert fresh.resume() and (fresh.epoch, fresh.seen) == (7, [1])
    control.flag_hosts_updated(str(tmp_path), "a,b")
    with pytest.raises(HostsUpdatedInterrupt):
        state.commit()
    control.clear_hosts_updated(str(tmp_path))
    state.commit()


def test_discovery_blacklist_and_choice():
    assert driver.parse_discovered("a:2\n# comment\nb\n\nc:0\n", slots_per_host=3) == [Host("a", 2), Host("b", 3)]
    with pytest.raises(UsageError, match="host or host:slots"):
        driver.parse_discovered("a b\n", None)
    assert driver.choose([Host("a", 2), Host("b", 2)], 3) == ([Host("a", 2), Host("b", 1)], 3)
    assert driver.choose([Host("a", 2), Host("b", 2)], None) == ([Host("a", 2), Host("b", 2)], 4)
    forever = driver.Blacklist(None)
    forever.add("a", 10.0)
    assert not forever.allows("a", 1e9) and forever.allows("b", 10.0)
    cooling = driver.Blacklist((5, 5))
    cooling.add("a", 10.0)
    assert not cooling.allows("a", 14.0) and cooling.allows("a", 15.0) and cooling.listed(14.0) == ["a"]


@pytest.mark.parametrize("gone", [True, False])
def test_a_launch_whose_workers_are_all_gone_is_ended(tmp_path, gone):
    """Every worker of an in-process launch ended without finishing (each lost or crashed) while mpiexec waits
    on (here a process that never ends by itself): the driver ends the launch and reports it failed, instead
    of waiting for reports nobody is left to write. While a worker is left, it waits as before."""
    import io
    import threading

    opts = driver.ElasticOptions(min_np=1, max_np=None, discovery_script=None, slots_per_host=None,
                                 elastic_timeout=10, reset_limit=0, cooldown=None)
    killed = []

    def kill(job):  # as the launchers' kill: the whole process group, gone or not
        killed.append(time.monotonic() - start)
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    launcher = driver.Launcher(command=None, kill=kill, static_hosts=[], in_process=True,
                               workers_gone=lambda: gone)
    out = io.StringIO()
    job_driver = driver.Driver(opts, launcher, {}, out=out)
    job_driver.peer_timeout = 1.0
    argv = [sys.executable, "-c", "import time; time.sleep(30)"]
    start = time.monotonic()
    if not gone:  # nothing would end it: stop the job from outside after a while, as its own end would
        threading.Timer(8.0, lambda: [os.killpg(pid, signal.SIGTERM) for pid in _group_leaders(argv)]).start()
    code, _ = job_driver._run_job({}, argv, [Host("localhost", 1)], str(tmp_path))
    took = time.monotonic() - start
    assert code != 0
    if gone:
        assert killed and killed[0] < 25, (killed, took)  # the grace for mpiexec to end by itself, then ended
        assert "every worker of this launch ended without finishing" in out.getvalue()
    else:
        assert took >= 8 and (not killed or killed[0] >= 8), (killed, took)  # ended from outside, not by the driver
        assert "every worker of this launch ended" not in out.getvalue()


def _group_leaders(argv) -> list[int]:
    """The process-group leaders running ``argv`` (the driver starts each job with setsid)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes().split(b"\0")[:len(argv)] == [a.encode() for a in argv]:
                pid = int(cmdline.parent.name)
                if os.getpgid(pid) == pid:
                    pids.append(pid)
        except (OSError, ValueError):
            continue
    return pids


@pytest.mark.parametrize("argv, needle", [
    (["-np", "2", "--reset-limit", "3", "x"], "applies to elastic jobs"),
    (["--min-np", "3", "--max-np", "2", "x"], "min-np <= max-np"),
    (["--min-np", "1", "--blacklist-cooldown-range", "9", "3", "x"], "low <= high"),
])
def test_bad_elastic_flags(argv, needle):
    with pytest.raises(UsageError, match=needle):
        driver.options(parse(argv))


def test_too_few_slots_fail_at_the_elastic_timeout(tmp_path):
    """--min-np more than the discovered slots: the driver waits, then fails naming what it found."""
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:1\n")
    script.chmod(0o755)
    done = subprocess.run([sys.executable, "-m", "commlib.run", "--min-np", "2", "--host-discovery-script",
                           str(script), "--elastic-timeout", "2", sys.executable, "-c", "pass"],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 2, done.stderr
    assert "waiting for --min-np 2 slots (have 1)" in done.stderr
    assert "only 1 slot(s) available (hosts: localhost:1" in done.stderr and "--elastic-timeout 2" in done.stderr


# ---- on emulated hosts ----------------------------------------------------------------------------------

def _remove_shared_memory_left(logdir: Path) -> None:
    """The MPICH shared-memory files the workers mapped (they listed them) that a killed job left behind
    and no live process maps any more."""
    listed = {p for f in logdir.glob("shm.*.txt") for p in f.read_text().split() if p.startswith("/dev/shm/")}
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            mapped |= {line.split()[-1] for line in maps.read_text().splitlines() if "/dev/shm/" in line}
        except OSError:
            continue
    for path in listed - mapped:
        Path(path).unlink(missing_ok=True)


def _elastic_run(argv, env, timeout=400):
    require_marker("cluster")
    return subprocess.run([sys.executable, "-m", "commlib.run", *argv], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONPATH=str(REPO), **env), cwd=REPO)


def _replay(logdir: Path):
    """Read the workers' logs; return the launches (in order) and, per step, the index lists of the launch
    that ran it last (a step a failed launch logged and the next one ran again counts once)."""
    launches, steps = {}, {}
    for path in sorted(logdir.glob("*.log")):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        head = lines[0]
        launches.setdefault(head["launch"], {"size": head["size"], "start_step": head["start_step"],
                                             "start": head["time"], "first_step_time": None})
        for entry in lines[1:]:
            launch = launches[head["launch"]]
            if "done" in entry:  # when the launch's first step completed
                if launch["first_step_time"] is None or entry["time"] < launch["first_step_time"]:
                    launch["first_step_time"] = entry["time"]
                continue
            steps.setdefault(entry["step"], {}).setdefault(head["launch"], {})[head["rank"]] = (entry["epoch"],
                                                                                                  entry["indices"])
    final = {}
    for step, by_launch in steps.items():
        last = max(by_launch)
        final[step] = by_launch[last]
    order = sorted(launches, key=float)
    return [launches[k] for k in order], dict(sorted(final.items()))


def _reference(final_steps):
    """The same SGD as the worker, on the same samples per step, in one process (float64): each rank's mean
    gradient, averaged over the ranks (what DistributedOptimizer does)."""
    import torch

    generator = torch.Generator().manual_seed(7)
    features = torch.randn(144, 4, generator=generator)
    targets = features @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.25
    x_all, y_all = features.double().numpy(), targets.double().numpy()
    w, b = np.zeros(4), 0.0
    for ranks in final_steps.values():
        gw, gb = np.zeros(4), 0.0
        for _, indices in ranks.values():
            x, y = x_all[indices], y_all[indices]
            r = x @ w + b - y
            gw += 2 * x.T @ r / len(indices)
            gb += 2 * r.mean()
        w, b = w - 0.05 * gw / len(ranks), b - 0.05 * gb / len(ranks)
    return w, b


def _check_training(logdir: Path, final_steps):
    # every epoch saw every sample (the sampler pads to a multiple of the ranks: a few twice at most)
    for epoch in (0, 1):
        seen = [i for ranks in final_steps.values() for e, indices in ranks.values() if e == epoch for i in indices]
        assert set(seen) == set(range(144)) and len(seen) - 144 <= 3 * 4, (epoch, len(seen))
    assert list(final_steps) == list(range(len(final_steps)))  # no step lost or run twice
    final = json.loads((logdir / "final.json").read_text())
    w, b = _reference(final_steps)
    assert np.allclose(final["weight"], w, atol=1e-4) and abs(final["bias"] - b) < 1e-4, (final, w, b)
    return final


def _needs_cluster(make_cluster):
    from commlib.testing import netns

    require_marker("cluster")

    missing = netns.missing_prerequisites(shaped=False)
    if missing:
        pytest.skip("emulated cluster impossible here: missing " + "; ".join(missing))


@pytest.mark.cluster
def test_worker_killed_mid_epoch_training_goes_on(make_cluster, tmp_path):
    """3 hosts x 1 rank; rank 1 kills itself with SIGKILL at step 10 of 24 in epoch 0. The other two fail
    their next collective within COMMLIB_TIMEOUT, report to the driver, and go on in process over
    themselves (no restart: the job is started once) from the last commit; training ends with every sample
    of both epochs processed once and the model of a run over those same samples."""
    _needs_cluster(make_cluster)
    try:
        done = _elastic_run(["--emulate", "3x1", "--min-np", "2", "--max-np", "3", sys.executable, WORKER,
                             str(tmp_path)], {"ELASTIC_KILL_AT": "10", "COMMLIB_TIMEOUT": str(PEER_TIMEOUT_S)})
    finally:
        _remove_shared_memory_left(tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "blacklisted for good" in done.stderr and "2 rank(s) go on in process" in done.stderr, done.stderr[-3000:]
    assert done.stderr.count("starting ") == 1, done.stderr[-3000:]  # no restart
    launches, final_steps = _replay(tmp_path)
    assert [(l["size"], l["start_step"]) for l in launches] == [(3, 0), (2, 10)], launches
    final = _check_training(tmp_path, final_steps)
    assert final["size"] == 2
    killed = float((tmp_path / "killed").read_text())
    resumed = launches[1]["first_step_time"] - killed
    print(f"resumed training {resumed:.1f} s after the kill")
    (tmp_path.parent / "elastic_resume_seconds").write_text(f"{resumed:.2f}\n")


@pytest.mark.slow
@pytest.mark.cluster
def test_host_link_down_the_others_go_on(make_cluster, tmp_path):
    """3 hosts x 1 rank; at step 8 the last host's link goes down (its rank is alive but cut off). Both
    sides time out and report; the driver keeps the side that suspects the other less (the two connected
    ranks, which both blame the cut one), and those go on in process; the cut rank is told it was left
    out and ends. The driver ends mpiexec, which waits for the cut host's proxy, once the survivors end."""
    _needs_cluster(make_cluster)
    env = dict(os.environ, PYTHONPATH=str(REPO), ELASTIC_CUT_AT="8", COMMLIB_TIMEOUT=str(PEER_TIMEOUT_S))
    job = subprocess.Popen([sys.executable, "-m", "commlib.run", "--emulate", "3x1", "--min-np", "2", "--max-np",
                            "3", sys.executable, WORKER, str(tmp_path)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, start_new_session=True)
    try:
        name = None
        for line in job.stderr:  # "commlib-run: emulated cluster NAME: ..."
            if "emulated cluster" in line:
                name = line.split("emulated cluster", 1)[1].split(":", 1)[0].strip()
                break
        assert name, "commlib-run did not name its cluster"
        end = time.monotonic() + 300
        while not (tmp_path / "cut_please").exists():
            assert job.poll() is None and time.monotonic() < end, "the job ended before step 8"
            time.sleep(0.05)
        subprocess.run(["ip", "link", "set", f"{name}-h2", "down"], check=True)
        (tmp_path / "cut").write_text(f"{time.time()}\n")
        stdout, rest = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGTERM)
            job.communicate(timeout=60)
        _remove_shared_memory_left(tmp_path)
    assert job.returncode == 0, rest[-4000:]
    assert "2 rank(s) go on in process (world ranks [0, 1]; lost [2])" in rest, rest[-3000:]
    launches, final_steps = _replay(tmp_path)
    # the cut rank may have sent its part of step 8 before the cut, and the others completed it
    assert [l["size"] for l in launches] == [3, 2] and launches[1]["start_step"] in (8, 9), launches
    assert _check_training(tmp_path, final_steps)["size"] == 2


@pytest.mark.slow
@pytest.mark.cluster
def test_host_added_by_discovery_size_returns(make_cluster, tmp_path):
    """Discovery lists 2 of 3 hosts; at step 5 the worker makes it list all 3: the driver flags it, every
    rank's next commit raises HostsUpdatedInterrupt, and the job restarts on 3 from that commit."""
    _needs_cluster(make_cluster)
    trigger = tmp_path / "all_hosts"
    script = tmp_path / "discover.sh"
    # the cluster's host names reach the script as COMMLIB_RUN_HOSTS; 2 of them until the worker's trigger
    script.write_text(f'#!/bin/sh\nif [ -e {trigger} ]; then n=3; else n=2; fi\n'
                      'echo "$COMMLIB_RUN_HOSTS" | tr , "\\n" | head -$n\n')
    script.chmod(0o755)
    logdir = tmp_path / "logs"
    logdir.mkdir()
    try:
        done = _elastic_run(["--emulate", "3x1", "--min-np", "2", "--max-np", "3", "--host-discovery-script",
                             str(script), sys.executable, WORKER, str(logdir)],
                            {"ELASTIC_TRIGGER": str(trigger), "ELASTIC_ADD_HOST_AT": "5", "ELASTIC_STEP_SLEEP": "0.3"})
    finally:
        _remove_shared_memory_left(logdir)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    launches, final_steps = _replay(logdir)
    assert [l["size"] for l in launches] == [2, 3], (launches, done.stderr[-3000:])
    assert launches[1]["start_step"] >= 6
    assert "hosts changed" in done.stderr and "the workers asked for a restart" in done.stderr
    _check_training(logdir, final_steps)


@pytest.mark.cluster
def test_numpy_worker_killed_the_others_go_on(make_cluster, tmp_path):
    """The numpy API (commlib.elastic.run, ObjectState, commlib.allreduce) on 3 hosts x 1 rank: rank 1 is
    killed at step 6; the other two go on in process from the last commit. The samples taken, step after
    step, are the shuffled order without a gap or a repeat, and the weights equal SGD replayed over them."""
    _needs_cluster(make_cluster)
    try:
        done = _elastic_run(["--emulate", "3x1", "--min-np", "2", "--max-np", "3", sys.executable,
                             str(worker_path("elastic_numpy.py")), str(tmp_path)],
                            {"ELASTIC_KILL_AT": "6", "COMMLIB_TIMEOUT": str(PEER_TIMEOUT_S)})
    finally:
        _remove_shared_memory_left(tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "2 rank(s) go on in process" in done.stderr and done.stderr.count("starting ") == 1, done.stderr[-3000:]
    launches, final_steps = _replay(tmp_path)
    assert [(l["size"], l["start_step"]) for l in launches] == [(3, 0), (2, 6)], launches
    assert list(final_steps) == list(range(30))
    taken = [i for ranks in final_steps.values() for _, indices in (ranks[r] for r in sorted(ranks)) for i in indices]
    order = np.concatenate([np.random.default_rng(3 + e).permutation(96) for e in range(4)])
    assert taken == order[:len(taken)].tolist()
    rng = np.random.default_rng(7)
    features = rng.standard_normal((96, 4))
    targets = features @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.25
    w = np.zeros(5)
    for ranks in final_steps.values():
        grads = []
        for _, indices in ranks.values():
            x, y = features[indices], targets[indices]
            r = x @ w[:4] + w[4] - y
            grads.append(np.concatenate([2 * x.T @ r / len(indices), [2 * r.mean()]]))
        w = w - 0.05 * np.mean(grads, axis=0)
    final = json.loads((tmp_path / "final.json").read_text())
    assert final["size"] == 2 and np.allclose(final["weights"], w, atol=1e-9), (final, w)


@pytest.mark.cluster
def test_below_min_np_after_a_loss_waits_then_fails(make_cluster, tmp_path):
    """--min-np 3 on 3 hosts x 1 rank, one killed: 2 survivors are too few, so the driver has them exit
    for a restart, blacklists the lost host, waits for a third host up to --elastic-timeout and fails
    naming what it has."""
    _needs_cluster(make_cluster)
    try:
        done = _elastic_run(["--emulate", "3x1", "--min-np", "3", "--elastic-timeout", "2", sys.executable,
                             str(worker_path("elastic_numpy.py")), str(tmp_path)],
                            {"ELASTIC_KILL_AT": "3", "COMMLIB_TIMEOUT": str(PEER_TIMEOUT_S)})
    finally:
        _remove_shared_memory_left(tmp_path)
    assert done.returncode == 2, (done.stdout + done.stderr)[-4000:]
    assert "2 survivor(s) < --min-np 3: restarting the job" in done.stderr, done.stderr[-3000:]
    assert "waiting for --min-np 3 slots (have 2)" in done.stderr
    assert "only 2 slot(s) available" in done.stderr and "blacklisted: " in done.stderr, done.stderr[-3000:]


def test_survivor_decision():
    """The driver's verdict from the reports (commlib/run/survivors.py), without MPI."""
    from commlib.run.survivors import decide

    members = [0, 1, 2]
    # a killed rank never reports: wait for the unsuspected ones, then the settle time
    assert decide(members, {0: [1]}, waited=0.5, settle=4, limit=13) is None   # rank 2 not heard yet
    assert decide(members, {0: [1], 2: [1]}, waited=0.5, settle=4, limit=13) is None
    assert decide(members, {0: [1], 2: [1]}, waited=4.0, settle=4, limit=13) == [0, 2]
    # a suspect that reports leaves all the same (a communicator built with an unreachable rank would hang)
    assert decide(members, {0: [1], 2: [1], 1: [0]}, waited=1.0, settle=4, limit=13) == [0, 2]
    assert decide(members, {0: [1], 2: [], 1: []}, waited=1.0, settle=4, limit=13) == [0, 2]
    assert decide(members, {0: [], 2: [], 1: []}, waited=0.0, settle=4, limit=13) == [0, 1, 2]
    # a cut host blames everyone, everyone blames it: it leaves
    assert decide(members, {0: [2], 1: [2], 2: [0, 1]}, waited=0.1, settle=4, limit=13) == [0, 1]
    # no notices between the workers: in a chain rank 0 ran out of time waiting for rank 1, which waited for
    # the killed rank 2; rank 1's suspicion is explained by the gone rank it waited for, and it stays
    assert decide(members, {0: [1]}, waited=5.0, settle=4, limit=13) is None    # rank 2 unsuspected so far
    assert decide(members, {0: [1], 1: [2]}, waited=0.5, settle=4, limit=13) is None
    assert decide(members, {0: [1], 1: [2]}, waited=4.0, settle=4, limit=13) == [0, 1]
    assert decide(members, {1: [0], 0: [2]}, waited=4.0, settle=4, limit=13) == [0, 1]
    assert decide([0, 1, 2, 3], {0: [1], 1: [2], 2: [3]}, waited=4.0, settle=4, limit=13) == [0, 1, 2]
    # the chain and a cut-off rank 2 that waited for rank 0, before 0's report (0 runs out of time a little
    # later): the same reports. An explanation resting on a missing member waits for it (patience), unless
    # the member is known gone (Ray's actors tell)
    assert decide(members, {0: [1], 1: [2]}, waited=4.0, settle=4, limit=13, patience=5) is None
    assert decide(members, {0: [1], 1: [2]}, waited=4.0, settle=4, limit=13, gone={2}, patience=5) == [0, 1]
    assert decide(members, {0: [1], 1: [2]}, waited=5.0, settle=4, limit=13, patience=5) == [0, 1]
    assert decide(members, {1: [2], 2: [0]}, waited=4.0, settle=4, limit=13, patience=5) is None
    assert decide(members, {1: [2], 2: [0], 0: [2]}, waited=4.5, settle=4, limit=13, patience=5) == [0, 1]
    # a killed rank that both others suspect: nothing rests on it, no patience needed
    assert decide(members, {0: [2], 1: [2]}, waited=4.0, settle=4, limit=13) == [0, 1]
    assert decide(members, {0: [2], 1: [2]}, waited=4.0, settle=4, limit=13, patience=5) == [0, 1]
    # a mutual suspicion is never explained (it may be a cut link between the two)
    assert decide(members, {0: [1, 2], 1: [0, 2]}, waited=4.0, settle=4, limit=13) == [0]
    assert decide([0, 1, 2, 3], {0: [2, 3], 1: [2, 3], 2: [0, 1, 3]}, waited=4.0, settle=4, limit=13) == [0, 1]
    # recursive doubling with rank 2's link cut: 0 waits for 2, 2 for 0, 1 for 0 (behind the broken pair)
    assert decide(members, {0: [2], 1: [0], 2: [0]}, waited=0.1, settle=4, limit=13) == [0, 1]
    assert decide(members, {0: [1], 1: [2], 2: [1]}, waited=0.1, settle=4, limit=13) == [0, 1]
    # a ring waiting on a cut host (0 on 2, 2 on 1, 1 on 0): a cycle explains nothing; the cut one leaves
    assert decide(members, {0: [2], 1: [0], 2: [1]}, waited=0.1, settle=4, limit=13) == [1]
    # a suspect that waited for no fault is not explained: it leaves
    assert decide(members, {0: [1], 1: [0], 2: []}, waited=4.0, settle=4, limit=13) == [0, 2]
    # past the limit: whoever reported
    assert decide(members, {0: [1]}, waited=13.0, settle=4, limit=13) == [0]
    assert decide([0, 2], {0: [], 2: []}, waited=0.0, settle=4, limit=13) == [0, 2]  # a failure, nobody lost



def test_a_proxy_that_ended_tells_the_driver_its_hosts_ranks_are_gone(tmp_path):
    """A chain (0 waited for 1, 1 for the silent 2): the driver waits for rank 2 (it may be cut off and
    report late) until the relay marks h2's proxy ended (commlib.run.relay); then 0 and 1 go on at once.
    The launcher is asked for its hosts' addresses only then, once."""
    import io

    from commlib.run import survivors

    asked = []

    def addresses(names):
        asked.append(list(names))
        return {"h0": "10.0.0.1", "h1": "10.0.0.2", "h2": "10.0.0.3"}

    now = [100.0]
    opts = driver.ElasticOptions(min_np=1, max_np=None, discovery_script=None, slots_per_host=None,
                                 elastic_timeout=10, reset_limit=0, cooldown=None)
    launcher = driver.Launcher(command=None, kill=None, static_hosts=[], in_process=True,
                               proxy_addresses=addresses)
    job_driver = driver.Driver(opts, launcher, {}, out=io.StringIO(), clock=lambda: now[0])
    job_driver.peer_timeout = 10.0
    recovery = driver._Recovery(["h0", "h1", "h2"])
    for rank, suspects in ((0, [1]), (1, [2])):
        (tmp_path / f"report.0.{rank}").write_text(json.dumps({"suspects": suspects}))
    job_driver._recover(recovery, str(tmp_path))
    now[0] += 2.0  # past the settling time, within the patience for a silent rank
    job_driver._recover(recovery, str(tmp_path))
    assert recovery.generation == 0 and not asked
    survivors.mark_proxy_closed(str(tmp_path), "10.0.0.9")  # another launch's host: nobody here
    job_driver._recover(recovery, str(tmp_path))
    assert recovery.generation == 0 and asked == [["h0", "h1", "h2"]]
    survivors.mark_proxy_closed(str(tmp_path), "10.0.0.3")
    job_driver._recover(recovery, str(tmp_path))
    assert recovery.generation == 1 and recovery.members == [0, 1] and recovery.lost == {2}
    assert json.loads((tmp_path / "members.0").read_text()) == {"members": [0, 1]}
    assert len(asked) == 1
    survivors.clear(str(tmp_path))  # the next launch starts without the marks
    assert survivors.closed_proxies(str(tmp_path)) == set()

@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [3])
def test_torch_state_and_sampler_across_ranks(nprocs):
    """TorchState's sync/restore/commit of a model, an optimizer with momentum and attributes;
    ObjectState's sync; ElasticSampler's split without overlap and its split of the rest after a restore
    (tests/elastic/workers/elastic_state.py)."""
    from mpirun import run_mpi

    run_mpi(nprocs, "elastic_state.py", timeout=240)
