#!/usr/bin/env bash
# The main job: the topology benchmark on 2 ranks of the embedded MPICH (every algorithm beside MPI's own
# Allreduce), then the example training script with DistributedOptimizer on 2 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh main
.venv/bin/mpiexec -n 2 .venv/bin/commlib-bench -b 4K -e 64M -f 4 -n 20 -w 5 --algo all
.venv/bin/mpiexec -n 2 .venv/bin/python examples/train_digits.py
