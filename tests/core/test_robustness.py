"""No bad input breaks commlib: arguments of the wrong type are errors on the calling rank before anything
reaches the background coordinator, every other bad argument is an error on every rank, the library keeps
working afterwards; a compressor that applies momentum is refused around an optimizer with momentum.

The fuzz test runs FUZZ_EXAMPLES random calls (default 150, about a minute on 2 ranks); set it higher to
search longer, e.g. ``FUZZ_EXAMPLES=2000 pytest tests/core/test_robustness.py -k fuzz``.
"""

import math
import os

import numpy as np
import pytest

from commlib import validation
from commlib.compression import Compression, DGC, ErrorFeedback, Momentum, TopK
from commlib.coordinator.requests import Handle
from mpirun import run_mpi

STALLS_FAIL = {"COMMLIB_STALL_CHECK_TIME": "2", "COMMLIB_STALL_SHUTDOWN_TIME": "4"}  # a mismatch fails, never hangs


def test_argument_type_rules():
    assert validation.check_name(None, "allreduce") is None and validation.check_name("w", "allreduce") == "w"
    with pytest.raises(TypeError, match=r"allreduce: name must be a string .* not float 3.5"):
        validation.check_name(3.5, "allreduce")
    assert validation.check_scale_factor(2, "prescale_factor", "w") == 2.0
    assert validation.check_scale_factor(np.float32(0.5), "prescale_factor", "w") == 0.5
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match="w: postscale_factor must be finite"):
            validation.check_scale_factor(bad, "postscale_factor", "w")
    for bad in ("2", None, [2.0], np.ones(1), 1j):
        with pytest.raises(TypeError, match="prescale_factor must be a real number"):
            validation.check_scale_factor(bad, "prescale_factor", "w")
    assert validation.check_rank_argument(np.int64(1), "root_rank", "w") == 1
    for bad in (0.0, "0", True, None):
        with pytest.raises(TypeError, match="root_rank must be an integer rank"):
            validation.check_rank_argument(bad, "root_rank", "w")
    handle = Handle("w")
    assert validation.check_handle(handle, "poll") is handle
    with pytest.raises(TypeError, match=r"synchronize\(\) takes a handle .* not int 12345"):
        validation.check_handle(12345, "synchronize")
    assert validation.check_splits([1, 2], "w").tolist() == [1, 2] and validation.check_splits(None, "w") is None
    for bad in ([1.5, 2.5], "ab", 3, [[1, 2], [3]]):
        with pytest.raises(TypeError, match="splits"):
            validation.check_splits(bad, "w")
    assert validation.check_tensor_list((np.ones(1) for _ in range(2)), "g")[0].shape == (1,)
    with pytest.raises(TypeError, match=r"pass \[tensor\] for one"):
        validation.check_tensor_list(np.ones(3), "g")
    assert "broadcast_object" in validation.movable(np.dtype(object), "w") and not validation.movable(np.dtype("f4"), "w")


def test_compressor_settings_are_checked():
    for build, kind, fragment in [(lambda: Compression.topk("x"), TypeError, "topk: ratio must be a number"),
                                  (lambda: Compression.topk(math.nan), ValueError, "topk: ratio must be finite"),
                                  (lambda: Compression.dgc(momentum=1.0), ValueError, r"momentum must be in \[0.0, 1.0\)"),
                                  (lambda: Compression.dgc(clip_norm=math.nan), ValueError, "clip_norm must be finite"),
                                  (lambda: Compression.dgc(sparsity=5), TypeError, "sparsity must be a list"),
                                  (lambda: Compression.powersgd(rank=1.5), TypeError, "rank must be an integer"),
                                  (lambda: Compression.onebit(min_elements=None), TypeError, "min_elements"),
                                  (lambda: Compression.momentum(TopK(0.1), math.nan), ValueError, "mu must be finite")]:
        with pytest.raises(kind, match=fragment):
            build()


@pytest.mark.mpi
def test_bad_arguments_fail_on_the_calling_rank_and_commlib_keeps_working():
    run_mpi(2, "bad_arguments.py", env=STALLS_FAIL, timeout=120)


@pytest.mark.mpi
def test_fuzz_public_entry_points():
    examples = os.environ.get("FUZZ_EXAMPLES", "150")
    run_mpi(2, "fuzz_api.py", examples, env=STALLS_FAIL, timeout=max(240, 2 * int(examples)))


def test_the_compressor_says_whether_it_applies_momentum():
    assert DGC().applies_momentum and Momentum(TopK(0.1)).applies_momentum
    assert ErrorFeedback(Momentum(TopK(0.1))).applies_momentum  # a wrapper inherits it
    assert not Compression.topk(0.1).applies_momentum and not Compression.powersgd().applies_momentum
    assert not getattr(Compression.fp16, "applies_momentum", False)


def test_momentum_twice_is_refused_at_construction():
    torch = pytest.importorskip("torch")
    import commlib.torch as hvd

    model = torch.nn.Linear(4, 2)

    def wrap(optimizer, compression):
        return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                        compression=compression)

    with pytest.raises(ValueError, match=r"applies momentum itself.*momentum=0.9.*set momentum=0"):
        wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), Compression.dgc())
    with pytest.raises(ValueError, match=r"betas\[0\]=0.9"):
        wrap(torch.optim.Adam(model.parameters()), Compression.dgc())
    with pytest.raises(ValueError, match="applies momentum itself"):
        wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
             Compression.error_feedback(Compression.momentum(Compression.topk(0.1, error_feedback=False))))
    wrap(torch.optim.SGD(model.parameters(), lr=0.1), Compression.dgc())  # DGC's momentum alone: fine
    wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), Compression.topk(0.1))
    with pytest.raises(ValueError, match="gradient_predivide_factor must be finite"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), gradient_predivide_factor=math.nan)
