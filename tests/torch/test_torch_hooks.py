"""commlib's DDP communication hooks (commlib/torch/hooks.py) on gloo and on the ``commlib`` backend.

``workers/torch_hooks.py`` checks, as named cases,, on 2 and 3 ranks of each backend: the fp16 wrapper against PyTorch's
``fp16_compress_hook`` (training) and against numpy's rounding (one bucket), the bf16 wrapper against numpy
and ml_dtypes, PowerSGD against PyTorch's ``powerSGD_hook`` on gradients both approximate exactly, top-k with
error feedback against numpy over three steps, and DGC, one-bit and top-k under fp16 training with every
rank's parameters equal and the loss falling.
"""

import pytest

from mpirun import run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["gloo", "commlib"])
@pytest.mark.parametrize("ranks", [2, pytest.param(3, marks=pytest.mark.full)])
def test_hooks(backend, ranks):
    run_mpi(ranks, "torch_hooks.py", backend, timeout=300)


def test_compress_wrapper_refuses_what_is_not_a_compressor():
    from commlib import Compression
    from commlib.torch import hooks

    with pytest.raises(TypeError, match="commlib compressor"):
        hooks.compress_wrapper(hooks.allreduce_hook, Compression.fp16)
