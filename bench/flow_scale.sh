#!/usr/bin/env bash
# flow_scale: the flow engine at MoE scale. Every row runs --repeats times
# under /usr/bin/time; prints the median CPU (user+sys) and peak RSS, the simulated result, and
# the row's target. A run past --timeout is killed and shown as ">T s (killed)".
#
#   bench/flow_scale.sh [--build DIR] [--repeats N] [--timeout S] [--rows LIST] [--list]
#
# Rows (names for --rows, comma separated; default: all):
#   skew-128 skew-192 skew-256 skew-512   flow_bench --case skew at a scenario's default event
#                                         tolerance, 3e-3 (target: 512 <= 5 s CPU); skew-N-exact
#                                         the same at 1e-9 (the reference; minutes from 256)
#   step-256-exact step-512-exact         one-layer training step, Zipf 1.0, dropless, routed
#   step-512-3e-3 step-1024-3e-3 step-4096-3e-3   all_to_allv (faster_moe_hir, max_offnode_share
#                                         1.0), a2a-4096.yaml reduced to the GPU count; exact
#                                         (1e-9) or event_tolerance 3e-3 (target: 4,096 <= 60 s
#                                         CPU, <= 4 GiB, within 0.5% of exact where it finishes)
#   a2a-dragonfly                         linear all_to_all 128 MiB, dragonfly-h200-4096.yaml
#                                         (hash routes; target <= 60 s CPU), exact
#   a2a-dragonfly-3e-3                    the same with event_tolerance 3e-3 (hash collisions make
#                                         every flow finish at its own time)
#   a2a-4096                              linear all_to_all 128 MiB, a2a-4096.yaml (d-mod-k,
#                                         1 us per message; target <= 20 s CPU, <= 3 GiB)
#   deepseek-analytical deepseek-flow     the DeepSeek-V3 step (scenarios/models/
#                                         deepseek-v3.yaml: PP 16 x EP 64 on 2,048 GPUs, 120
#                                         micro-batches), baseline alone (the
#                                         targets: analytical <= 5 s wall, <= 3 GiB; flow
#                                         <= 120 s CPU, <= 4 GiB). Sampling and the run summary
#                                         use 2 threads, so the analytical row's CPU exceeds
#                                         its wall time: time its command for the wall figure
#   deepseek-analytical-all               the same, analytical, the preset's 3 strategies
# Figures depend on the machine: compare rows of one run, not runs of different machines.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$here/build"
repeats=3
timeout_s=480
rows="skew-128,skew-192,skew-256,skew-512,step-256-exact,step-512-exact,step-512-3e-3,step-1024-3e-3,step-4096-3e-3,a2a-dragonfly,a2a-dragonfly-3e-3,a2a-4096,deepseek-analytical,deepseek-analytical-all,deepseek-flow"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --list) echo "$rows" | tr ',' '\n'; exit 0 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "flow_scale.sh: unknown argument '$1' (expected --build DIR, --repeats N, --timeout S, --rows LIST, --list)" >&2; exit 2 ;;
  esac
done
case "$repeats" in ''|*[!0-9]*|0) echo "flow_scale.sh: --repeats expects an integer >= 1, got '$repeats'" >&2; exit 2 ;; esac
case "$timeout_s" in ''|*[!0-9]*|0) echo "flow_scale.sh: --timeout expects whole seconds >= 1, got '$timeout_s'" >&2; exit 2 ;; esac
moesim="$build/moesim"
flow_bench="$build/bench/flow_bench"
for f in "$moesim" "$flow_bench"; do
  [ -x "$f" ] || { echo "flow_scale.sh: $f not built (cmake --build $build --target moesim flow_bench)" >&2; exit 2; }
done
command -v /usr/bin/time >/dev/null || { echo "flow_scale.sh: needs /usr/bin/time (Debian package time)" >&2; exit 2; }

# A skewed one-layer training step on a2a-4096.yaml reduced to $1 GPUs, tolerance $2.
step_cmd() {
  local gpus=$1 tol=$2
  echo "$moesim simulate $here/scenarios/a2a-4096.yaml --engine flow --iterations 1 --strategy routed \
    --set cluster.nodes=$((gpus / 8)) --set parallelism.ep=$gpus --set model.experts_per_gpu=1 \
    --set model.capacity_factor=0 --set workload.routing.distribution=zipf --set workload.routing.skew=1.0 \
    --set engine.flow.event_tolerance=$tol \
    --set 'strategies=[{name: routed, routing: faster_moe_hir, faster_moe_hir: {max_offnode_share: 1.0}}]'"
}

row_cmd() {
  case "$1" in
    skew-*-exact) local g=${1#skew-}; echo "$flow_bench --case skew --repeat 1 --nodes $(( ${g%-exact} / 8 )) --tolerance 1e-9" ;;
    skew-*) echo "$flow_bench --case skew --repeat 1 --nodes $(( ${1#skew-} / 8 ))" ;;
    step-*-exact) local g=${1#step-}; step_cmd "${g%-exact}" 1e-9 ;;
    step-*-3e-3) local g=${1#step-}; step_cmd "${g%-3e-3}" 3e-3 ;;
    a2a-dragonfly) echo "$moesim simulate $here/scenarios/dragonfly-h200-4096.yaml --engine flow --collective all_to_all --size 128MiB --algo linear" ;;
    a2a-dragonfly-3e-3) echo "$moesim simulate $here/scenarios/dragonfly-h200-4096.yaml --engine flow --collective all_to_all --size 128MiB --algo linear --set engine.flow.event_tolerance=3e-3" ;;
    a2a-4096) echo "$moesim simulate $here/scenarios/a2a-4096.yaml --engine flow --collective all_to_all --size 128MiB --algo linear" ;;
    deepseek-analytical) echo "$moesim simulate $here/scenarios/models/deepseek-v3.yaml --engine analytical --strategy baseline --quiet" ;;
    deepseek-analytical-all) echo "$moesim simulate $here/scenarios/models/deepseek-v3.yaml --engine analytical --quiet" ;;
    deepseek-flow) echo "$moesim simulate $here/scenarios/models/deepseek-v3.yaml --engine flow --strategy baseline --quiet" ;;
    *) echo "flow_scale.sh: unknown row '$1' (see --list)" >&2; exit 2 ;;
  esac
}
row_target() {
  case "$1" in
    skew-512) echo "<= 5 s CPU, within 0.2% of exact" ;;
    skew-*-exact) echo "reference" ;;
    skew-*) echo "-" ;;
    step-4096-*) echo "<= 60 s CPU, <= 4 GiB" ;;
    step-*-3e-3) echo "within 0.5% of exact" ;;
    step-*) echo "reference" ;;
    a2a-dragonfly) echo "<= 60 s CPU" ;;
    a2a-dragonfly-3e-3) echo "<= 60 s CPU, within 3e-3 of exact" ;;
    a2a-4096) echo "<= 20 s CPU, <= 3 GiB" ;;
    deepseek-analytical) echo "<= 5 s wall, <= 3 GiB" ;;
    deepseek-analytical-all) echo "-" ;;
    deepseek-flow) echo "<= 120 s CPU, <= 4 GiB" ;;
  esac
}
# The simulated figure a row reports: the step time of a step row, the collective's time
# otherwise (flow_bench prints "sim ... s").
row_result() {
  local row=$1 out=$2
  case "$row" in
    step-*) awk '$1 == "routed" { print $2 " ms"; exit }' "$out" ;;
    deepseek-*) awk '$1 == "baseline" { print $2 " ms"; exit }' "$out" ;;
    skew-*) grep -o 'sim [0-9.]* s' "$out" | head -1 | awk '{ printf "%.3f ms", $2 * 1000 }' ;;
    *) awk '/^ *[0-9.]+ [KMG]iB/ { print $4 " us"; exit }' "$out" ;;
  esac
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%-16s %16s %18s %12s %10s  %s\n' "case" "simulated" "CPU s (median)" "runs" "RSS GiB" "target"
for row in ${rows//,/ }; do
  cmd=$(row_cmd "$row")
  : >"$tmp/cpu"
  : >"$tmp/rss"
  killed=0
  result="-"
  for ((i = 0; i < repeats; ++i)); do
    if timeout "$timeout_s" /usr/bin/time -f '%U %S %M' -o "$tmp/time" bash -c "$cmd" >"$tmp/out" 2>"$tmp/err"; then
      awk '{ print $1 + $2 }' "$tmp/time" >>"$tmp/cpu"
      awk '{ printf "%.2f\n", $3 / 1048576 }' "$tmp/time" >>"$tmp/rss"
      result=$(row_result "$row" "$tmp/out")
    else
      killed=1
      break  # one kill is enough: the next repeats would be killed too
    fi
  done
  if [ "$killed" = 1 ]; then
    printf '%-16s %16s %18s %12s %10s  %s\n' "$row" "-" ">$timeout_s s (killed)" "$i/$repeats" "-" "$(row_target "$row")"
  else
    runs=$(paste -sd/ "$tmp/cpu")
    printf '%-16s %16s %18s %12s %10s  %s\n' "$row" "${result:--}" "$(median <"$tmp/cpu")" "$runs" "$(median <"$tmp/rss")" "$(row_target "$row")"
  fi
done
