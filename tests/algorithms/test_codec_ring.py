"""The ring allreduce with wire codecs against a bit-exact simulation of the documented rule, on 1-4 ranks:
scaling folded into the codec passes (prescale/postscale, the Engine's fp16 pre-divide), the finishing
loop of the ring, and uneven segment counts (see workers/codec_ring_check.py); on 4 ranks also as 2 nodes
of 2 (COMMLIB_LOCAL_SIZE), where the hierarchical algorithms cross nodes."""

import pytest

from mpirun import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nprocs,local_size", [(1, None), (2, None), (3, None),
                                               pytest.param(4, None, marks=pytest.mark.slow), (4, 2)])
def test_codec_ring_matches_the_rule_bit_for_bit(nprocs, local_size):
    env = {"COMMLIB_LOCAL_SIZE": str(local_size)} if local_size else None
    run_mpi(nprocs, "codec_ring_check.py", timeout=300, env=env)
