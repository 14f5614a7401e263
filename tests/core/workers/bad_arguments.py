"""Arguments that cannot even be described in a request: a TypeError or ValueError on the calling rank,
naming the argument and the value, before anything reaches the background coordinator; the library keeps
working (checked by a good allreduce after each case)."""

import numpy as np
import torch

import commlib as cl
import commlib.torch as hvd
import spmd
from spmd import expect_error


x = np.ones(4, np.float32)
rank, size = spmd.rank_and_size()  # the job's, which commlib's are once init() ran


@spmd.case
def init():
    cl.init()


@spmd.case
def each_fails_on_the_calling_rank_and_commlib_keeps_working():
    cases = [
        (TypeError, "name must be a string", lambda: cl.allreduce(x, name=3.5), "allreduce name=3.5"),
        (TypeError, "float 3.5", lambda: cl.allreduce_async_(x, name=3.5), "allreduce_async_ name=3.5"),
        (TypeError, "name must be a string", lambda: cl.allgather(x, name=b"w"), "allgather name=b'w'"),
        (TypeError, "name must be a string", lambda: cl.grouped_allreduce([x], name=4), "grouped name=4"),
        (TypeError, "name must be a string", lambda: hvd.allreduce(torch.ones(2), name=1.0), "torch name=1.0"),
        (ValueError, "prescale_factor must be finite, got nan",
         lambda: cl.allreduce(x, prescale_factor=float("nan")), "prescale nan"),
        (ValueError, "postscale_factor must be finite, got inf",
         lambda: cl.allreduce(x, postscale_factor=float("inf")), "postscale inf"),
        (ValueError, "prescale_factor must be finite", lambda: cl.reducescatter(x, prescale_factor=float("-inf")),
         "reducescatter prescale -inf"),
        (ValueError, "postscale_factor must be finite",
         lambda: hvd.allreduce(torch.ones(2), postscale_factor=float("nan")), "torch postscale nan"),
        (TypeError, "prescale_factor must be a real number, not str '2'",
         lambda: cl.allreduce(x, prescale_factor="2"), "prescale '2'"),
        (TypeError, "not int 12345", lambda: cl.synchronize(12345), "synchronize(12345)"),
        (TypeError, "not str 'h'", lambda: cl.poll("h"), "poll('h')"),
        (TypeError, "not int 7", lambda: hvd.synchronize(7), "torch synchronize(7)"),
        (TypeError, "not str 'h'", lambda: hvd.poll("h"), "torch poll('h')"),
        (TypeError, "root_rank must be an integer rank, not float 0.5", lambda: cl.broadcast(x, 0.5),
         "broadcast root 0.5"),
        (TypeError, "splits must hold integers", lambda: cl.alltoall(np.ones(4), splits=[1.5, 2.5]),
         "alltoall float splits"),
        (TypeError, "tensors must be a list of tensors, not int 5", lambda: cl.grouped_allreduce(5),
         "grouped_allreduce(5)"),
        (TypeError, "path must be a file path", lambda: cl.start_timeline(3), "start_timeline(3): not fd 3"),
        (ValueError, "process_set must be a ProcessSet", lambda: cl.remove_process_set("x"), "remove_process_set"),
        (TypeError, "params is a int", lambda: hvd.broadcast_parameters(3, 0), "broadcast_parameters(3)"),
        (TypeError, "root_rank must be an integer", lambda: hvd.broadcast_parameters([torch.ones(1)], "0"),
         "broadcast_parameters root '0'"),
    ]
    for kind, fragment, call, what in cases:
        expect_error(kind, fragment, call, what)
        total = cl.allreduce(np.full(3, rank + 1.0), op=cl.Sum, name="after")
        assert np.array_equal(total, np.full(3, size * (size + 1) / 2)), (what, total)


@spmd.case
def a_failure_on_one_rank_uses_up_no_automatic_name():
    """The next unnamed call still matches the others'."""
    if rank == 0:
        expect_error(ValueError, "finite", lambda: cl.allreduce(x, prescale_factor=float("nan")), "rank 0 only")
        expect_error(TypeError, "root_rank", lambda: cl.broadcast(x, "0"), "rank 0 only")
    assert np.array_equal(cl.allreduce(x, op=cl.Sum), x * size)
    assert np.array_equal(cl.broadcast(np.full(2, float(rank)), 0), np.zeros(2))


@spmd.case
def shutdown():
    cl.shutdown()


if __name__ == "__main__":
    spmd.main()
