"""Both commlib.jax workers in one job (one JAX import, one init): for the emulated cluster."""

from __future__ import annotations

import commlib.jax as cj
import spmd
from spmd import import_worker

collectives, optimizer = import_worker("jax_collectives"), import_worker("jax_optimizer")


@spmd.case
def init():
    cj.init()
    optimizer.DATA[:] = optimizer.make_data(cj.size())


spmd.rank_cases(lambda: (cj.rank(), cj.size()), *collectives.CHECKS,
                *map(optimizer.with_data, (optimizer.check_equivalence, optimizer.check_compression)))


@spmd.case
def shutdown():
    cj.shutdown()


if __name__ == "__main__":
    spmd.main()
