"""Worker: ranks must agree on where a tensor lives, and a device tensor that cannot be staged fails on
every rank with what to install. argv: case name.

- ``metadata``: rank 0's request says its tensor is on "cuda" (crafted metadata: this machine has no
  GPU), the others' say "cpu": every rank fails naming the tensor, the device and each rank's value.
- ``no_cupy``: rank 0 passes an object that declares CUDA memory through ``__cuda_array_interface__``
  (it is never read: staging stops when CuPy is missing), the others a numpy array: every rank fails
  naming the tensor, rank 0 and what to install. Run only where CuPy is not installed.
- ``unsupported_device``: rank 0's tensor is on a device commlib has no path to (DLPack type 4).
Then the library is still usable. Named cases on every rank (tests/spmd.py).
"""

import sys

import numpy as np

import commlib as cl
import spmd
from commlib import api
from commlib.coordinator.requests import Kind, Meta

rank, size = spmd.rank_and_size()  # the job's, which commlib's are once init() ran


class DeclaredCudaArray:
    """Declares CUDA memory by the protocol alone (no GPU here; its pointer is never dereferenced)."""

    def __init__(self, shape, typestr):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (0, False), "version": 3}


def expect_error(fn, *needles):
    """``fn`` must raise a CommlibError mentioning every needle (on this rank)."""
    text = ""
    try:
        fn()
    except cl.CommlibError as exc:
        text = str(exc)
    absent = [n for n in needles if n not in text] if text else ["(no error raised)"]
    assert not absent, f"rank {rank}: {absent} not in {text!r}"


@spmd.case
def init():
    cl.init()


@spmd.case
def metadata():
    def submit(kind):
        array = np.zeros(4, np.float32)
        meta = Meta("grad", kind, "float32", (4,), int(cl.Sum), device="cuda" if rank == 0 else "cpu")
        _, member, _ = api._member_and_name(None, "grad", "allreduce")
        return cl.synchronize(api._submit(member, meta, array, array, wait=True))
    listing = ", ".join(f"rank {r}: {'cuda' if r == 0 else 'cpu'}" for r in range(size))
    expect_error(lambda: submit(Kind.ALLREDUCE), "'grad'", f"mismatched device ({listing})")
    expect_error(lambda: submit(Kind.BROADCAST), "'grad'", "mismatched device")


@spmd.case
def no_cupy():
    for call in (lambda x: cl.allreduce(x, name="w"), lambda x: cl.allreduce_(x, name="w"),
                 lambda x: cl.allgather(x, name="w"), lambda x: cl.broadcast_(x, 0, name="w")):
        tensor = DeclaredCudaArray((3, 2), "<f4") if rank == 0 else np.zeros((3, 2), np.float32)
        expect_error(lambda: call(tensor), "'w'", "rank 0", "cuda", "CuPy is not installed", "commlib[cuda12]")


@spmd.case
def unsupported_device():
    class OnOpenCL:
        """Says (DLPack) that its memory is on an OpenCL device: commlib has no path there."""

        def __dlpack_device__(self):
            return (4, 0)
    tensor = OnOpenCL() if rank == 0 else np.zeros(3, np.float32)
    expect_error(lambda: cl.allreduce(tensor, name="w"), "'w'", "rank 0", "DLPack device type 4")


@spmd.case
def still_usable():
    out = cl.allreduce(np.full(3, float(rank)), op=cl.Sum, name="after")
    assert np.allclose(out, sum(range(size)))


@spmd.case
def shutdown():
    cl.shutdown()


if __name__ == "__main__":
    spmd.main(["init", sys.argv[1], "still_usable", "shutdown"])
