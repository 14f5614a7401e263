#!/usr/bin/env bash
# Create (or reuse) .venv at the repository root and install commlib with what the given purpose needs.
#   bash scripts/venv.sh main   -> commlib + the embedded MPICH + matplotlib + torch (CPU) + scikit-learn
#   bash scripts/venv.sh test   -> the same plus pytest, JAX (CPU) with optax, TensorFlow (CPU), Keras 3 and tf-keras,
#                                  Ray (with Ray Train), and (scripts/cluster_deps.sh) Debian's Slurm and munge
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
pins=("torch==2.13.0")
if [ "$purpose" = "test" ]; then
    # TensorFlow is pinned as torch is (the CPU wheel, 2.21 with its tf-keras); about 3 minutes and 1.5 GB
    extras="$extras,test,jax,tensorflow,keras,ray"
    pins+=("tensorflow-cpu==2.21.0" "tf-keras==2.21.0" "keras==3.15.1" "ray[train]==2.60.0")
    bash scripts/cluster_deps.sh
fi
"$py" -m pip install -q --disable-pip-version-check -e ".[$extras]" "${pins[@]}" scikit-learn
