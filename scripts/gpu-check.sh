#!/usr/bin/env bash
# GPU checks: configure and build with CUDA into $BUILD (default build-gpu/), then
#   1. ctest -L gpu: CUDA kernels vs their CPU twins in fp32 / fp16 / bf16, the TA-MoE loss, and
#      the executor's GPU path on one GPU (exec_gpu_np1: --check at r = 1, 2, 4, fp32 vs host);
#   2. kernels_bench three times (encode / decode GB/s and % of HBM at S = 16,384, M = 4,096 in
#      fp16 / bf16, the gate, expert GEMMs vs a plain cuBLAS GEMM of the shape; quote the
#      medians), and once at E = 256, top-8, S = 8,192;
#   3. exec_overhead_bench on the host path and on the GPU path (per-op overhead, empty ops);
#   4. mpirun -np 1 moesim exec scenarios/exec-gpu-1.yaml --backend nccl --check (fp16, single
#      GPU, pipeline r = 1, 2, 4) with its JSON;
#   5. when the build has them: moesim calibrate --out $OUT/calib.yaml, then moesim exec
#      --predict on exec-gpu-1 with cluster.calibration set to that file;
#   7. with 4 or more GPUs: exec-host-4 across 4 GPU ranks --backend nccl --check, padded and
#      routed / deepep (NCCL exchanges between ranks, deepep's row kernels).
# Every log goes to $OUT (default: ./gpu-check-out) with a summary.txt. Meant for a machine with
# an NVIDIA GPU (e.g. through the device tool on an H200); without one the tests skip, the
# benchmarks fall back to the CPU (or say there is no device) and the GPU-only steps are marked
# "skipped", so the script still runs end to end.
#
#   OUT=/some/dir scripts/gpu-check.sh [--arch 90] [--jobs N] [--bench-args "..."] [--no-build]
#   OUT=/some/dir scripts/gpu-check.sh --bundle .gpubundle
#
# --bundle DIR runs the same checks from a folder made here by scripts/gpu-bundle.sh, for GPU
# machines that have CUDA, cuBLAS and NCCL but not moesim's other libraries (the device tool's):
# the gpu tests run as binaries (no ctest tree there), and step 6 adds the plan-routed, backward
# and expert-pipelined exec scenarios on one GPU (--backend nccl --check). Every step has a time
# limit (STEP_TIMEOUT_S, default 240 s) so one hang cannot take the whole lease.
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
bundle=""
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --bench-args) bench_args=$2; shift 2 ;;
    --no-build) build_it=0; shift ;;
    --bundle) bundle=$(cd "$2" && pwd); build_it=0; shift 2 ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
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
  if timeout "${STEP_TIMEOUT_S:-240}" "$@" > "$out/$log" 2>&1; then
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

if [ -n "$bundle" ]; then
  # shellcheck disable=SC1091
  source "$bundle/env.sh"
fi
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

if [ -n "$bundle" ]; then
  bin=$bundle/bin
  kernels_bench=$bin/kernels_bench overhead_bench=$bin/exec_overhead_bench
  # The tests read scenarios from the source folder compiled into them: point it here.
  src=$(cat "$bundle/source_dir" 2>/dev/null || true)
  if [ -n "$src" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$here" "$src"; fi
  { echo "ldd moesim:"; ldd "$bin/moesim"; } >> "$out/device.txt" 2>&1
  step "gpu test: MoE kernels vs CPU twins" kernels-gpu-test.log "$bin/moesim_kernels_gpu_test"
  step "gpu test: TA-MoE loss vs CPU twin" ta-moe-gpu-test.log \
    "$bin/moesim_kernels_ta_moe_loss_gpu_test"
  step "gpu test: exec_gpu_np1" exec-gpu-test.log $mpirun_1 "$bin/exec_gpu_test"
  for log in kernels-gpu-test ta-moe-gpu-test exec-gpu-test; do
    if grep -q "SKIPPED" "$out/$log.log" 2>/dev/null; then
      note "note    $log: some tests were skipped (no device visible?)"
    fi
  done
  # Step 6: the plan-routed dispatch (drops, dropless, capped, chunks), backward on real data and
  # the expert pipeline on one GPU, through the GPU path's layer ops, each under --check.
  one=(--set cluster.nodes=1 --set cluster.gpus_per_node=1 --set cluster.inter_node.nics_per_node=1
       --set parallelism.ep=1 --set parallelism.dp=1 --iterations 1)
  for s in scenarios/exec-host-4.yaml tests/data/exec/routed-train-4.yaml \
           tests/data/exec/backward-dp2-4.yaml; do
    name=$(basename "$s" .yaml)
    if [ $have_gpu = 1 ]; then
      step "exec $name on one GPU --backend nccl --check" "exec-1gpu-$name.log" \
        $mpirun_1 "$bin/moesim" exec "$here/$s" --backend nccl --check "${one[@]}" \
        --json "$out/exec-1gpu-$name.json"
    else
      skipped "exec $name on one GPU (no device)"
    fi
  done
else
  bin=$build
  kernels_bench=$build/bench/kernels_bench overhead_bench=$build/bench/exec_overhead_bench
  step "ctest -L gpu" ctest-gpu.log ctest --test-dir "$build" -L gpu --output-on-failure \
    --timeout 600
  # Skipped tests mean no device was visible: worth a line in the summary, not a failure.
  if grep -q "Skipped\|SKIPPED" "$out/ctest-gpu.log" 2>/dev/null; then
    note "note    some gpu tests were skipped (no device visible?): see ctest-gpu.log"
  fi
  cp "$kernels_bench" "$overhead_bench" "$bin/" 2>/dev/null || true
fi

for i in 1 2 3; do
  # shellcheck disable=SC2086
  step "kernels_bench run $i" "kernels_bench.$i.log" "$kernels_bench" $bench_args
done
# A fine-grained gate (DeepSeek-V3's 256 experts, top-8): the warp top-k and the tiled capacity.
step "kernels_bench E 256 top-8" kernels_bench.e256.log "$kernels_bench" --experts 256 --top-k 8 \
  --tokens 8192

if [ -x "$overhead_bench" ]; then
  step "exec_overhead_bench host path" exec_overhead_host.log \
    $mpirun_1 "$overhead_bench" --backend mpi --reps 5
  if [ $have_gpu = 1 ]; then
    step "exec_overhead_bench GPU path" exec_overhead_gpu.log \
      $mpirun_1 "$overhead_bench" --backend nccl --reps 5
  else
    skipped "exec_overhead_bench GPU path (no device)"
  fi
else
  skipped "exec_overhead_bench (not built: needs MPI)"
fi

moesim="$bin/moesim"
scenario="$here/scenarios/exec-gpu-1.yaml"
if [ $have_gpu = 1 ]; then
  step "moesim exec exec-gpu-1 --backend nccl --check" exec-gpu-1.log \
    $mpirun_1 "$moesim" exec "$scenario" --backend nccl --check --json "$out/exec-gpu-1.json"
else
  skipped "moesim exec exec-gpu-1 --backend nccl --check (no device)"
fi

# Step 7, on a machine with 4 or more GPUs: the exchanges between GPU ranks through NCCL, which
# one GPU cannot exercise, under --check on exec-host-4 (2 "nodes" x 2 GPUs): the padded
# strategies, the routed all_to_allv beside DeepEP's per-node dispatch (a2a: deepep, its row
# kernels and two-phase lowering), and the backward on real data.
ngpu=0
[ $have_gpu = 1 ] && ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$ngpu" -ge 4 ]; then
  mpirun_4="mpirun -np 4 --oversubscribe"
  step "exec exec-host-4 on 4 GPUs --backend nccl --check" exec-4gpu.log \
    $mpirun_4 "$moesim" exec "$here/scenarios/exec-host-4.yaml" --backend nccl --check \
    --iterations 2 --json "$out/exec-4gpu.json"
  step "exec deepep on 4 GPUs --backend nccl --check" exec-4gpu-deepep.log \
    $mpirun_4 "$moesim" exec "$here/scenarios/exec-host-4.yaml" --backend nccl --check \
    --iterations 2 --set model.capacity_factor=0 --set workload.routing.node_limit=1 \
    --set 'strategies=[{name: routed, routing: faster_moe_hir, faster_moe_hir: {max_offnode_share: 1.0}}, {name: deepep, a2a: deepep}]' \
    --json "$out/exec-4gpu-deepep.json"
else
  skipped "exec on 4 GPUs (routed, deepep, backward across ranks): $ngpu GPU(s) visible"
fi

# Calibration and prediction, when this build has them (`moesim calibrate`, `exec --predict`).
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
