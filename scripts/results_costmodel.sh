#!/bin/bash
# The measurements behind docs/algorithms.md's "Measurements across hosts": one run each, outputs (with the
# command in their first line) written to docs/results/. Needs root for the emulated cluster
# (commlib.testing.cluster); run from the repository root with the venv of scripts/venv.sh:
#     flock /work/wt/bench.lock bash scripts/results_costmodel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$PWD/.venv/bin/python
BENCH=$PWD/.venv/bin/commlib-bench
OUT=docs/results
CLUSTER=("$PY" -m commlib.testing.cluster run --hosts 2,2 --rate 1gbit --timeout 580 --)

run() {  # run <name> <command...>: the command line, then its output, into $OUT/<name>.txt
    local name=$1; shift
    echo "\$ $*" > "$OUT/$name.txt"
    "$@" 2>&1 | grep -v "UCX  WARN" >> "$OUT/$name.txt"
    echo "== $name"; grep -E "^ +[0-9]|auto/fastest|commlib / mpi|^#  +[0-9]" "$OUT/$name.txt" | tail -40 || true
}

# One host, 2 ranks: calibrate, then every algorithm with the fitted profile, predicted beside measured.
run auto_1host_2ranks .venv/bin/mpiexec -n 2 "$BENCH" --calibrate "$OUT/tuning_1host_2ranks.json" --explain \
    --algo all -b 4K -e 64M -f 4 -n 400 -w 5 --rounds 10 --json "$OUT/auto_1host_2ranks.json"

# 2 hosts x 2 ranks at 1 Gbit/s per host: the same; the small sizes with more calls per round (a round's
# time includes the ranks' skew leaving the barrier before it, which a few short calls do not amortise).
run auto_2x2_1gbit "${CLUSTER[@]}" "$BENCH" --calibrate "$OUT/tuning_2x2_1gbit.json" --explain --algo all \
    -b 4M -e 64M -f 4 -n 3 -w 1 --rounds 3 --link-rate 1gbit --json "$OUT/auto_2x2_1gbit.json"
run auto_2x2_1gbit_small "${CLUSTER[@]}" env COMMLIB_TUNING_FILE="$PWD/$OUT/tuning_2x2_1gbit.json" "$BENCH" \
    --explain --algo all -b 4K -e 1M -f 4 -n 100 -w 5 --rounds 5 --link-rate 1gbit \
    --json "$OUT/auto_2x2_1gbit_small.json"

# 64 MiB float32 against MPI's Allreduce and the link bound, then with fp16 on the wire.
PROFILE=(env COMMLIB_TUNING_FILE="$PWD/$OUT/tuning_2x2_1gbit.json")
run allreduce_64M_2x2_1gbit "${CLUSTER[@]}" "${PROFILE[@]}" "$BENCH" \
    --algo native,ring,hierarchical,hierarchical_pipelined,torus2d,auto -b 64M -n 5 -w 1 --rounds 5 \
    --link-rate 1gbit --json "$OUT/allreduce_64M_2x2_1gbit.json"
run allreduce_64M_2x2_1gbit_fp16 "${CLUSTER[@]}" "${PROFILE[@]}" "$BENCH" \
    --algo ring,hierarchical,hierarchical_pipelined,torus2d,auto -b 64M -n 5 -w 1 --rounds 5 \
    --compression fp16 --link-rate 1gbit --json "$OUT/allreduce_64M_2x2_1gbit_fp16.json"

# A named 4 KiB allreduce through commlib against MPI's own, interleaved.
run latency_4K_2x2_1gbit "${CLUSTER[@]}" "${PROFILE[@]}" "$PY" scripts/bench_latency.py --iters 150 --rounds 21 \
    --json "$OUT/latency_4K_2x2_1gbit.json"

# What the fitted model predicts at 16, 64 and 256 hosts (a prediction, by formula).
run predict_scale "$PY" scripts/predict_scale.py --profile "$OUT/tuning_2x2_1gbit.json" --hosts 2,16,64,256 \
    --per-host 2 --sizes 4K,1M,64M --link-rate 125e6
