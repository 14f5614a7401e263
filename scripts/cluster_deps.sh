#!/usr/bin/env bash
# What the tests on real Slurm daemons need beyond the venv: Debian's slurmctld, slurmd, slurm-client and
# munge (commlib.testing.slurm). Installed with apt-get when missing and this runs as root; otherwise it
# says what is missing and the Slurm tests skip naming it. Ray comes with the venv (the [ray] extra).
set -uo pipefail
missing=()
for tool in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool##*:}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "scripts/cluster_deps.sh: missing ${missing[*]} (install them with apt-get as root); the Slurm tests will skip" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
        || echo "scripts/cluster_deps.sh: apt-get could not install ${missing[*]}; the Slurm tests will skip" >&2
fi
exit 0
