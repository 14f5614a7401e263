"""The ring allreduce with wire codecs against a bit-exact simulation of the documented rule, on 1-4 ranks:
scaling folded into the codec passes (prescale/postscale, the Engine's fp16 pre-divide), the finishing
loop of the ring, and uneven segment counts (see workers/codec_ring_check.py)."""

import pytest

from mpirun import run_mpi


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_codec_ring_matches_the_rule_bit_for_bit(nprocs):
    out = run_mpi(nprocs, "codec_ring_check.py", timeout=300)
    assert "codec_ring_check ok" in out and f"on {nprocs} ranks" in out, out[-2000:]
