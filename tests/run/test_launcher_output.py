"""commlib-run's output (commlib/run/output.py): every rank's lines whole and labelled ``[1,RANK]<stream>:``,
whatever the ranks' buffering; ``--output-filename DIR`` writes DIR/rank.N/{stdout,stderr}.

In process: the labeller's records and the launcher side's joining, on streams cut anywhere. Without MPI:
the labeller as a process (exit status, signals, inherited descriptors, its files). With MPI: 4 ranks that
write 2,000 lines each in three pieces with PYTHONUNBUFFERED=1, through commlib-run on hydra (and on Open
MPI where ``OPEN_MPI_MPIRUN`` names an Open MPI mpirun)."""

from __future__ import annotations

import collections
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest

from mpirun import REPO

from commlib.run import output
from commlib.run.output import SCRIPT, Joiner, Lines

PIECES = str(REPO / "tests" / "run" / "workers" / "print_pieces.py")
LINE = re.compile(r"\[1,(\d+)\]<(stdout|stderr)>:(RUN|ERR|LONG) (\d+) (\d{5})"
                  r"( piece-two piece-three-x*| tail| y{10000})")


# ---- records and joining, in process --------------------------------------------------------------------

def _records(stream: bytes, rank: str, name: str, rng: random.Random) -> list[bytes]:
    """What the labeller writes for ``stream`` fed in random chunks."""
    lines, writes, i = Lines(rank, name), [], 0
    while i < len(stream):
        k = rng.randint(1, 9000)
        writes += lines.feed(stream[i:i + k])
        i += k
    return writes + lines.close()


def _pieces(text: bytes) -> list[bytes]:
    return re.findall(rb"[^\r\n]*(?:\r\n|\n|\r)", text)


@pytest.mark.parametrize("seed", range(3))
def test_records_are_whole_writes_and_join_back_into_the_lines(seed):
    """Random lines (empty, short, just under and over a record, 20 KB; ends \\n, \\r\\n, \\r; a last line
    without its end) fed in random chunks: every write the labeller makes is whole records of at most
    PIPE_BUF bytes; interleaved write by write with another rank's and read back in random chunks, each
    rank's lines come out whole, in order, labelled."""
    rng = random.Random(seed)
    for _ in range(60):
        lines = [bytes(rng.choice(b"abcdefgh ") for _ in range(rng.choice([0, 1, 10, 4070, 4081, 4082, 4096, 20000])))
                 + rng.choice([b"\n", b"\r\n", b"\r", b"\n"]) for _ in range(rng.randint(1, 30))]
        stream = b"".join(lines) + rng.choice([b"", b"no end"])
        mine = _records(stream, "3", "stdout", rng)
        assert all(len(w) <= output.RECORD and w.endswith((b"\n", b"\r")) for w in mine)
        other = _records(b"hello\nworld " * 2000 + b"\n", "12", "stderr", rng)
        merged = []
        while mine or other:
            merged.append((mine if mine and (not other or rng.random() < 0.5) else other).pop(0))
        blob, joiner, out, i = b"".join(merged), Joiner("stdout"), [], 0
        while i < len(blob):
            k = rng.randint(1, 70000)
            out += joiner.feed(blob[i:i + k])
            i += k
        out += joiner.close()
        by_stream = {name: b"".join(t for s, t in out if s == name) for name in ("stdout", "stderr")}
        expect = _pieces(stream if stream.endswith((b"\n", b"\r")) else stream + b"\n")
        assert _pieces(by_stream["stdout"]) == [b"[1,3]<stdout>:" + p for p in expect]
        assert _pieces(by_stream["stderr"]) == [b"[1,12]<stderr>:hello\n"] + \
            [b"[1,12]<stderr>:world hello\n"] * 1999 + [b"[1,12]<stderr>:world \n"]


def test_lines_go_to_the_stream_their_label_names():
    """Open MPI gives a rank's stdout a terminal, so the labeller sends both streams through the stderr
    pipe: the launcher side routes each line by its label; the launcher's own lines stay where they came."""
    text = b"[1,0]<stdout>:out\n[1,0]<stderr>:err\nmpiexec says\n[1,1]<stdout>:more\n"
    assert output.join(text, "stderr") == [("stdout", b"[1,0]<stdout>:out\n"), ("stderr", b"[1,0]<stderr>:err\n"
                                            b"mpiexec says\n"), ("stdout", b"[1,1]<stdout>:more\n")]
    assert output.join(b"[1,0]<stdout>:a\nplain\n") == [("stdout", b"[1,0]<stdout>:a\nplain\n")]


# ---- the labeller as a process (no MPI) -----------------------------------------------------------------

def _labeller(*program, args=(), env=None, **kwargs):
    return subprocess.Popen([sys.executable, "-I", SCRIPT, *args, "--", *program], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ, PMI_RANK="2", PMI_SIZE="12", **(env or {})),
                            **kwargs)


def test_the_labeller_ends_as_the_program_did(tmp_path):
    job = _labeller(sys.executable, "-c", "import sys; print('a'); print('b', end=''); sys.exit(3)")
    out, err = job.communicate(timeout=60)
    assert job.returncode == 3 and out == b"[1,2]<stdout>:a\n[1,2]<stdout>:b\n", (out, err)
    job = _labeller(sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    job.communicate(timeout=60)
    assert job.returncode == -signal.SIGTERM
    job = _labeller("/nonexistent/program")
    out, err = job.communicate(timeout=60)
    assert job.returncode == 127 and err.startswith(b"[1,2]<stderr>:commlib-run: cannot start"), err


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _wait_until(condition, what: str, limit: float = 60.0) -> None:
    end = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < end, f"{what}: not within {limit} s"
        time.sleep(0.01)


def test_a_signal_after_the_program_ended_leaves_its_status():
    """hydra sends SIGUSR1 to the processes of a job one of whose ranks ended (-disable-auto-cleanup). One
    that reaches the labeller after its program ended, while it still passes on the output (here a
    grandchild holds the pipe open), must not replace the program's exit status (79: restart me)."""
    job = _labeller("sh", "-c", "sleep 60 & echo $$ $!; exit 79")
    program, sleeper = (int(x) for x in job.stdout.readline().split(b":", 1)[1].split())
    _wait_until(lambda: _state(program) in (None, "Z"), "the program ended")
    _wait_until(lambda: not any(str(program) in line for line in open(f"/proc/{job.pid}/task/{job.pid}/children")
                                .read().split()), "the labeller reaped it")
    os.kill(job.pid, signal.SIGUSR1)
    os.kill(sleeper, signal.SIGKILL)
    job.communicate(timeout=60)
    assert job.returncode == 79


def test_the_program_gets_the_descriptors_and_dies_with_the_labeller():
    """A descriptor the launcher gave the labeller (as hydra gives PMI_FD) reaches the program; killing the
    labeller (SIGKILL, as a launcher may) takes the program down too."""
    read, write = os.pipe()
    job = _labeller(sys.executable, "-c", f"import os, time; os.write({write}, str(os.getpid()).encode()); "
                                          "time.sleep(120)", pass_fds=(write,))
    os.close(write)
    program = int(os.read(read, 64))
    os.close(read)
    job.kill()
    job.communicate(timeout=60)
    _wait_until(lambda: _state(program) in (None, "Z"), "the program died with its labeller")


def test_output_filename_copies_the_program_output_per_rank(tmp_path):
    job = _labeller(sys.executable, "-c", "import sys; print('out', end=''); sys.stdout.flush(); "
                                          "print(' line'); print('err', file=sys.stderr)",
                    args=("--output-filename", str(tmp_path / "logs")))
    out, err = job.communicate(timeout=60)
    assert job.returncode == 0 and out == b"[1,2]<stdout>:out line\n" and err == b"[1,2]<stderr>:err\n"
    assert (tmp_path / "logs" / "rank.02" / "stdout").read_bytes() == b"out line\n"  # 12 ranks: two digits
    assert (tmp_path / "logs" / "rank.02" / "stderr").read_bytes() == b"err\n"


# ---- through commlib-run ---------------------------------------------------------------------------------

def _commlib_run(*argv, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "commlib.run", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def _check_lines(stdout: str, stderr: str, ranks: int, lines: int, long: int) -> None:
    """Every line of the ranks' is whole and labelled with the rank that wrote it, on its stream, each
    rank's in order; nothing else but commlib-run's and the MPI's own lines."""
    seen = collections.defaultdict(list)
    for stream, text in (("stdout", stdout), ("stderr", stderr)):
        for line in text.splitlines():
            match = LINE.fullmatch(line)
            if match is None:
                assert not line.startswith("[1,") and "RUN" not in line and "ERR" not in line and \
                    "yyy" not in line, f"a cut or mixed line on {stream}: {line[:200]!r}"
                continue
            label, where, kind, rank, number, _ = match.groups()
            assert label == rank and where == stream, line[:200]
            seen[(rank, kind)].append(int(number))
    for rank in map(str, range(ranks)):
        assert seen[(rank, "RUN")] == list(range(lines)), rank
        assert seen[(rank, "ERR")] == list(range(0, lines, 7)), rank
        assert seen[(rank, "LONG")] == list(range(long)), rank


@pytest.mark.mpi
def test_four_ranks_writing_in_pieces_give_whole_labelled_lines():
    """The issue's case: hydra's -prepend-rank cut and mixed 15 to 273 of these 8,000 lines."""
    done = _commlib_run("-np", "4", sys.executable, PIECES, "2000", "20")
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"^commlib-run: \S*mpiexec .*-n 4 .*output\.py -- ", done.stderr, re.M), done.stderr[:2000]
    _check_lines(done.stdout, done.stderr, ranks=4, lines=2000, long=20)


@pytest.mark.mpi
def test_output_filename_writes_one_directory_per_rank(tmp_path):
    done = _commlib_run("-np", "2", "--output-filename", str(tmp_path / "out"), sys.executable, PIECES, "30", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    _check_lines(done.stdout, done.stderr, ranks=2, lines=30, long=1)  # the terminal still gets it all
    for rank in (0, 1):
        lines = (tmp_path / "out" / f"rank.{rank}" / "stdout").read_text().splitlines()
        assert lines[:2] == [f"RUN {rank} 00000 piece-two piece-three-", f"RUN {rank} 00001 piece-two piece-three-x"]
        assert len(lines) == 31 and lines[-1] == f"LONG {rank} 00000 " + "y" * 10000
        assert (tmp_path / "out" / f"rank.{rank}" / "stderr").read_text().splitlines()[1] == f"ERR {rank} 00007 tail"


@pytest.mark.mpi
@pytest.mark.skipif(not os.environ.get("OPEN_MPI_MPIRUN"), reason="no Open MPI here: set OPEN_MPI_MPIRUN to one's "
                                                                  "mpirun to run this against it")
def test_open_mpi_ranks_writing_in_pieces_give_whole_labelled_lines():
    """The same through Open MPI, which gives each rank's stdout a pseudo-terminal and reads 4 KiB at once."""
    done = _commlib_run("--mpiexec", os.environ["OPEN_MPI_MPIRUN"], "--mpi-args=--oversubscribe", "-np", "4",
                        sys.executable, PIECES, "2000", "20")
    assert done.returncode == 0, done.stderr[-3000:]
    _check_lines(done.stdout, done.stderr, ranks=4, lines=2000, long=20)


@pytest.mark.mpi
def test_a_reader_that_goes_away_does_not_hang_the_job():
    """``commlib-run ... | head -1``: once commlib-run's stdout is closed, it drops what it would write but
    still reads mpiexec's output, so the ranks finish (before, mpiexec itself got the broken pipe)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    job = subprocess.Popen([sys.executable, "-m", "commlib.run", "-np", "2", sys.executable, PIECES, "20000", "5"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    try:
        assert job.stdout.readline().startswith(b"[1,")
        job.stdout.close()
        assert job.wait(timeout=240) == 0
    finally:
        if job.poll() is None:  # commlib-run takes mpiexec's process group down on SIGTERM
            job.terminate()
            job.wait(timeout=60)
