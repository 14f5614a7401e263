"""Bad input: every rank must raise a clear error naming the tensor and what differed; nothing hangs.

argv: case name. Each case leaves commlib usable for the next one (checked by a final allreduce).
"""

import sys
import time

import numpy as np

import commlib as cl

case = sys.argv[1]
cl.init()
rank, size = cl.rank(), cl.size()


def expect_error(fn, *needles):
    try:
        fn()
    except cl.CommlibError as exc:
        text = str(exc)
        missing = [n for n in needles if n not in text]
        assert not missing, f"rank {rank}: error lacks {missing}: {text}"
        print(f"rank {rank}: raised as expected: {text}", flush=True)
        return
    raise AssertionError(f"rank {rank}: case {case}: no error raised")


if case == "shape":
    expect_error(lambda: cl.allreduce(np.zeros(3 + rank, np.float32), name="w"), "'w'", "shape", "rank 0: (3,)",
                 "rank 1: (4,)")
elif case == "dtype":
    dt = np.float32 if rank == 0 else np.float64
    expect_error(lambda: cl.allreduce(np.zeros(3, dt), name="w"), "'w'", "dtype", "float32", "float64")
elif case == "op":
    expect_error(lambda: cl.allreduce(np.zeros(3), op=cl.Sum if rank == 0 else cl.Max, name="w"), "'w'", "op")
elif case == "root":
    expect_error(lambda: cl.broadcast(np.zeros(3), rank % 2, name="w"), "'w'", "root rank")
elif case == "scale":
    expect_error(lambda: cl.allreduce(np.zeros(3), prescale_factor=1.0 + rank, name="w"), "'w'", "prescale")
elif case == "compression":
    comp = cl.Compression.fp16 if rank == 0 else cl.Compression.none
    expect_error(lambda: cl.allreduce(np.zeros(3, np.float32), compression=comp, name="w"), "'w'", "compression")
elif case == "allgather_shape":
    expect_error(lambda: cl.allgather(np.zeros((2, 1 + rank)), name="w"), "'w'", "shape")
elif case == "noncontiguous":
    x = np.zeros((4, 4), np.float32)
    arg = x[:, ::2] if rank == size - 1 else x[:, :2].copy()
    expect_error(lambda: cl.allreduce_(arg, name="w"), "'w'", "not contiguous", f"rank {size - 1}")
elif case == "unsupported_dtype":
    dt = np.complex64 if rank == 0 else np.float32
    expect_error(lambda: cl.allreduce(np.zeros(3, dt), name="w"), "'w'", "complex64")
elif case == "average_bool":
    expect_error(lambda: cl.allreduce(np.zeros(3, np.bool_), op=cl.Average, name="w"), "'w'", "Average", "bool")
elif case == "bad_algorithm":
    expect_error(lambda: cl.allreduce(np.zeros(3), algorithm="fastest", name="w"), "fastest", "ring")
elif case == "readonly":
    x = np.zeros(3)
    x.flags.writeable = rank != 0
    expect_error(lambda: cl.allreduce_(x, name="w"), "'w'", "read-only", "rank 0")
elif case == "reuse":
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
elif case == "stall":
    # rank 0 never submits 'w': the others must fail after COMMLIB_STALL_SHUTDOWN_TIME
    if rank != 0:
        start = time.monotonic()
        expect_error(lambda: cl.allreduce(np.zeros(3), name="w"), "'w'", "stalled", "[0]")
        assert time.monotonic() - start < 20
    else:
        time.sleep(3)
elif case == "shutdown_peer":
    # the last rank shuts down while the others wait for it: they fail instead of hanging
    if rank == size - 1:
        cl.shutdown()
        print(f"rank {rank}: shut down early", flush=True)
        sys.exit(0)
    expect_error(lambda: cl.allreduce(np.zeros(3), name="w"), "'w'", f"rank {size - 1}", "shut down")
    cl.shutdown()
    sys.exit(0)
elif case == "shutdown_root":
    # rank 0 (the relay, when rounds go through it) shuts down while the others submit: they fail
    if rank == 0:
        cl.shutdown()
        print(f"rank {rank}: shut down early", flush=True)
        sys.exit(0)
    expect_error(lambda: cl.allreduce(np.zeros(3), name="w"), "'w'", "rank 0", "shut down")
    cl.shutdown()
    sys.exit(0)
elif case == "persistent":
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
elif case == "execution_failure":
    # an engine error during execution (a torus grid that does not fit) reaches every rank's handle
    expect_error(lambda: cl.allreduce(np.zeros(3), algorithm="torus2d", name="w"), "COMMLIB_TORUS_SHAPE")
else:
    raise SystemExit(f"unknown case {case}")

# commlib is still usable after the error
assert np.all(cl.allreduce(np.ones(2), op=cl.Sum, name="after") == size)
cl.shutdown()
print(f"rank {rank}: case {case} OK", flush=True)
