"""Unchanged DDP and FSDP2 training on the ``commlib`` backend ends with gloo's parameters.

``workers/torch_train.py`` trains a small model from a seeded start on per-rank data: DDP with its default
``init_sync`` (every rank starts from a different seed, so the broadcast from rank 0 matters) and several
buckets, ``no_sync`` accumulation, ``find_unused_parameters`` with a branch skipped every other step,
``static_graph``, ``gradient_as_bucket_view``; FSDP2 (``fully_shard`` per layer on a DeviceMesh); and on an
even number of ranks a 2-D DeviceMesh. Run once per backend; the parameters must agree (fp32 sums of a few
ranks: commlib's algorithms may add in another order than gloo's, hence a tolerance of 1e-6).
"""

from __future__ import annotations

import pytest
import torch

from mpirun import run_mpi, run_on_cluster
from torch_jobs import CLUSTER_ENV

WORKER = "torch_train.py"
VARIANTS = ["ddp", "no_sync", "unused", "static_graph", "bucket_view", "fsdp2", "mesh2d"]


def _cases(ranks: int) -> list[str]:
    """The cases that must pass on every rank (a 2-D mesh needs an even number of ranks)."""
    return ["init", *(v for v in VARIANTS if v != "mesh2d" or ranks % 2 == 0), "save", "shutdown"]


def _check(tmp_path, ranks: int, run) -> None:
    for backend in ("commlib", "gloo"):
        run(backend, str(tmp_path / backend))
    for rank in range(ranks):
        ours = torch.load(tmp_path / f"commlib.{rank}.pt")
        theirs = torch.load(tmp_path / f"gloo.{rank}.pt")
        assert ours.keys() == theirs.keys()
        for variant in ours:
            for name, tensor in ours[variant].items():
                assert torch.allclose(tensor, theirs[variant][name], rtol=1e-6, atol=1e-6), (
                    f"rank {rank} {variant} {name}: commlib and gloo differ by "
                    f"{(tensor - theirs[variant][name]).abs().max().item()}")
        if rank:  # DDP keeps every rank's replica equal
            first = torch.load(tmp_path / "commlib.0.pt")
            for variant in ("ddp", "no_sync", "unused", "static_graph", "bucket_view"):
                for name, tensor in ours[variant].items():
                    assert torch.equal(tensor, first[variant][name]), f"{variant} {name}: rank {rank} != rank 0"


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, pytest.param(3, marks=pytest.mark.full)])
def test_ddp_and_fsdp2_match_gloo(tmp_path, ranks):
    _check(tmp_path, ranks, lambda backend, out: run_mpi(ranks, WORKER, backend, out, *VARIANTS, timeout=300,
                                                         cases=_cases(ranks)))


@pytest.mark.cluster
@pytest.mark.slow
def test_ddp_and_fsdp2_match_gloo_across_hosts(tmp_path, make_cluster):
    cluster = make_cluster([2, 2])
    _check(tmp_path, 4, lambda backend, out: run_on_cluster(cluster, WORKER, backend, out, *VARIANTS, timeout=400,
                                                            env=CLUSTER_ENV, cases=_cases(4)))
