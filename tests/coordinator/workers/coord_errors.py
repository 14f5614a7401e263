"""Bad input: every rank must raise a clear error naming the tensor and what differed; nothing hangs.

argv: case name. Each case leaves commlib usable for the next one (the case still_usable), but the ones that
shut a rank down early. Named cases on every rank (tests/spmd.py).
"""

import sys
import time

import numpy as np

import commlib as cl
import spmd

rank, size = spmd.rank_and_size()  # the job's, which commlib's are once init() ran


def expect_error(fn, *needles):
    try:
        fn()
    except cl.CommlibError as exc:
        text = str(exc)
        missing = [n for n in needles if n not in text]
        assert not missing, f"rank {rank}: error lacks {missing}: {text}"
        return
    raise AssertionError(f"rank {rank}: no error raised")



@spmd.case
def init():
    cl.init()


@spmd.case
def shape():
    expect_error(lambda: cl.allreduce(np.zeros(3 + rank, np.float32), name="w"), "'w'", "shape", "rank 0: (3,)",
                 "rank 1: (4,)")


@spmd.case
def dtype():
    dt = np.float32 if rank == 0 else np.float64
    expect_error(lambda: cl.allreduce(np.zeros(3, dt), name="w"), "'w'", "dtype", "float32", "float64")


@spmd.case
def op():
    expect_error(lambda: cl.allreduce(np.zeros(3), op=cl.Sum if rank == 0 else cl.Max, name="w"), "'w'", "op")


@spmd.case
def root():
    expect_error(lambda: cl.broadcast(np.zeros(3), rank % 2, name="w"), "'w'", "root rank")


@spmd.case
def scale():
    expect_error(lambda: cl.allreduce(np.zeros(3), prescale_factor=1.0 + rank, name="w"), "'w'", "prescale")


@spmd.case
def compression():
    comp = cl.Compression.fp16 if rank == 0 else cl.Compression.none
    expect_error(lambda: cl.allreduce(np.zeros(3, np.float32), compression=comp, name="w"), "'w'", "compression")


@spmd.case
def allgather_shape():
    expect_error(lambda: cl.allgather(np.zeros((2, 1 + rank)), name="w"), "'w'", "shape")


@spmd.case
def noncontiguous():
    x = np.zeros((4, 4), np.float32)
    arg = x[:, ::2] if rank == size - 1 else x[:, :2].copy()
    expect_error(lambda: cl.allreduce_(arg, name="w"), "'w'", "not contiguous", f"rank {size - 1}")


@spmd.case
def unsupported_dtype():
    dt = np.complex64 if rank == 0 else np.float32
    expect_error(lambda: cl.allreduce(np.zeros(3, dt), name="w"), "'w'", "complex64")


@spmd.case
def average_bool():
    expect_error(lambda: cl.allreduce(np.zeros(3, np.bool_), op=cl.Average, name="w"), "'w'", "Average", "bool")


@spmd.case
def bad_algorithm():
    expect_error(lambda: cl.allreduce(np.zeros(3), algorithm="fastest", name="w"), "fastest", "ring")


@spmd.case
def readonly():
    x = np.zeros(3)
    x.flags.writeable = rank != 0
    expect_error(lambda: cl.allreduce_(x, name="w"), "'w'", "read-only", "rank 0")


@spmd.case
def reuse():
    # The check is local to the calling rank. Each rank in turn submits a name and tries again while the
    # others hold theirs back (told over the world communicator), so it cannot have completed in between.
    from mpi4py import MPI
    for checker in range(size):
        name = f"w{checker}"
        if rank == checker:
            h = cl.allreduce_async(np.zeros(3), name=name)
            expect_error(lambda: cl.allreduce_async(np.zeros(3), name=name), f"'{name}'", "already in flight")
            try:  # a ValueError too, as Horovod raises
                cl.allreduce_async(np.zeros(3), name=name)
            except ValueError as exc:
                assert isinstance(exc, cl.CommlibError) and "already in flight" in str(exc)
            else:
                raise AssertionError("no ValueError")
            for peer in range(size):
                if peer != rank:
                    MPI.COMM_WORLD.send("go", dest=peer, tag=77)
        else:
            MPI.COMM_WORLD.recv(source=checker, tag=77)
            h = cl.allreduce_async(np.zeros(3), name=name)
        cl.synchronize(h)


@spmd.case
def stall():
    # rank 0 never submits 'w': the others fail once COMMLIB_STALL_SHUTDOWN_TIME has passed, naming it (the
    # error says it stalled: no other limit could end the wait before the job's timeout)
    if rank != 0:
        expect_error(lambda: cl.allreduce(np.zeros(3), name="w"), "'w'", "stalled", "[0]")
    else:  # then 'after' (still_usable): within the shutdown time of the others' submitting it, which
        time.sleep(1)  # follows their failing 'w' (at least 1 s from now)


@spmd.case
def shutdown_peer():
    # the last rank shuts down while the others wait for it: they fail instead of hanging
    if rank != size - 1:
        expect_error(lambda: cl.allreduce(np.zeros(3), name="w"), "'w'", f"rank {size - 1}", "shut down")
    cl.shutdown()


@spmd.case
def shutdown_root():
    # rank 0 (the relay, when rounds go through it) shuts down while the others submit: they fail
    if rank != 0:
        expect_error(lambda: cl.allreduce(np.zeros(3), name="w"), "'w'", "rank 0", "shut down")
    cl.shutdown()


@spmd.case
def persistent():
    # a persistent request: right sums on repeated starts (the kept metadata after the first), and a start
    # that differs (shape on one rank) takes the full path: the error names the tensor on every rank
    request = cl.persistent_allreduce("p", op=cl.Sum, postscale_factor=2.0)
    for step in range(3):
        x = np.full(5, rank + step, np.float32)
        cl.synchronize(request.start_(x))
        assert np.all(x == 2.0 * sum(r + step for r in range(size))), (step, x)
        assert request._meta is not None, "the request's metadata was not kept"
    expect_error(lambda: cl.synchronize(request.start_(np.zeros(5 + rank, np.float32))), "'p'", "shape")
    x = np.ones(5, np.float32)
    cl.synchronize(request.start_(x))
    assert np.all(x == 2.0 * size), x
    for bad in (None, 3.5, ""):
        try:
            cl.persistent_allreduce(bad)
        except TypeError as exc:
            assert "name" in str(exc), exc
        else:
            raise AssertionError(f"persistent_allreduce({bad!r}) raised nothing")


@spmd.case
def execution_failure():
    # an engine error during execution (a torus grid that does not fit) reaches every rank's handle
    expect_error(lambda: cl.allreduce(np.zeros(3), algorithm="torus2d", name="w"), "COMMLIB_TORUS_SHAPE")


@spmd.case
def still_usable():
    """commlib is still usable after the error."""
    assert np.all(cl.allreduce(np.ones(2), op=cl.Sum, name="after") == size)


@spmd.case
def shutdown():
    cl.shutdown()


if __name__ == "__main__":
    case = sys.argv[1]
    ends_early = case in ("shutdown_peer", "shutdown_root")  # a rank shuts down while the others wait for it
    spmd.main(["init", case] + ([] if ends_early else ["still_usable", "shutdown"]))
