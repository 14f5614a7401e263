"""One configuration path (commlib/config.py) for init(), commlib-run and its elastic driver: a value that
works for one works for all (``COMMLIB_TIMEOUT=10m`` is 600 s everywhere), an invalid one is the same
error everywhere, before anything starts; the flags write their settings through the configuration."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from mpirun import REPO, run_mpi

from commlib.config import Config, environment, for_job, is_set
from commlib.errors import ConfigError
from commlib.run import elastic as driver
from commlib.run.hosts import Host
from commlib.run.options import UsageError, parse, settings

REPORT = str(REPO / "tests" / "run" / "workers" / "report_timeout.py")


def _commlib_run(*argv, env=None, timeout=180):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("COMMLIB_", "HOROVOD_"))}
    environ.update(PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "commlib.run", *argv], capture_output=True, text=True,
                          timeout=timeout, env=environ, cwd=REPO)


def _timeouts(text: str) -> dict[int, tuple[float, str]]:
    return {int(r): (float(s), given) for r, s, given in re.findall(r"TIMEOUT (\d+) ([\d.]+) (\d*[smh]?)", text)}


# ---- COMMLIB_TIMEOUT=10m, everywhere ---------------------------------------------------------------------

@pytest.mark.mpi
def test_timeout_with_a_unit_works_for_init():
    out = run_mpi(2, REPORT, env={"COMMLIB_TIMEOUT": "10m"})
    assert _timeouts(out) == {0: (600.0, "10m"), 1: (600.0, "10m")}, out[-2000:]


@pytest.mark.mpi
def test_timeout_with_a_unit_works_for_commlib_run():
    done = _commlib_run("-np", "2", sys.executable, REPORT, env={"COMMLIB_TIMEOUT": "10m"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert _timeouts(done.stdout) == {0: (600.0, "10m"), 1: (600.0, "10m")}, done.stdout[-2000:]


@pytest.mark.mpi
def test_timeout_with_a_unit_works_for_commlib_run_elastic():
    """The elastic driver used to read COMMLIB_TIMEOUT with float(): 10m stopped it with a ValueError. Now
    it starts, waits 600 s for a lost rank (it says so), and the workers get 10m as given."""
    done = _commlib_run("--min-np", "2", "--max-np", "2", sys.executable, REPORT, env={"COMMLIB_TIMEOUT": "10m"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "elastic: a lost rank is noticed within 600 s (COMMLIB_TIMEOUT)" in done.stderr, done.stderr[-3000:]
    assert _timeouts(done.stdout) == {0: (600.0, "10m"), 1: (600.0, "10m")}, done.stdout[-2000:]
    assert "elastic: job finished" in done.stderr


def _driver_job(tmp_path, monkeypatch, variables):
    """The elastic driver itself, on a launcher whose 'job' is one process that prints the COMMLIB_*
    variables it was given: (the timeout the driver waits, what the job saw)."""
    for name in [k for k in os.environ if k.startswith(("COMMLIB_", "HOROVOD_"))]:
        monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    seen = tmp_path / "seen.txt"

    def command(hosts, np, given):
        program = ("import os, sys; open(sys.argv[1], 'w').write(' '.join(f'{k}={v}' for k, v in "
                   "sorted(os.environ.items()) if k.startswith('COMMLIB_')))")
        return dict(given), [sys.executable, "-c", program, str(seen)]

    opts = driver.ElasticOptions(min_np=1, max_np=1, discovery_script=None, slots_per_host=None,
                                 elastic_timeout=5.0, reset_limit=0, cooldown=None)
    launcher = driver.Launcher(command=command, kill=lambda job: job.kill(), static_hosts=[Host("localhost", 1)])
    job = driver.Driver(opts, launcher, {}, out=open(os.devnull, "w"))
    assert job.run() == 0
    return job.peer_timeout, dict(item.split("=", 1) for item in seen.read_text().split())


def test_the_elastic_driver_reads_the_timeout_through_the_configuration(tmp_path, monkeypatch):
    timeout, seen = _driver_job(tmp_path, monkeypatch, {"COMMLIB_TIMEOUT": "10m"})
    assert timeout == 600.0 and seen["COMMLIB_TIMEOUT"] == "10m", seen
    assert seen["COMMLIB_ELASTIC_DIR"]
    timeout, seen = _driver_job(tmp_path, monkeypatch, {})  # none set: the elastic default, 10 s
    assert timeout == driver.ELASTIC_TIMEOUT_S == 10.0 and seen["COMMLIB_TIMEOUT"] == "10", seen


# ---- an invalid value: one error, everywhere -------------------------------------------------------------

BAD = [({"COMMLIB_TIMEOUT": "soon"}, "COMMLIB_TIMEOUT='soon' is invalid"),
       ({"HOROVOD_FUSION_THRESHOLD": "much"}, "HOROVOD_FUSION_THRESHOLD='much' is invalid"),
       ({"COMMLIB_FUSION_TRESHOLD": "1M"}, "unknown environment variable(s) COMMLIB_FUSION_TRESHOLD")]


@pytest.mark.parametrize("env, needle", BAD)
def test_an_invalid_value_is_one_error_for_init_and_the_launcher(env, needle):
    with pytest.raises(ConfigError) as error:
        Config.load(env)  # what init() raises on every rank
    message = str(error.value)
    assert needle in message
    for argv in (["-np", "2"], ["--min-np", "1", "--max-np", "2"]):  # fixed-size and elastic
        done = _commlib_run(*argv, sys.executable, "-c", "print('ran')", env=env)
        assert done.returncode == 2 and f"commlib-run: error: {message}" in done.stderr, done.stderr[-2000:]
        assert "ran" not in done.stdout and "mpiexec" not in done.stderr  # stopped before anything started


@pytest.mark.mpi
def test_init_raises_the_same_error():
    out = run_mpi(1, REPORT, env={"COMMLIB_TIMEOUT": "soon"}, expect_fail=True)
    assert "COMMLIB_TIMEOUT='soon' is invalid" in out, out[-2000:]


# ---- the flags write their settings through the configuration ---------------------------------------------

def test_a_flag_value_the_setting_refuses_names_the_flag_and_the_variable():
    with pytest.raises(UsageError, match=r"--cache-capacity: COMMLIB_CACHE_CAPACITY='0' is invalid"):
        settings(parse(["-np", "2", "--cache-capacity", "0", "x"]))
    with pytest.raises(UsageError, match=r"--cycle-time-ms: COMMLIB_CYCLE_TIME='-1' is invalid"):
        settings(parse(["-np", "2", "--cycle-time-ms", "-1", "x"]))
    with pytest.raises(UsageError, match=r"--num-nccl-streams: COMMLIB_NUM_STREAMS='0' is invalid"):
        settings(parse(["-np", "2", "--num-nccl-streams", "0", "x"]))


def test_settings_round_trip_through_their_parsers():
    variables = environment(timeout_s=600.0, cycle_time_ms=2.5, cma=False, torus_shape=(2, 3), algorithm="ring",
                            fusion_threshold_bytes=1 << 20, timeline=None)
    assert variables == {"COMMLIB_TIMEOUT": "600", "COMMLIB_CYCLE_TIME": "2.5", "COMMLIB_CMA": "0",
                         "COMMLIB_TORUS_SHAPE": "2x3", "COMMLIB_ALGORITHM": "ring",
                         "COMMLIB_FUSION_THRESHOLD": "1048576", "COMMLIB_TIMELINE": ""}
    loaded = Config.load(variables)
    assert (loaded.timeout_s, loaded.cycle_time_ms, loaded.cma, loaded.torus_shape, loaded.timeline) == \
        (600.0, 2.5, False, (2, 3), None)
    with pytest.raises(ConfigError, match="unknown setting"):
        environment(timeout=3)


def test_for_job_and_is_set_see_the_environment_and_the_launchers_variables(monkeypatch):
    monkeypatch.delenv("COMMLIB_TIMEOUT", raising=False)
    monkeypatch.setenv("HOROVOD_HIERARCHICAL_ALLREDUCE", "0")
    assert not is_set("timeout_s") and is_set("timeout_s", {"COMMLIB_TIMEOUT": "1h"})
    assert for_job({"COMMLIB_TIMEOUT": "1h"}).timeout_s == 3600.0
    assert not is_set("algorithm")  # Horovod's switch at 0 asks for nothing
    monkeypatch.setenv("HOROVOD_HIERARCHICAL_ALLREDUCE", "1")
    assert is_set("algorithm") and for_job().algorithm == "hierarchical"


def test_launcher_durations_take_units():
    args = parse(["--min-np", "1", "--elastic-timeout", "10m", "--timeout", "1h", "--start-timeout", "90s", "x"])
    assert (driver.options(args).elastic_timeout, args.timeout, args.start_timeout) == (600.0, 3600.0, 90.0)
