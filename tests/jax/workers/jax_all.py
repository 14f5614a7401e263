"""Both commlib.jax workers in one job (one JAX import, one init): for the emulated cluster."""

from __future__ import annotations

import commlib.jax as cj
import jax_collectives
import jax_optimizer
from spmd import run


def main():
    cj.init()
    r, n = cj.rank(), cj.size()
    for check in jax_collectives.CHECKS:
        check(r, n)
    xs, ys = jax_optimizer.make_data(n)
    jax_optimizer.check_equivalence(r, n, xs, ys)
    jax_optimizer.check_compression(r, n, xs, ys)
    cj.shutdown()
    print(f"[rank {r}] jax_all OK", flush=True)


if __name__ == "__main__":
    run(main)
