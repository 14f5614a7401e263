"""The torch.distributed backend ``commlib`` against gloo and against references, call by call.

``workers/torch_backend_ops.py`` runs every c10d call (all_reduce with every ReduceOp and dtype, broadcast,
all_gather in both forms and coalesced, reduce_scatter in both forms, all_to_all in both forms with uneven splits, reduce,
gather, scatter, barrier, send/recv, isend/irecv, batch_isend_irecv, recv from any source, the object
collectives, subgroups) at sizes 0, 1, fewer than the ranks, not divisible and 1000, once on commlib and once
on gloo, each rank checking every result against a reference it computes. Here: commlib must match its
reference in every case, except where it refuses a call that gloo refuses too (bitwise ops on floats, an
average of bools), and must give gloo's values wherever gloo has them.
"""

from __future__ import annotations

import pytest
import torch

from mpirun import run_mpi, run_on_cluster
from torch_jobs import CLUSTER_ENV

WORKER = "torch_backend_ops.py"


def _load(prefix: str, ranks: int) -> list[dict]:
    return [torch.load(f"{prefix}.{r}.pt", weights_only=False) for r in range(ranks)]


def _equal(a, b) -> bool:
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.is_floating_point or a.dtype.is_complex:
            wide = torch.complex128 if a.dtype.is_complex else torch.float64
            tol = 2e-2 if a.dtype in (torch.float16, torch.bfloat16) else 1e-6
            return torch.allclose(a.to(wide), b.to(wide), rtol=tol, atol=tol)
        return torch.equal(a, b)
    return a == b


def compare(commlib: list[dict], gloo: list[dict]) -> list[str]:
    """Every disagreement between commlib's results, their references and gloo's, one line each."""
    problems = []
    for rank, (ours, theirs) in enumerate(zip(commlib, gloo)):
        assert ours.keys() == theirs.keys(), "the two runs ran different cases"
        for name, mine in ours.items():
            other = theirs[name]
            if not mine["ok"]:
                refused_by_both = mine["error"] is not None and other["error"] is not None
                if not refused_by_both:
                    problems.append(f"rank {rank} {name}: commlib {mine['error'] or mine['why']} "
                                    f"(gloo: {'ok' if other['ok'] else other['error'] or other['why']})")
            elif other["ok"] and not _equal(mine["value"], other["value"]):
                problems.append(f"rank {rank} {name}: commlib and gloo differ: {mine['value']!r:.200} against "
                                f"{other['value']!r:.200}")
    return problems


def _run_both(tmp_path, ranks: int, run) -> None:
    for backend in ("commlib", "gloo"):
        run(backend, str(tmp_path / backend))  # every rank ran every kind of call (the report says so)
    problems = compare(_load(str(tmp_path / "commlib"), ranks), _load(str(tmp_path / "gloo"), ranks))
    assert not problems, f"{len(problems)} case(s):\n" + "\n".join(problems[:40])


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, pytest.param(3, marks=pytest.mark.full)])
def test_every_call_matches_gloo(tmp_path, ranks):
    _run_both(tmp_path, ranks, lambda backend, out: run_mpi(ranks, WORKER, backend, out, timeout=300))


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 4])
def test_every_call_matches_gloo_one_and_four_ranks(tmp_path, ranks):
    _run_both(tmp_path, ranks, lambda backend, out: run_mpi(ranks, WORKER, backend, out, timeout=400))


@pytest.mark.cluster
@pytest.mark.slow
def test_every_call_matches_gloo_across_hosts(tmp_path, make_cluster):
    """2 emulated hosts x 2 ranks: commlib's cross-host algorithms, and the MPI rendezvous of env:// (rank 0
    hosts the store on its host's address) for both backends."""
    cluster = make_cluster([2, 2])
    _run_both(tmp_path, 4, lambda backend, out: run_on_cluster(cluster, WORKER, backend, out, timeout=400,
                                                               env=CLUSTER_ENV))


def test_compare_reports_disagreements():
    """The comparison itself: a commlib failure gloo does not share, and a value that differs, are reported;
    a call both refuse is not."""
    ok = {"value": torch.ones(2), "error": None, "ok": True, "why": ""}
    refused = {"value": None, "error": "TypeError: no", "ok": False, "why": ""}
    wrong = {"value": torch.zeros(2), "error": None, "ok": False, "why": "expected ones"}
    other = {"value": torch.full((2,), 2.0), "error": None, "ok": True, "why": ""}
    assert compare([{"a": refused}], [{"a": refused}]) == []
    assert len(compare([{"a": wrong}], [{"a": ok}])) == 1
    assert len(compare([{"a": refused}], [{"a": ok}])) == 1
    assert len(compare([{"a": ok}], [{"a": other}])) == 1
    assert compare([{"a": ok}], [{"a": dict(ok)}]) == []
