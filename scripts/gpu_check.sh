#!/usr/bin/env bash
# commlib's GPU checks in one command, for a lent machine with an NVIDIA GPU, CuPy, torch (CUDA) and mpi4py
# (docs/gpu.md, "Running the GPU checks"). Never run in CI; on a machine without a GPU it still runs to its
# summary, with every GPU part skipped and the reason.
#
#   bash scripts/gpu_check.sh [OUTDIR]        (default $OUT, else /tmp/commlib-gpu-check)
#
# Parts, in this order, each under its own timeout and all within 470 s (a part that would start with too
# little time left is skipped, saying so); a failing part does not stop the others:
#   env       the machine, the libraries, commlib.cuda_built() / nccl_built()      env.txt
#   build     commlib's C extensions in place                                       build.log
#   gpu       the GPU tests on 1, 2 and 3 ranks sharing the GPU (NCCL on 1 rank)    gpu_tests.log
#   casting   the fused scale-and-cast kernel against CuPy's                        casting.txt
#   bench1/2  commlib-bench --device cuda on 1 and 2 ranks, 1 MiB - 64 MiB           bench_{1,2}.txt/.json
#   step      the 25.2M MLP step on 2 ranks: none / fp16 / DDP gloo / local          step.txt/.json
#   horovod   Horovod's test_torch.py on 1 rank (HOROVOD=checkout or test file; default .horovod/)
#   host      the device path's CPU tests (host streams, stand-in NCCL)             host_tests.log
# and summary.txt: one line per part (passed / failed / skipped, seconds, why). Exit status 1 when a part
# failed, else 0.
#
# MPI: the machine's mpiexec (Open MPI as root: the OMPI_ALLOW_RUN_AS_ROOT variables are set here), else the
# carried wheels in .whl/ (mpich; docs/gpu.md says how to carry it).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out="${1:-${OUT:-/tmp/commlib-gpu-check}}"
mkdir -p "$out"
py="${PYTHON:-python3}"
summary="$out/summary.txt"
: >"$summary"
failed=0
deadline=$(( $(date +%s) + ${GPU_CHECK_SECONDS:-470} ))
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"

note() {  # note PART STATUS SECONDS WHY
    printf '%-9s %-8s %6ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$summary"
}

part() {  # part NAME TIMEOUT LOG COMMAND...: run, time, record (within what is left of the budget)
    local name=$1 limit=$2 log=$3 start status left
    shift 3
    start=$(date +%s)
    left=$(( deadline - start ))
    if [ "$left" -lt 20 ]; then
        note "$name" skipped 0 "no time left of the ${GPU_CHECK_SECONDS:-470} s budget"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
    status=$?
    local took=$(( $(date +%s) - start ))
    if [ "$status" -eq 0 ]; then
        note "$name" passed "$took" "$(basename "$log")"
    elif [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
        note "$name" failed "$took" "timed out after ${limit}s ($(basename "$log"))"
        failed=1
    else
        note "$name" failed "$took" "exit $status: $(grep -m1 -E 'Error|FAILED|failed|error' "$log" | cut -c1-150)"
        failed=1
    fi
}

skip() {  # skip NAME WHY
    note "$1" skipped 0 "$2"
}

# MPI: the carried wheels (mpich, and any other) where the machine has no mpiexec
if ! command -v mpiexec >/dev/null 2>&1 && ls .whl/*.whl >/dev/null 2>&1; then
    prefix=/tmp/commlib-wheels  # --prefix: the mpich wheel puts mpiexec in PREFIX/bin, libmpi in PREFIX/lib
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --prefix "$prefix" .whl/*.whl \
        >"$out/wheels.log" 2>&1 || echo "installing the carried wheels failed (wheels.log)" >&2
    site=$("$py" -c "import sysconfig; print(sysconfig.get_path('purelib', vars={'base': '$prefix', 'platbase': '$prefix'}))")
    export PYTHONPATH="$site:$PYTHONPATH" PATH="$prefix/bin:$PATH" LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
mpi=$(command -v mpiexec || true)
[ -z "$mpi" ] && [ -x "$PWD/.venv/bin/mpiexec" ] && mpi="$PWD/.venv/bin/mpiexec" && py="$PWD/.venv/bin/python"

part env 30 "$out/env.txt" "$py" - <<'EOF'
import platform, subprocess, sys
print("python", sys.version.split()[0], platform.platform())
for name in ("numpy", "mpi4py", "cupy", "torch", "pytest"):
    try:
        module = __import__(name)
        print(name, getattr(module, "__version__", "?"))
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal
        print(name, "missing:", exc)
try:
    from mpi4py import MPI
    print("MPI", MPI.Get_library_version().splitlines()[0])
except Exception as exc:  # noqa: BLE001
    print("MPI missing:", exc)
try:
    print(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout.strip())
except Exception as exc:  # noqa: BLE001
    print("nvidia-smi:", exc)
import commlib
print("commlib.cuda_built()", commlib.cuda_built(), "commlib.nccl_built()", commlib.nccl_built())
EOF
cat "$out/env.txt"

part build 120 "$out/build.log" "$py" setup.py build_ext --inplace

if [ -z "$mpi" ]; then
    no_mpi="no mpiexec (carry the mpich wheel in .whl/: docs/gpu.md)"
fi
gpu_reason=$("$py" -c "
import commlib
from commlib.bench.device import why_not_here
print(why_not_here())" 2>&1 | tail -1)

gpu_test=tests/transport/test_gpu_device.py
[ -e "$gpu_test" ] || gpu_test=tests/test_gpu_device.py  # before the test tree moved
if [ -n "$gpu_reason" ]; then
    for name in gpu casting bench1 bench2 step horovod; do skip "$name" "no GPU here: $gpu_reason"; done
elif [ -n "${no_mpi:-}" ]; then
    for name in gpu casting bench1 bench2 step horovod; do skip "$name" "$no_mpi"; done
else
    part gpu 200 "$out/gpu_tests.log" "$py" -m pytest -v -rs -p no:cacheprovider "$gpu_test"
    part casting 40 "$out/casting.txt" "$py" scripts/bench_gpu.py casting --reps 10 --rounds 3
    for n in 1 2; do
        part "bench$n" 60 "$out/bench_$n.txt" "$mpi" -n "$n" "$py" -m commlib.bench --device cuda -b 1M -e 64M -f 4 \
            -n 20 -w 5 --explain --json "$out/bench_$n.json"
    done
    part step 90 "$out/step.txt" "$mpi" -n 2 "$py" scripts/bench_gpu_step.py --steps 10 --rounds 3 --json "$out/step.json"
    horovod="${HOROVOD:-.horovod}"
    if [ -e "$horovod" ]; then
        part horovod 180 "$out/horovod_test_torch.md" "$py" scripts/horovod_compat.py "$horovod" --np 1 \
            --timeout 60 --jobs 8 --output -
    else
        skip horovod "no Horovod test file at $horovod: set HOROVOD=a Horovod checkout (or its test/parallel/test_torch.py), e.g. carried in .horovod/"
    fi
fi

# the CPU tests of the device path: meaningful anywhere, quick
tests=(tests/coordinator/test_device_responses.py tests/transport/test_device_nccl.py tests/transport/test_device_streams.py)
if [ -n "${no_mpi:-}" ]; then
    skip host "$no_mpi"
else
    part host 150 "$out/host_tests.log" "$py" -m pytest -q -p no:cacheprovider "${tests[@]}"
fi

echo "--- summary ($out/summary.txt)"
cat "$summary"
exit "$failed"
