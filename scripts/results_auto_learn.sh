#!/bin/bash
# The measurements behind docs/algorithms.md's "How auto learns": commlib-bench --algo all without a tuning
# profile (COMMLIB_TUNING_FILE=none) or anything earlier jobs kept (COMMLIB_AUTO_CACHE=none), 4 KiB-64 MiB.
# Per size auto runs 19 untimed calls (--auto-warmup), in which it explores and settles, and the checked
# call: its timed calls are what it runs after 20 calls. The
# other algorithms warm up with 2 calls. Then every algorithm, auto among them, takes turns in interleaved
# rounds of the same few calls (the order rotating each round), as many rounds as make about --min-time
# seconds per algorithm (at most 400): short calls get 400 rounds, whose median no noisy round moves - so
# the same algorithm under two names cannot differ by much; long ones keep -n in --rounds. Per size, auto
# against the fastest algorithm and against MPI's own (scripts/auto_vs_fastest.py). Outputs (command in
# their first line) go to docs/results/.
# Needs root for the emulated hosts; run from the repository root with the venv of scripts/venv.sh:
#     flock /tmp/commlib-timing.lock bash scripts/results_auto_learn.sh [1host] [2x1] [2x2]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$PWD/.venv/bin/python
BENCH=$PWD/.venv/bin/commlib-bench
OUT=docs/results
export COMMLIB_TUNING_FILE=none
export COMMLIB_AUTO_CACHE=none  # learn from scratch: what earlier jobs of the layout kept would skip it
which=${*:-1host 2x1}

run() {  # run <name> <command...>: the command line, then its output and the summary, into $OUT/<name>.txt
    local name=$1; shift
    { echo "\$ COMMLIB_TUNING_FILE=none COMMLIB_AUTO_CACHE=none $*"
      echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD), $(nproc) cores shared with other work (load average $(cut -d' ' -f1 /proc/loadavg) at the start)"
    } > "$OUT/$name.txt"
    "$@" 2>&1 | grep -v "UCX  WARN" >> "$OUT/$name.txt"
    { echo "#"; echo "# scripts/auto_vs_fastest.py $OUT/$name.json:"
      "$PY" scripts/auto_vs_fastest.py "$OUT/$name.json" | sed 's/^/# /'; } >> "$OUT/$name.txt"
    echo "== $name"; tail -12 "$OUT/$name.txt"
}

for layout in $which; do
  case $layout in
    1host) run auto_learn_1host_2ranks .venv/bin/mpiexec -n 2 "$BENCH" --explain --algo all -b 4K -e 64M -f 4 \
             -w 2 --auto-warmup 19 -n 20 --rounds 5 --min-time 0.2 --json "$OUT/auto_learn_1host_2ranks.json" ;;
    2x1)   run auto_learn_2x1_1gbit "$PY" -m commlib.testing.cluster run --hosts 1,1 --rate 1gbit --timeout 1500 -- \
             "$BENCH" --explain --algo all -b 4K -e 64M -f 4 -w 2 --auto-warmup 19 -n 8 --rounds 4 --min-time 2 \
             --link-rate 1gbit --json "$OUT/auto_learn_2x1_1gbit.json" ;;
    2x2)   run auto_learn_2x2_1gbit "$PY" -m commlib.testing.cluster run --hosts 2,2 --rate 1gbit --timeout 1500 -- \
             "$BENCH" --explain --algo all -b 4K -e 64M -f 4 -w 2 --auto-warmup 19 -n 8 --rounds 4 --min-time 2 \
             --link-rate 1gbit --json "$OUT/auto_learn_2x2_1gbit.json" ;;
    *) echo "unknown layout $layout (1host, 2x1, 2x2)" >&2; exit 2 ;;
  esac
done
