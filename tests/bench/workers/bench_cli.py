"""The commlib-bench console script, launched by tests/bench/test_bench.py under mpiexec."""

import sys

from commlib.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
