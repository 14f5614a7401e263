#!/usr/bin/env bash
# The whole test suite (real MPI processes on 1-4 ranks, each job under a timeout). Arguments go to pytest:
# e.g. -m "not mpi and not cluster" for the in-process tests alone (docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh test
exec .venv/bin/python -m pytest -q tests "$@"
