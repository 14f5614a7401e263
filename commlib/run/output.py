"""Each rank's output as whole lines, labelled with its rank: ``[1,3]<stdout>:loss 0.25``.

MPI launchers forward what a rank writes in the chunks they happen to read, and hydra's ``-prepend-rank``
labels each chunk, not each line: a rank that writes a line in pieces (``PYTHONUNBUFFERED=1``, ``print``
with ``end=""``) gets it cut, and the pieces of several ranks mixed. So ``commlib-run`` starts every rank
through this file::

    python -I .../commlib/run/output.py [--output-filename DIR] [--read-size N] -- python train.py ...

It runs the program with its stdout and stderr on pipes of its own, cuts what arrives into lines (``\\n``;
a ``\\r`` not followed by ``\\n`` also ends a piece, so progress bars still move) and writes them, each
with its label, to its own stdout and stderr, which the MPI launcher reads:

- every write holds whole records and at most ``PIPE_BUF`` bytes, so the pipe keeps it whole;
- the pipe never holds more than the launcher reads at once (``--read-size``: hydra reads up to 64 KiB,
  its pipe's capacity, so it never waits; Open MPI reads 4 KiB, so a write waits until it fits): each
  read the launcher makes, and so each chunk it forwards, ends where a record ends;
- a line longer than a record can be is sent as continuation records (``[1,3]<stdout>+`` and the part)
  and a last one with the usual label; :class:`Joiner`, in ``commlib-run``, puts it back together.

So every line reaches ``commlib-run``'s output whole, whichever rank wrote what when. A last piece without
its newline gets one.

The label is Open MPI's ``--tag-output`` form, which horovodrun's output has on Open MPI:
``[1,RANK]<stdout>:`` and ``[1,RANK]<stderr>:`` (``1``, Open MPI's job number, is always 1 here).
With ``--output-filename DIR`` the program's output is also written, as it wrote it (no labels), to
``DIR/rank.N/stdout`` and ``DIR/rank.N/stderr`` on the rank's host, N padded to the width of the
largest rank (horovodrun's layout); a restarted elastic job's files start afresh.

The rank and the job's size come from the launcher's variables (MPICH's ``PMI_RANK``, Open MPI's
``OMPI_COMM_WORLD_RANK``, PMIx's ``PMIX_RANK``, Slurm's ``SLURM_PROCID``). The program inherits every
file descriptor this process inherited (hydra's ``PMI_FD`` among them), every signal this process gets
is passed on to it, it dies with this process (Linux: ``PR_SET_PDEATHSIG``), and this process ends as
the program did: with its exit status, or killed by the same signal.

Run as a file (``python -I``), this module imports nothing but the standard library: a rank starts it
in a few tens of milliseconds, where importing ``commlib`` takes about a second.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import stat
import struct
import subprocess
import sys
import termios
import threading
import time
from typing import Mapping, Sequence

#: this file, which each rank runs (``python -I SCRIPT ...``)
SCRIPT = os.path.abspath(__file__)

#: the launchers' variables that carry a process's rank and the job's size, first found wins
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")

#: the most bytes one write carries (POSIX's PIPE_BUF: a write of at most this many bytes lands in a pipe
#: whole, never mixed with another's)
RECORD = getattr(select, "PIPE_BUF", 4096)
#: what hydra (MPICH, Intel MPI) reads from a rank's pipe at once (HYD_TMPBUF_SIZE)
HYDRA_READ = 1 << 16
#: what Open MPI reads from a rank's pipe at once (ORTE_IOF_BASE_MSG_MAX, PRTE_IOF_BASE_MSG_MAX)
OPEN_MPI_READ = 4096

#: the signals passed on to the program
FORWARDED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1",
                                                     "SIGUSR2", "SIGCONT", "SIGWINCH") if hasattr(signal, name))

_ENDS = re.compile(rb"\r\n|\n|\r")
_LABEL = re.compile(rb"\[1,([^\]\s]*)\]<(stdout|stderr)>([:+])")


def command(program: Sequence[str], output_filename: str | None = None, read_size: int = HYDRA_READ,
            python: str = sys.executable) -> list[str]:
    """The command line that runs ``program`` as one rank with its output labelled, for a launcher that
    reads ``read_size`` bytes at once (and, with ``output_filename``, copied to that directory)."""
    extra = ["--output-filename", output_filename] if output_filename else []
    if read_size != HYDRA_READ:
        extra += ["--read-size", str(read_size)]
    return [python, "-I", SCRIPT, *extra, "--", *program]


def label(rank: str, stream: str, more: bool = False) -> bytes:
    """``[1,RANK]<stream>:``, what each of a rank's lines starts with (``+`` instead of ``:``: a part of a
    longer line, more of it follows)."""
    return f"[1,{rank}]<{stream}>{'+' if more else ':'}".encode()


def launcher_rank(environ: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """(this process's rank, the job's size or None) from the launcher's variables in ``environ`` (default:
    this process's environment); ``?`` for a rank no launcher named."""
    environ = os.environ if environ is None else environ
    rank = next((environ[v] for v in RANK_VARIABLES if environ.get(v, "").isdigit()), "?")
    size = next((environ[v] for v in SIZE_VARIABLES if environ.get(v, "").isdigit()), None)
    return rank, size


def _complete(data: bytes) -> int:
    """How much of ``data`` is whole pieces: up to its last line end (a last ``\\r`` may precede ``\\n``)."""
    return max(data.rfind(b"\n"), data.rfind(b"\r", 0, len(data) - 1)) + 1


def _ended(rest: bytes) -> bytes:
    """A last piece, given its line end if it has none."""
    return rest if rest.endswith((b"\n", b"\r")) else rest + b"\n"


def _pieces(text: bytes) -> list[bytes]:
    """``text`` (ending in a line end) cut after each line end."""
    if b"\r" not in text:
        return [line + b"\n" for line in text[:-1].split(b"\n")]
    parts, ends = _ENDS.split(text), _ENDS.findall(text)
    return [part + end for part, end in zip(parts, ends)]


class Lines:
    """Cuts one rank's stream into labelled records: :meth:`feed` returns the writes for what is complete
    so far (whole records, at most :data:`RECORD` bytes each), :meth:`close` those for the rest."""

    def __init__(self, rank: str, stream: str, size: int = RECORD):
        self.whole = label(rank, stream)
        self.part = label(rank, stream, more=True)
        self.size = size
        self.room = size - len(self.whole) - 1  # the most of a line one record carries
        self.pending = b""

    def feed(self, data: bytes) -> list[bytes]:
        data = self.pending + data
        end = _complete(data)
        self.pending = data[end:]
        return self._writes(data[:end]) if end else []

    def close(self) -> list[bytes]:
        rest, self.pending = self.pending, b""
        return self._writes(_ended(rest)) if rest else []

    def _writes(self, text: bytes) -> list[bytes]:
        if b"\r" in text:
            return self._batches(text)
        # lines only (the common case): labelled in one pass, cut into batches at line ends
        labelled = self.whole + text[:-1].replace(b"\n", b"\n" + self.whole) + b"\n"
        writes, start = [], 0
        while len(labelled) - start > self.size:
            cut = labelled.rfind(b"\n", start, start + self.size) + 1
            if cut <= start:  # a line longer than a record: the rest record by record
                done = start - labelled.count(b"\n", 0, start) * len(self.whole)  # one label per line before
                return writes + self._batches(text[done:])
            writes.append(labelled[start:cut])
            start = cut
        return writes + [labelled[start:]]

    def _batches(self, text: bytes) -> list[bytes]:
        """``text`` as records, gathered into writes of at most :attr:`size` bytes."""
        writes, batch, used = [], [], 0
        for piece in _pieces(text):
            for record in self._records(piece):
                if used + len(record) > self.size:
                    writes.append(b"".join(batch))
                    batch, used = [], 0
                batch.append(record)
                used += len(record)
        if batch:
            writes.append(b"".join(batch))
        return writes

    def _records(self, piece: bytes) -> list[bytes]:
        """One line as records: itself labelled, or, when too long for one, continuation records (each
        ending in a newline of its own) and the last part with the line's end."""
        if len(self.whole) + len(piece) <= self.size:
            return [self.whole + piece]
        end = 2 if piece.endswith(b"\r\n") else 1
        body, last_room = piece[:-end], self.room + 1 - end
        records, start = [], 0
        while len(body) - start > last_room:
            records.append(self.part + body[start:start + self.room] + b"\n")
            start += self.room
        return records + [self.whole + piece[start:]]


class Joiner:
    """The reading side (``commlib-run``): takes the launcher's output from one of its streams in any
    chunks, puts each line cut into continuation records back together, and hands on whole lines, each
    for the stream its label names (a line without a label, the launcher's own, for ``default``)."""

    def __init__(self, default: str = "stdout"):
        self.default = default
        self.other = b"<stderr>" if default == "stdout" else b"<stdout>"
        self.pending = b""
        self.parts: dict[bytes, list[bytes]] = {}

    def feed(self, data: bytes) -> list[tuple[str, bytes]]:
        """``(stream, whole lines)`` for what ``data`` completes, in order."""
        data = self.pending + data
        end = _complete(data)
        self.pending = data[end:]
        return self._join(data[:end])

    def close(self) -> list[tuple[str, bytes]]:
        """The rest: a last piece without its line end, and the parts of lines whose end never came."""
        rest, self.pending = self.pending, b""
        out = self._join(_ended(rest)) if rest else []
        for key, parts in self.parts.items():
            rank, stream = key.decode().split("<", 1)
            out.append((stream, label(rank, stream) + b"".join(parts) + b"\n"))
        self.parts = {}
        return out

    def _join(self, text: bytes) -> list[tuple[str, bytes]]:
        """``text`` (whole pieces) with each continued line put back together, by stream."""
        if not text:
            return []
        if not self.parts and b">+" not in text and self.other not in text:
            return [(self.default, text)]  # all of it for this stream, nothing to join
        out: list[tuple[str, bytes]] = []
        for piece in _pieces(text):
            match = _LABEL.match(piece)
            if match is None:  # the launcher's own message
                out.append((self.default, piece))
                continue
            stream = match.group(2).decode()
            key = match.group(1) + b"<" + match.group(2)
            if match.group(3) == b"+":
                self.parts.setdefault(key, []).append(piece[match.end():-1])
                continue
            if key in self.parts:
                piece = piece[:match.end()] + b"".join(self.parts.pop(key)) + piece[match.end():]
            out.append((stream, piece))
        merged: list[tuple[str, bytes]] = []
        for stream, piece in out:  # neighbours of one stream in one write
            if merged and merged[-1][0] == stream:
                merged[-1] = (stream, merged[-1][1] + piece)
            else:
                merged.append((stream, piece))
        return merged


def relay(source, default: str, targets: Mapping[str, object], lock: threading.Lock, keep=None) -> None:
    """Copy the launcher's output from ``source`` (a binary stream: mpiexec's stdout or stderr, named by
    ``default``) to ``targets[stream]`` (binary streams) as whole lines (:class:`Joiner`), holding ``lock``
    for each write; ``keep(data)``, if given, sees what is written. A target that cannot be written any
    more (``commlib-run ... | head``) is dropped, and ``source`` still read to its end: a launcher blocked
    on a full pipe would hang the job."""
    joiner = Joiner(default)
    while True:
        data = source.read1(1 << 16)
        for stream, text in joiner.feed(data) if data else joiner.close():
            with lock:
                try:
                    if targets[stream] is not None:
                        targets[stream].write(text)
                        targets[stream].flush()
                except (OSError, ValueError):
                    targets[stream] = None
            if keep is not None:
                keep(text)
        if not data:
            return


def relays(job: subprocess.Popen, tail=None) -> list[threading.Thread]:
    """Start copying ``job``'s stdout and stderr (binary pipes) to ours as whole lines, each on the stream
    its label names; ``tail``, a deque, keeps the last chunks written. Join the threads returned."""
    targets = {"stdout": _binary(sys.stdout), "stderr": _binary(sys.stderr)}
    lock, keep = threading.Lock(), tail.append if tail is not None else None
    threads = [threading.Thread(target=relay, args=(source, name, targets, lock, keep), name=f"commlib-run-{name}",
                                daemon=True)
               for source, name in ((job.stdout, "stdout"), (job.stderr, "stderr"))]
    for thread in threads:
        thread.start()
    return threads


def write(chunks: Sequence[tuple[str, bytes]]) -> None:
    """Write ``(stream, lines)`` (what :func:`join` returns) to our stdout and stderr."""
    for stream, text in chunks:
        target = _binary(sys.stdout if stream == "stdout" else sys.stderr)
        target.write(text)
        target.flush()


class _Text:
    """A text stream (one without ``.buffer``, e.g. a test's StringIO) taking bytes."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, data: bytes) -> None:
        self.stream.write(data.decode(errors="replace"))

    def flush(self) -> None:
        self.stream.flush()


def _binary(stream):
    return getattr(stream, "buffer", None) or _Text(stream)


def join(data: bytes, default: str = "stdout") -> list[tuple[str, bytes]]:
    """All of one stream's output at once (a job that ended): ``(stream, whole lines)`` in order."""
    joiner = Joiner(default)
    return joiner.feed(data) + joiner.close()


class _Pipe:
    """Writes whole records to a file descriptor. Where it is a pipe whose reader takes ``read_size`` bytes
    at once, less than the pipe holds, a write waits until the pipe's content and the write fit in one
    such read (so the reader never takes part of a record); one lock keeps the threads' writes apart."""

    def __init__(self, fd: int, read_size: int):
        self.fd = fd
        self.limit = None
        self.lock = threading.Lock()
        if is_pipe(fd) and sys.platform == "linux":
            try:
                capacity = fcntl.fcntl(fd, 1032)  # F_GETPIPE_SZ
            except OSError:
                capacity = 1 << 16
            self.limit = read_size if read_size < capacity else None

    def _queued(self) -> int:
        return struct.unpack("i", fcntl.ioctl(self.fd, termios.FIONREAD, b"\0\0\0\0"))[0]

    def write(self, data: bytes) -> None:
        """Write ``data`` whole; once the reader is gone, nothing (the program's output is still drained,
        so that it never blocks on a full pipe while its launcher takes the job down)."""
        with self.lock:
            if self.fd is None:
                return
            if self.limit is not None:
                pause, room = 20e-6, max(self.limit - len(data), 0)
                while self._queued() > room:
                    time.sleep(pause)
                    pause = min(2 * pause, 2e-3)
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(self.fd, view):]
            except OSError:  # EPIPE: the launcher's end is closed
                self.fd = None


def is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def pump(source: int, target: _Pipe, rank: str, stream: str, copy=None) -> None:
    """Copy the program's ``source`` to ``target`` as labelled records until its end; ``copy``: a binary
    file that gets the output as it came."""
    lines = Lines(rank, stream)
    while True:
        data = os.read(source, 1 << 16)
        if not data:
            break
        if copy is not None:
            copy.write(data)
            copy.flush()
        for write in lines.feed(data):
            target.write(write)
    for write in lines.close():
        target.write(write)


def _inherited_fds() -> list[int]:
    """The file descriptors above 2 this process was started with (the MPI launcher's, e.g. PMI_FD)."""
    for where in ("/proc/self/fd", "/dev/fd"):
        try:
            names = os.listdir(where)
        except OSError:
            continue
        fds = []
        for fd in sorted(int(name) for name in names):
            if fd > 2:
                try:
                    os.fstat(fd)
                except OSError:  # the listing's own descriptor, closed by now
                    continue
                fds.append(fd)
        return fds
    return []


def _die_with_parent() -> None:  # pragma: no cover (runs in the child before exec)
    """Linux: the program gets SIGKILL when this process ends, however it ends (a launcher's SIGKILL too)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _copies(directory: str | None, rank: str, size: str | None):
    if not directory:
        return None, None
    width = len(str(int(size) - 1)) if size and int(size) > 1 else 1
    where = os.path.join(directory, f"rank.{rank.zfill(width) if rank.isdigit() else rank}")
    os.makedirs(where, exist_ok=True)
    return open(os.path.join(where, "stdout"), "wb"), open(os.path.join(where, "stderr"), "wb")


def run(program: Sequence[str], output_filename: str | None = None, read_size: int = HYDRA_READ) -> int:
    """Run ``program`` with its output labelled; return its exit status (negative: killed by that signal)."""
    inherited = _inherited_fds()  # before this process opens anything of its own
    rank, size = launcher_rank()
    stderr = _Pipe(2, read_size)
    # a terminal (Open MPI gives each rank's stdout a pseudo-terminal) cannot keep a record whole: then the
    # stdout records go through the stderr pipe too, and their labels say where they belong
    stdout = stderr if os.isatty(1) and is_pipe(2) else _Pipe(1, read_size)
    out_copy, err_copy = _copies(output_filename, rank, size)
    try:
        child = subprocess.Popen(list(program), stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True,
                                 pass_fds=inherited, preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    except OSError as exc:
        stderr.write(label(rank, "stderr") + f"commlib-run: cannot start {program[0]!r}: {exc}\n".encode())
        return 127
    for fd in inherited:  # the program's now: what the launcher watches closes when the program ends
        try:
            os.close(fd)
        except OSError:
            pass
    for signum in FORWARDED:
        signal.signal(signum, lambda number, frame: child.send_signal(number))
    pumps = [threading.Thread(target=pump, args=(child.stdout.fileno(), stdout, rank, "stdout", out_copy)),
             threading.Thread(target=pump, args=(child.stderr.fileno(), stderr, rank, "stderr", err_copy))]
    for thread in pumps:
        thread.start()
    code = child.wait()
    for signum in FORWARDED:  # nobody to pass them to: a late one (hydra's SIGUSR1 to the survivors of a
        signal.signal(signum, signal.SIG_IGN)  # rank that ended) must not end this process in the program's stead
    for thread in pumps:
        thread.join()
    for stream in (child.stdout, child.stderr, out_copy, err_copy):
        if stream is not None:
            stream.close()
    return code


def main(argv: Sequence[str] | None = None) -> None:
    """``output.py [--output-filename DIR] [--read-size N] -- program ...``: ends as the program did."""
    argv = list(sys.argv[1:] if argv is None else argv)
    options = {"--output-filename": None, "--read-size": str(HYDRA_READ)}
    while argv[:1] and argv[0] in options and len(argv) > 1:
        options[argv[0]], argv = argv[1], argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv or not options["--read-size"].isdigit() or int(options["--read-size"]) < 1:
        sys.stderr.write("usage: output.py [--output-filename DIR] [--read-size BYTES] -- program [args ...]\n")
        sys.exit(2)
    code = run(argv, options["--output-filename"], int(options["--read-size"]))
    if code < 0:  # end as the program did: killed by the same signal
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    # at once: the interpreter's shutdown would put the default handlers back, and a late signal then end it
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
