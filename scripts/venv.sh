#!/usr/bin/env bash
# Create (or reuse) .venv at the repository root and install commlib with what the given purpose needs.
#   bash scripts/venv.sh main   -> commlib + the embedded MPICH + matplotlib + torch (CPU) + scikit-learn
#   bash scripts/venv.sh test   -> the same plus pytest and JAX (CPU) with optax
# A cluster's own MPI: create the venv yourself and `pip install -e .` without the [mpich] extra.
set -euo pipefail
cd "$(dirname "$0")/.."
purpose="${1:-main}"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
py=.venv/bin/python
# torch is pinned: an unpinned torch pulls a multi-GB CUDA build; 2.13.0 is a CPU build.
extras="mpich,bench"
[ "$purpose" = "test" ] && extras="$extras,test,jax"
"$py" -m pip install -q --disable-pip-version-check -e ".[$extras]" "torch==2.13.0" scikit-learn
