#!/usr/bin/env bash
# tune_bench: `moesim tune` against its targets (listed below). Every row runs --repeats times under
# /usr/bin/time and prints the median wall and CPU (user+sys) seconds, the peak RSS, and from the
# JSON: the space (layouts, stacks), runs on the screening engine, runs per second, the time to
# the best, whether the search completed, and the best speedup.
#
#   bench/tune_bench.sh [--build DIR] [--repeats N] [--rows LIST]
#
# Rows (default: quickstart):
#   quickstart   scenarios/quickstart.yaml, --budget 60s, top 10 re-run on flow
#                (target: the whole space screened and the top 10 re-run on flow in <= 30 s CPU)
#   fat-tree-4096  scenarios/fat-tree-a100-4096.yaml --budget 120s (target: a result within the
#                budget; no flow re-run above 1,024 GPUs with --engine auto)
#   mixtral, qwen3, deepseek-v3  the model presets (scenarios/models/), --budget 60s --engine
#                analytical, --emit: the emitted scenario is simulated and its step time compared
#                with the reported one (emit_err; target: layouts that fit, ranked, emit_err <= 1%)
#   presets      all three
# Figures depend on the machine: compare rows of one run, not runs of different machines.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$here/build"
repeats=3
rows="quickstart"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "tune_bench.sh: unknown argument '$1' (expected --build DIR, --repeats N, --rows LIST)" >&2; exit 2 ;;
  esac
done
case "$repeats" in ''|*[!0-9]*|0) echo "tune_bench.sh: --repeats expects an integer >= 1, got '$repeats'" >&2; exit 2 ;; esac
moesim="$build/moesim"
[ -x "$moesim" ] || { echo "tune_bench.sh: $moesim not found (build first, or pass --build DIR)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

rows=${rows//presets/mixtral,qwen3,deepseek-v3}
printf '%-14s %8s %8s %8s %8s %8s %8s %9s %9s %9s %8s %s\n' row wall_s cpu_s rss_MiB layouts stacks runs runs_per_s to_best_s speedup fit complete
for row in ${rows//,/ }; do
  preset=""
  case "$row" in
    quickstart) args=("$here/scenarios/quickstart.yaml" --budget 60s) ;;
    fat-tree-4096) args=("$here/scenarios/fat-tree-a100-4096.yaml" --budget 120s) ;;
    mixtral) preset=mixtral-8x7b ;;
    qwen3) preset=qwen3-235b-a22b ;;
    deepseek-v3) preset=deepseek-v3 ;;
    *) echo "tune_bench.sh: unknown row '$row' (quickstart, fat-tree-4096, mixtral, qwen3, deepseek-v3, presets)" >&2; exit 2 ;;
  esac
  [ -z "$preset" ] || args=("$here/scenarios/models/$preset.yaml" --budget 60s --engine analytical --emit "$tmp/best.yaml")
  : > "$tmp/wall"; : > "$tmp/cpu"; : > "$tmp/rss"
  for i in $(seq "$repeats"); do
    /usr/bin/time -f '%e %U %S %M' -o "$tmp/time" "$moesim" tune "${args[@]}" -q --json "$tmp/t.json" > /dev/null
    read -r wall user sys rss < "$tmp/time"
    echo "$wall" >> "$tmp/wall"
    echo "$user $sys" | awk '{print $1 + $2}' >> "$tmp/cpu"
    echo "$rss" | awk '{print $1 / 1024}' >> "$tmp/rss"
  done
  info=$(python3 - "$tmp/t.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
sp, se = j["space"], j["search"]
best = j["ranked"][0]["speedup"] if j["ranked"] else 0
print(sp["layouts"], sp["stacks"], sp["evaluated"], f'{se["runs_per_s"]:.2f}', f'{se["time_to_best_s"]:.1f}', f'{best:.2f}x', sp["layouts_fit_memory"], "yes" if se["complete"] else "no")
EOF
)
  read -r layouts stacks runs rate tobest speedup fit complete <<< "$info"
  printf '%-14s %8.1f %8.1f %8.0f %8s %8s %8s %9s %9s %9s %8s %s\n' "$row" \
    "$(median < "$tmp/wall")" "$(median < "$tmp/cpu")" "$(median < "$tmp/rss")" \
    "$layouts" "$stacks" "$runs" "$rate" "$tobest" "$speedup" "$fit" "$complete"
  if [ -n "$preset" ]; then
    # The last run's emitted scenario, simulated: its tuned stack against the reported time.
    "$moesim" simulate "$tmp/best.yaml" --engine analytical --strategy tuned -q --json "$tmp/s.json" > /dev/null
    python3 - "$tmp/t.json" "$tmp/s.json" <<'EOF'
import json, sys
t, s = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
top = t["ranked"][0]
rep, sim = top["screen"]["step_time_s"], s["runs"][0]["step_time_s"]
p = top["parallelism"]
print(f'  best: ep={p["ep"]} esp={p["esp"]} mp={p["mp"]} dp={p["dp"]} pp={p["pp"]} {p["schedule"]} '
      f'm={top["micro_batches"]} B={top["batch_per_gpu"]} zero={p["zero"]} rc={top["recompute"]} '
      f'{top["roles"]}: reported {rep * 1e3:.3f} ms, emitted file simulates {sim * 1e3:.3f} ms, '
      f'emit_err {abs(sim - rep) / rep * 100:.3f}%')
EOF
  fi
done
