#!/usr/bin/env bash
# Every commlib.jax test, on 1, 2 and 3 ranks (CI runs a representative subset of tests/jax/test_jax.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh test
JAX_TESTS=all exec .venv/bin/python -m pytest -q tests/jax/test_jax.py "$@"
