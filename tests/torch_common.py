"""Helpers shared by the torch workers: expected errors, comparisons across ranks, shutdown."""

from __future__ import annotations

import numpy as np
import torch


def expect_error(exc_type, fn, *needles):
    """Call ``fn``; it must raise ``exc_type`` whose message contains every string in ``needles``."""
    try:
        fn()
    except exc_type as exc:
        message = str(exc)
        for needle in needles:
            assert needle in message, f"error message {message!r} lacks {needle!r}"
        return exc
    raise AssertionError(f"expected {exc_type.__name__} from {fn}, nothing was raised")


def assert_same_on_all_ranks(hvd, tensors, what: str) -> None:
    """Every rank holds bit-identical ``tensors`` (a list)."""
    mine = [t.detach().cpu().contiguous().view(-1).numpy().tobytes() for t in tensors]
    everyone = hvd.allgather_object(mine)
    for r, theirs in enumerate(everyone):
        for i, (a, b) in enumerate(zip(mine, theirs)):
            assert a == b, f"{what}: tensor {i} differs between rank {hvd.rank()} and rank {r}"


def close(actual, expected, what: str, rtol=1e-6, atol=1e-6) -> None:
    actual = actual.detach().double().numpy() if isinstance(actual, torch.Tensor) else np.asarray(actual)
    expected = expected.detach().double().numpy() if isinstance(expected, torch.Tensor) else np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != expected {expected.shape}"
    if not np.allclose(actual, expected, rtol=rtol, atol=atol):
        diff = np.abs(actual - expected).max()
        raise AssertionError(f"{what}: max abs difference {diff} (rtol {rtol}, atol {atol})\n"
                             f"actual {actual.ravel()[:8]}\nexpected {expected.ravel()[:8]}")
