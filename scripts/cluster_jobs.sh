#!/usr/bin/env bash
# Every test on real Slurm and Ray daemons on emulated hosts, the longer scenarios included that CI leaves out
# (an elastic job losing a node or a worker actor, a node Ray adds, the link of a Slurm node cut), printing
# the measured time to resume ("RESUME ..." lines). Needs root, Debian's slurmctld/slurmd/munge and Ray
# (bash scripts/venv.sh test installs them). About 20 minutes on a 2-core machine. Writes the outcome with
# the commit, date and arguments to docs/results/cluster_jobs.txt (with --record; each run adds its block).
#   bash scripts/cluster_jobs.sh [--record] [pytest options]
set -uo pipefail
cd "$(dirname "$0")/.."
record=0
if [ "${1:-}" = "--record" ]; then record=1; shift; fi
export CLUSTER_JOBS=all
log=$(mktemp)
trap 'rm -f "$log"' EXIT
started=$(date -u +"%Y-%m-%d %H:%M UTC")
.venv/bin/python -m pytest -q -s -rfs tests/run/test_slurm_launch.py tests/run/test_slurm_jobs.py \
    tests/ray/test_ray_executor.py tests/elastic/test_slurm_elastic.py tests/elastic/test_ray_elastic.py "$@" \
    2>&1 | tee "$log"
code=${PIPESTATUS[0]}
if [ "$record" = 1 ]; then
    {
        echo
        echo "# bash scripts/cluster_jobs.sh --record $*"
        echo "# commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- commlib tests examples || echo ' (with uncommitted changes)'), started $started"
        echo "# machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end; $(slurmctld -V 2>/dev/null); ray $(.venv/bin/python -c 'import ray; print(ray.__version__)')"
        echo "# time to resume: from the loss to the survivors' first completed step (COMMLIB_TIMEOUT 10 s, the driver's default)"
        grep -oE "RESUME .*|^(FAILED|SKIPPED) .*|^[0-9]+ (passed|failed).*" "$log"
    } >> docs/results/cluster_jobs.txt
fi
exit "$code"
