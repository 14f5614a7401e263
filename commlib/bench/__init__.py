"""commlib-bench: bandwidth and correctness of commlib's collectives, in the manner of nccl-tests.

Run ``mpiexec -n 2 commlib-bench -b 4K -e 64M --algo all``; see docs/benchmark.md.
"""

from .cli import main

__all__ = ["main"]
