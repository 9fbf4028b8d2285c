#!/usr/bin/env bash
# GPU checks (issue 7 item 7): configure and build with CUDA into build-gpu/, run the tests
# labelled `gpu` (CUDA kernels vs their CPU twins, exec GPU tests once they exist) and the kernel
# benchmark three times (the figures to quote are the medians of the three runs), writing every
# log to $OUT (default: ./gpu-check-out). Meant for a machine with an NVIDIA GPU (e.g. through the
# device tool on an H200); on a machine without one the tests skip and the benchmark falls back
# to the CPU kernels, so the script still runs end to end.
#
#   OUT=/some/dir scripts/gpu-check.sh [--arch 90] [--jobs N] [--bench-args "..."]
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
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --bench-args) bench_args=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "gpu-check.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
build="$here/build-gpu"
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

step configure configure.log cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DMOESIM_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" || { cat "$summary"; exit 1; }
step build build.log cmake --build "$build" -j "$jobs" || { tail -40 "$out/build.log"; cat "$summary"; exit 1; }

step "ctest -L gpu" ctest-gpu.log ctest --test-dir "$build" -L gpu --output-on-failure \
  --timeout 600
# Skipped tests mean no device was visible: worth a line in the summary, not a failure.
if grep -q "Skipped" "$out/ctest-gpu.log" 2>/dev/null; then
  note "note    some gpu tests were skipped (no device visible?): see ctest-gpu.log"
fi

for i in 1 2 3; do
  # shellcheck disable=SC2086
  step "kernels_bench run $i" "kernels_bench.$i.log" "$build/bench/kernels_bench" $bench_args
done

cat "$summary"
exit $status
