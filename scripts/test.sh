#!/usr/bin/env bash
# The whole test suite (real MPI processes on 1-4 ranks, each job under a timeout).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh test
exec .venv/bin/python -m pytest -q tests "$@"
