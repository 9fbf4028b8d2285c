#!/usr/bin/env bash
# serving_bench: the serving engine's cost (docs/serving.md). Runs each row --repeats times under
# /usr/bin/time and prints the median CPU (user + sys), the median peak RSS and the row's result.
#
#   bench/serving_bench.sh [--build DIR] [--repeats N]
#
# Row decode-10min: scenarios/deepseek-v3-serving-h800.yaml (V12's deployment: 5 prefill units of
# 4 nodes and the 144-GPU decode unit): 10 minutes of traffic at its 320 requests/s (192,000
# requests, the file as it is). Target: <= 60 s CPU, <= 4 GiB on a 2-core machine.
# Row rate-sweep-10: scenarios/sweeps/serving-rate.yaml, the same deployment at ten request rates
# (200-380/s, ten minutes of traffic each) with --jobs 2. Target: <= 5 minutes wall.
# Figures depend on the machine: compare rows of one run, not runs of different machines.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$here/build"
repeats=3
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "serving_bench.sh: unknown argument '$1' (expected --build DIR, --repeats N)" >&2; exit 2 ;;
  esac
done
case "$repeats" in ''|*[!0-9]*|0) echo "serving_bench.sh: --repeats expects an integer >= 1, got '$repeats'" >&2; exit 2 ;; esac
moesim="$build/moesim"
[ -x "$moesim" ] || { echo "serving_bench.sh: $moesim not built (cmake --build $build --target moesim)" >&2; exit 2; }
command -v /usr/bin/time >/dev/null || { echo "serving_bench.sh: needs /usr/bin/time (Debian package time)" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }

row() {  # name, the output line to show (a grep pattern), then the command
  local name=$1 show=$2; shift 2
  : > "$tmp/cpu"; : > "$tmp/rss"; : > "$tmp/wall"
  for _ in $(seq "$repeats"); do
    /usr/bin/time -f '%U %S %M %e' -o "$tmp/time" "$@" > "$tmp/out"
    read -r user sys rss_kb wall < "$tmp/time"
    awk -v u="$user" -v s="$sys" 'BEGIN {print u + s}' >> "$tmp/cpu"
    echo "$rss_kb" >> "$tmp/rss"
    echo "$wall" >> "$tmp/wall"
  done
  local cpu rss wall
  cpu=$(median < "$tmp/cpu")
  rss=$(median < "$tmp/rss")
  wall=$(median < "$tmp/wall")
  printf '%-14s cpu %8.1f s  wall %7.1f s  rss %8.0f MiB  %s\n' "$name" "$cpu" "$wall" \
    "$(awk -v k="$rss" 'BEGIN {print k / 1024}')" "$(grep -E "$show" "$tmp/out" | head -1 | tr -s ' ')"
}

echo "# row            median CPU (user+sys), wall, peak RSS; result (decode-10min: strategy TTFT p50 p99, TPOT p50 p99, in/out tok/s/node, tok/s/user)"
row decode-10min '^deepep' "$moesim" simulate "$here/scenarios/deepseek-v3-serving-h800.yaml" --quiet
row rate-sweep-10 '^# serving-rate' "$moesim" sweep "$here/scenarios/sweeps/serving-rate.yaml" --jobs 2 --quiet
