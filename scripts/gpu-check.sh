#!/usr/bin/env bash
# GPU checks (issue 7): configure and build with CUDA into $BUILD (default build-gpu/), then
#   1. ctest -L gpu: CUDA kernels vs their CPU twins in fp32 / fp16 / bf16, the TA-MoE loss, and
#      the executor's GPU path on one GPU (exec_gpu_np1: --check at r = 1, 2, 4, fp32 vs host);
#   2. kernels_bench three times (encode / decode GB/s and % of HBM at S = 16,384, M = 4,096 in
#      fp16 / bf16, expert GEMMs vs a plain cuBLAS GEMM of the shape; quote the medians);
#   3. exec_overhead_bench on the host path and on the GPU path (per-op overhead, empty ops);
#   4. mpirun -np 1 moesim exec scenarios/exec-gpu-1.yaml --backend nccl --check (fp16, single
#      GPU, pipeline r = 1, 2, 4) with its JSON;
#   5. when the build has them: moesim calibrate --out $OUT/calib.yaml, then moesim exec
#      --predict on exec-gpu-1 with cluster.calibration set to that file.
# Every log goes to $OUT (default: ./gpu-check-out) with a summary.txt. Meant for a machine with
# an NVIDIA GPU (e.g. through the device tool on an H200); without one the tests skip, the
# benchmarks fall back to the CPU (or say there is no device) and the GPU-only steps are marked
# "skipped", so the script still runs end to end.
#
#   OUT=/some/dir scripts/gpu-check.sh [--arch 90] [--jobs N] [--bench-args "..."] [--no-build]
#
# --arch sets CMAKE_CUDA_ARCHITECTURES (default 90 = Hopper/H200, to keep the build short; the
# project default is "80;90"). Exit status: 0 when the build and every gpu test passed, 1 otherwise
# (all steps run regardless; see $OUT/summary.txt).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${OUT:-$here/gpu-check-out}
arch=90
jobs=$(nproc 2>/dev/null || echo 4)
bench_args=""
build_it=1
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --bench-args) bench_args=$2; shift 2 ;;
    --no-build) build_it=0; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "gpu-check.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
build=${BUILD:-$here/build-gpu}
summary="$out/summary.txt"
: > "$summary"
status=0

note() { echo "$*" | tee -a "$summary"; }

# Step helper: run a command with its output in $out/<log>, record ok / FAILED in the summary.
step() {
  local name=$1 log=$2
  shift 2
  local t0=$SECONDS
  if "$@" > "$out/$log" 2>&1; then
    note "ok      $name ($((SECONDS - t0)) s, $log)"
  else
    note "FAILED  $name ($((SECONDS - t0)) s, $log)"
    status=1
    return 1
  fi
}

{ nvidia-smi || echo "nvidia-smi not available"; nvcc --version || true; } > "$out/device.txt" 2>&1
note "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null)"

skipped() { note "skipped $*"; }

if [ "$build_it" = 1 ]; then
  step configure configure.log cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DMOESIM_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" || { cat "$summary"; exit 1; }
  step build build.log cmake --build "$build" -j "$jobs" || { tail -40 "$out/build.log"; cat "$summary"; exit 1; }
fi

# A device is visible when nvidia-smi lists one (the tests decide for themselves as well).
have_gpu=0
if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then have_gpu=1; fi
note "device  $([ $have_gpu = 1 ] && nvidia-smi -L | head -1 || echo 'none visible: GPU steps skip')"

# mpirun as root needs these two (containers); harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export MOESIM_EXEC_TIMEOUT_S=${MOESIM_EXEC_TIMEOUT_S:-300}
mpirun_1="mpirun -np 1 --oversubscribe"

step "ctest -L gpu" ctest-gpu.log ctest --test-dir "$build" -L gpu --output-on-failure \
  --timeout 600
# Skipped tests mean no device was visible: worth a line in the summary, not a failure.
if grep -q "Skipped\|SKIPPED" "$out/ctest-gpu.log" 2>/dev/null; then
  note "note    some gpu tests were skipped (no device visible?): see ctest-gpu.log"
fi

for i in 1 2 3; do
  # shellcheck disable=SC2086
  step "kernels_bench run $i" "kernels_bench.$i.log" "$build/bench/kernels_bench" $bench_args
done

if [ -x "$build/bench/exec_overhead_bench" ]; then
  step "exec_overhead_bench host path" exec_overhead_host.log \
    $mpirun_1 "$build/bench/exec_overhead_bench" --backend mpi --reps 5
  if [ $have_gpu = 1 ]; then
    step "exec_overhead_bench GPU path" exec_overhead_gpu.log \
      $mpirun_1 "$build/bench/exec_overhead_bench" --backend nccl --reps 5
  else
    skipped "exec_overhead_bench GPU path (no device)"
  fi
else
  skipped "exec_overhead_bench (not built: needs MPI)"
fi

moesim="$build/moesim"
scenario="$here/scenarios/exec-gpu-1.yaml"
if [ $have_gpu = 1 ]; then
  step "moesim exec exec-gpu-1 --backend nccl --check" exec-gpu-1.log \
    $mpirun_1 "$moesim" exec "$scenario" --backend nccl --check --json "$out/exec-gpu-1.json"
else
  skipped "moesim exec exec-gpu-1 --backend nccl --check (no device)"
fi

# Calibration and prediction, when this build has them (another part of issue 7).
if "$moesim" --help 2>/dev/null | grep -q calibrate; then
  if [ $have_gpu = 1 ]; then
    step "moesim calibrate" calibrate.log \
      $mpirun_1 "$moesim" calibrate "$scenario" --backend nccl --out "$out/calib.yaml"
    if [ -f "$out/calib.yaml" ] && "$moesim" exec --help 2>/dev/null | grep -q -- --predict; then
      # The scenario with cluster.calibration pointing at the fresh calibration.
      sed "s|^cluster:|cluster:\n  calibration: $out/calib.yaml|" "$scenario" \
        > "$out/exec-gpu-1-calibrated.yaml"
      step "moesim exec --predict" predict.log \
        $mpirun_1 "$moesim" exec "$out/exec-gpu-1-calibrated.yaml" --backend nccl --predict \
        --json "$out/predict.json"
    else
      skipped "moesim exec --predict (no calib.yaml or no --predict flag)"
    fi
  else
    skipped "moesim calibrate / --predict (no device)"
  fi
else
  skipped "moesim calibrate (not in this build)"
fi

cat "$summary"
exit $status
