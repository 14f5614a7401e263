"""commlib-run inside a Slurm allocation, without Slurm: the hostlist and per-node count notations, the
allocation read from SLURM_* variables, the command lines through srun for both MPIs (golden), the errors,
and the relay that keeps a lost proxy's connection to mpiexec open (real sockets). tests/run/test_slurm_jobs.py
runs the same on a real Slurm cluster."""

import socket
import subprocess
import sys

import pytest

from commlib.run import launch, mpi, relay
from commlib.run import slurm as S
from commlib.run.hosts import Host
from commlib.run.options import UsageError, parse
from commlib.run.output import SCRIPT

#: how each rank is started: through the labeller (commlib/run/output.py), by the launch's Python
LABELLED = ["python", "-I", SCRIPT]


@pytest.mark.parametrize("text, hosts", [
    ("node1", ["node1"]),
    ("node[1-3,5]", ["node1", "node2", "node3", "node5"]),
    ("a[8-10]", ["a8", "a9", "a10"]),                       # no padding: as `scontrol show hostnames`
    ("a[08-10]", ["a08", "a09", "a10"]),                    # padding kept
    ("a[009-011],b", ["a009", "a010", "a011", "b"]),
    ("a[1,03-04]", ["a1", "a03", "a04"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),    # several brackets: a product
    ("gpu[01-02],cpu-[7],login", ["gpu01", "gpu02", "cpu-7", "login"]),
    ("cmlc30e2e4-h[0-1]", ["cmlc30e2e4-h0", "cmlc30e2e4-h1"]),
])
def test_hostlist(text, hosts):
    assert S.parse_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["node[1-3", "node1-3]", "node[3-1]", "node[a-b]", "node[1-2]x]"])
def test_bad_hostlist_is_an_error(text):
    with pytest.raises(ValueError, match="hostlist"):
        S.parse_hostlist(text)


def test_counts():
    assert S.parse_counts("2(x3),1") == [2, 2, 2, 1]
    assert S.parse_counts("4") == [4]
    assert S.parse_counts("1(x2)") == [1, 1]
    with pytest.raises(ValueError):
        S.parse_counts("2(3)")


def _env(**extra):
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2],m7", "SLURM_TASKS_PER_NODE": "2(x2),1",
           "SLURM_JOB_CPUS_PER_NODE": "8(x2),4"}
    env.update(extra)
    return env


def test_allocation_from_the_environment():
    assert S.allocation({}) is None
    assert S.allocation({"SLURM_JOB_ID": "42"}) is None  # no node list: not an allocation
    alloc = S.allocation(_env(SLURM_CPUS_PER_TASK="4"))
    assert alloc.nodes == ("n1", "n2", "m7") and alloc.tasks_per_node == (2, 2, 1)
    assert alloc.cpus_per_node == (8, 8, 4) and alloc.cpus_per_task == 4 and alloc.tasks == 5
    assert alloc.hosts == [Host("n1", 2), Host("n2", 2), Host("m7", 1)]
    # older names, and no task counts (one task per node, as Slurm's default)
    alloc = S.allocation({"SLURM_JOBID": "7", "SLURM_NODELIST": "x[1-3]"})
    assert alloc.hosts == [Host("x1", 1), Host("x2", 1), Host("x3", 1)]


@pytest.mark.parametrize("extra, needle", [
    ({"SLURM_TASKS_PER_NODE": "2(x2)"}, "SLURM_TASKS_PER_NODE=2(x2) gives 2 node"),
    ({"SLURM_JOB_NODELIST": "n[1-"}, "SLURM_JOB_NODELIST"),
    ({"SLURM_CPUS_PER_TASK": "many"}, "SLURM_CPUS_PER_TASK"),
    ({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "3"}, "Call commlib-run once"),
])
def test_malformed_allocation_is_named(extra, needle):
    with pytest.raises(UsageError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        S.allocation(_env(**extra))


def test_placement_and_too_many_ranks():
    alloc = S.allocation(_env())
    assert S.placement(alloc, None) == ([Host("n1", 2), Host("n2", 2), Host("m7", 1)], 5)
    assert S.placement(alloc, 3) == ([Host("n1", 2), Host("n2", 1)], 3)
    with pytest.raises(UsageError, match=r"-np 6 is more than the 5 task\(s\) of Slurm job 42 "
                                         r"\(n1:2, n2:2, m7:1\): ask Slurm for more"):
        S.placement(alloc, 6)


def _launch(flavor, hosts, np):
    return mpi.Launch(flavor=flavor, mpiexec="mpiexec", np=np, command=["python", "train.py"], hosts=hosts,
                      settings={"COMMLIB_CYCLE_TIME": "2"}, forward=["PATH"], python="python")


def test_hydra_through_slurm(tmp_path):
    alloc = S.allocation(_env(SLURM_CPUS_PER_TASK="4"))
    hosts, np = S.placement(alloc, 4)
    env, argv = S.through_slurm(mpi.MPICH, *mpi.command_line(_launch(mpi.MPICH, hosts, np)), alloc, hosts)
    assert env == {"HYDRA_LAUNCHER_EXTRA_ARGS": "--cpus-per-task=8"}
    assert argv == ["mpiexec", "-launcher", "slurm", "-hosts", "n1:2,n2:2",
                    "-genv", "COMMLIB_CYCLE_TIME", "2", "-genv", "OMP_NUM_THREADS", "4", "-n", "4",
                    *LABELLED, "--", "python", "train.py"]
    # elastic: the step outlives a lost node, and srun runs under the relay
    env, argv = S.through_slurm(mpi.MPICH, *mpi.command_line(_launch(mpi.MPICH, alloc.hosts, 5)), alloc,
                                alloc.hosts, elastic=True, relay_dir=str(tmp_path))
    assert env == {"HYDRA_LAUNCHER_EXTRA_ARGS": "--cpus-per-task=4 --no-kill --kill-on-bad-exit=0"}
    assert argv[:5] == ["mpiexec", "-launcher", "slurm", "-launcher-exec", str(tmp_path / "srun-relay")]
    script = (tmp_path / "srun-relay").read_text()
    assert f"-m commlib.run.relay --closed-dir {tmp_path} " in script and script.rstrip().endswith('"$@"')


def test_open_mpi_through_slurm():
    alloc = S.allocation(_env())
    env, argv = S.through_slurm(mpi.OPEN_MPI, *mpi.command_line(_launch(mpi.OPEN_MPI, alloc.hosts, 5)), alloc,
                                alloc.hosts)
    assert env == {}
    assert argv == ["mpiexec", "-np", "5", "-mca", "plm", "slurm", "-mca", "plm_slurm_args",
                    "--cpus-per-task=4", "-H", "n1:2,n2:2,m7:1", "-bind-to", "none", "-map-by", "slot",
                    "-mca", "pml", "ob1", "-mca", "btl", "^openib", "-x", "COMMLIB_CYCLE_TIME=2", "-x", "PATH",
                    *LABELLED, "--read-size", "4096", "--", "python", "train.py"]


def test_commlib_run_takes_the_allocation(monkeypatch):
    """``commlib-run python train.py`` in an allocation: no -np, no hosts; -H still means ssh."""
    for name, value in _env().items():
        monkeypatch.setenv(name, value)
    env, argv = launch.build(parse(["python", "train.py"]), {})
    assert argv[1:3] == ["-launcher", "slurm"] and argv[argv.index("-hosts") + 1] == "n1:2,n2:2,m7:1"
    assert argv[argv.index("-n") + 1] == "5" and env["HYDRA_LAUNCHER_EXTRA_ARGS"] == "--cpus-per-task=4"
    env, argv = launch.build(parse(["-np", "2", "-H", "a:2", "python", "train.py"]), {})
    assert "-launcher" not in argv and argv[argv.index("-hosts") + 1] == "a:2"
    with pytest.raises(UsageError, match="-np 9 is more than the 5 task"):
        launch.build(parse(["-np", "9", "python", "train.py"]), {})
    with pytest.raises(UsageError, match="--ssh-port does not apply inside a Slurm allocation"):
        launch.build(parse(["-p", "2222", "python", "train.py"]), {})


def test_commlib_run_too_many_ranks_exit_code(monkeypatch, capsys):
    for name, value in _env().items():
        monkeypatch.setenv(name, value)
    assert launch.main(["-np", "6", "python", "train.py"]) == 2
    assert "ask Slurm for more" in capsys.readouterr().err


# ---- the relay ------------------------------------------------------------------------------------------

def test_control_port_found_and_rewritten():
    argv = ["--nodelist", "a,b", "proxy", "--control-port", "10.0.0.1:4000", "--proxy-id", "-1"]
    assert relay.control_port(argv) == ("10.0.0.1", 4000)
    assert relay.rewrite(argv, ("10.0.0.1", 4000), 5001)[4] == "10.0.0.1:5001"
    shell = ["b", "/p/hydra_pmi_proxy --control-port h0:4000 --rmk user"]  # ssh's one-string form
    assert relay.control_port(shell) == ("h0", 4000)
    assert relay.rewrite(shell, ("h0", 4000), 7)[1] == "/p/hydra_pmi_proxy --control-port h0:7 --rmk user"
    assert relay.control_port(["hostname"]) is None


def test_relay_keeps_mpiexecs_side_open_when_a_proxy_dies(tmp_path):
    """A stand-in mpiexec listens; the relay runs a launcher that starts two proxies, which connect, say
    their name, read a reply and exit (A at once, B after 1 s). mpiexec's side of each connection stays
    open and silent (no EOF) after its proxy is gone, and the relay marks the proxy's address as ended
    (``--closed-dir``); once mpiexec closes them, the relay ends with the launcher's exit status."""
    from commlib.run import survivors

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    proxy = ("import socket, sys, time\n"
             "host, port = sys.argv[sys.argv.index('--control-port') + 1].rsplit(':', 1)\n"
             "s = socket.create_connection((host, int(port)))\n"
             "s.sendall(sys.argv[-1].encode()); assert s.recv(5) == b'reply'\n"
             "time.sleep(float(sys.argv[-2]))\n")
    launcher = tmp_path / "launcher.sh"
    launcher.write_text(f'#!/bin/sh\n{sys.executable} -c "$PROXY" "$@" 0 A &\n'
                        f'{sys.executable} -c "$PROXY" "$@" 1 B &\nwait\nexit 3\n')
    launcher.chmod(0o755)
    marks = tmp_path / "marks"
    marks.mkdir()
    job = subprocess.Popen([sys.executable, "-m", "commlib.run.relay", "--closed-dir", str(marks),
                            str(launcher), "--control-port",
                            f"127.0.0.1:{port}"], env={"PROXY": proxy, "PATH": "/usr/bin:/bin"})
    conns = {}
    try:
        server.settimeout(30)
        for _ in range(2):
            conn, _ = server.accept()
            conns[conn.recv(1)] = conn
        assert set(conns) == {b"A", b"B"}
        for conn in conns.values():
            conn.sendall(b"reply")
        for conn in conns.values():
            conn.settimeout(2.5)
            with pytest.raises(socket.timeout):  # the proxy exited: silence, never EOF
                conn.recv(1)
        assert job.poll() is None  # mpiexec still holds the connections
        assert survivors.closed_proxies(str(marks)) == {"127.0.0.1"}
    finally:
        for conn in conns.values():
            conn.close()
        server.close()
        try:
            code = job.wait(timeout=10)
        finally:
            if job.poll() is None:
                job.kill()
    assert code == 3


def test_node_addresses_from_scontrol():
    """``scontrol -o show node``'s one line per node: NodeAddr where given (the relay's marks are addresses),
    the name where not."""
    text = ("NodeName=h0 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.200.3.1 NodeHostName=h0 State=IDLE\n"
            "NodeName=h1 Arch=x86_64 NodeAddr= State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@now]\n"
            "\n")
    assert S.parse_node_addresses(text) == {"h0": "10.200.3.1", "h1": "h1"}
