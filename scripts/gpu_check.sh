#!/usr/bin/env bash
# commlib's GPU checks, for a machine with an NVIDIA GPU, CuPy, torch (CUDA) and mpi4py (on a machine
# without an MPI library, docs/gpu.md says how to carry the mpich wheel there). Never run in CI.
#
#   bash scripts/gpu_check.sh [OUTDIR] [tests|bench|all]   (default $OUT, else /tmp/commlib-gpu-check; all)
#
# Writes OUTDIR/env.txt, tests.log (the GPU tests on 1, 2 and 3 ranks sharing the GPU, the NCCL test on
# 1 rank, the torch CUDA DistributedOptimizer equivalence), casting.txt and staged_{2,3}.txt (benchmarks).
# Exits non-zero when a test fails.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-/tmp/commlib-gpu-check}}"
what="${2:-all}"
mkdir -p "$out"
py="${PYTHON:-python3}"

# MPI: the carried mpich wheel (and any other carried wheels) where no mpiexec is installed.
if ! command -v mpiexec >/dev/null 2>&1 && ls .whl/*.whl >/dev/null 2>&1; then
    # --prefix, not --target: the mpich wheel puts mpiexec in PREFIX/bin and libmpi in PREFIX/lib.
    prefix=/tmp/commlib-wheels
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --prefix "$prefix" .whl/*.whl \
        || { echo "installing the carried wheels failed" >&2; exit 2; }
    site=$("$py" -c "import sysconfig; print(sysconfig.get_path('purelib', vars={'base': '$prefix', 'platbase': '$prefix'}))")
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PATH="$prefix/bin:$PATH" \
           LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
command -v mpiexec >/dev/null 2>&1 || { echo "no mpiexec: carry the mpich wheel in .whl/ (docs/gpu.md)" >&2; exit 2; }

# commlib's C extensions, built in place for this Python (nothing is fetched: no build isolation).
"$py" setup.py -q build_ext --inplace >"$out/build.log" 2>&1 || { cat "$out/build.log" >&2; exit 2; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

{
    nvidia-smi -L
    "$py" - <<'EOF'
import cupy, mpi4py, torch
from mpi4py import MPI
import commlib
print("python", __import__("sys").version.split()[0], "cupy", cupy.__version__, "torch", torch.__version__,
      "mpi4py", mpi4py.__version__, "MPI", MPI.Get_library_version().splitlines()[0])
print("commlib.cuda_built()", commlib.cuda_built(), "commlib.nccl_built()", commlib.nccl_built(),
      "torch.cuda", torch.cuda.is_available(), "GPUs", cupy.cuda.runtime.getDeviceCount())
EOF
} 2>&1 | tee "$out/env.txt"

status=0
if [ "$what" != bench ]; then
    "$py" -m pytest -v -rs -p no:cacheprovider tests/transport/test_gpu_device.py tests/transport/test_gpu_host.py 2>&1 | tee "$out/tests.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ "$what" != tests ]; then
    "$py" scripts/bench_gpu.py casting 2>&1 | tee "$out/casting.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    for n in 2 3; do
        mpiexec -n "$n" "$py" scripts/bench_gpu.py staged 2>&1 | tee "$out/staged_$n.txt"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    done
fi
exit $status
