#!/usr/bin/env bash
# fuzz.sh: libFuzzer on the input loaders: the scenario target (what `moesim validate`
# does), the sweep target (what `moesim sweep` checks before running) and the hf_config target
# (a Hugging Face config.json, imported and loaded as a scenario's model), built with clang,
# ASan and UBSan in build-fuzz/. Each runs --runs inputs (default 1,000,000) from the corpus
# (bundled scenarios and sweeps, tests/cli/bad, tests/fuzz/corpus), with a timeout per input of
# --timeout s (default 5: ASan and UBSan make the loaders 3-5x slower; the 1 s bound of a Release
# build is what fuzz_replay checks on the corpus, findings included).
# Prints, per target: inputs run, execs/s, wall time, and the crash / timeout / OOM count (any is a
# failure: the input is saved under build-fuzz/findings/ and the script exits 1). Add what it
# finds, once fixed, to tests/fuzz/corpus/<target>/: CTest replays it (fuzz_replay_*).
# --no-sanitizers: coverage instrumentation only, in build-fuzz-fast/ (RelWithDebInfo), with a
# 1 s timeout by default: about 10x the inputs per second of the sanitized build, so a 1 M-input
# run of the sweep target (which parses its base scenario several times per input) fits in well
# under an hour of one core; crashes, hangs over 1 s, OOMs and exits other than 0 / 2 are caught,
# memory errors that do not crash are not (the sanitized runs are for those).
#
#   bench/fuzz.sh [--runs N] [--timeout S] [--targets scenario,sweep,hf_config] [--jobs J] [--build DIR]
#                 [--no-sanitizers]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=1000000
timeout=5
targets="scenario,sweep,hf_config"
jobs=$(nproc)
build=build-fuzz
sanitize=ON
timeout_set=0
build_set=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --timeout) timeout=$2; timeout_set=1; shift 2 ;;
    --targets) targets=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --build) build=$2; build_set=1; shift 2 ;;
    --no-sanitizers) sanitize=OFF; shift ;;
    *) echo "fuzz.sh: unknown argument '$1' (expected --runs N, --timeout S, --targets LIST, --jobs J, --build DIR, --no-sanitizers)" >&2; exit 2 ;;
  esac
done
if [ "$sanitize" = OFF ]; then
  [ "$timeout_set" = 1 ] || timeout=1
  [ "$build_set" = 1 ] || build=build-fuzz-fast
fi

# clang and libFuzzer's runtime (Debian's libclang-rt-*-dev), installed like every other
# dependency of the project: only when missing.
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
if ! command -v clang++ >/dev/null; then
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends clang >/dev/null
fi
clang_major=$(clang++ -dumpversion | cut -d. -f1)
if ! ls /usr/lib/llvm-"$clang_major"/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    "libclang-rt-$clang_major-dev" >/dev/null
fi

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_COMPILER=clang -DMOESIM_FUZZ=ON -DMOESIM_FUZZ_SANITIZE="$sanitize" -DMOESIM_WITH_SIMGRID=OFF -DMOESIM_WITH_MPI=OFF \
  -DMOESIM_WITH_CUDA=OFF -DMOESIM_BUILD_BENCH=OFF >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
IFS=, read -ra list <<<"$targets"
for t in "${list[@]}"; do cmake --build "$build" -j"$jobs" --target "fuzz_$t" >/dev/null; done

status=0
printf '%-10s %12s %10s %10s %8s\n' target inputs "execs/s" "wall s" failures
for t in "${list[@]}"; do
  corpus="$build/corpus-$t"
  findings="$build/findings/$t"
  mkdir -p "$corpus" "$findings"
  ext='*.yaml'
  if [ "$t" = scenario ]; then
    seeds=(scenarios scenarios/topologies tests/cli/bad tests/fuzz/corpus/scenario)
  elif [ "$t" = hf_config ]; then
    seeds=(scenarios/models/hf tests/fuzz/corpus/hf_config)
    ext='*.json'
  else
    seeds=(scenarios/sweeps bench/validation tests/fuzz/corpus/sweep)
  fi
  for d in "${seeds[@]}"; do find "$d" -maxdepth 1 -type f -name "$ext" -exec cp {} "$corpus/" \; ; done
  log="$build/fuzz-$t.log"
  # Findings of earlier runs stay (they are the inputs to fix) but are not this run's failures.
  stamp="$build/fuzz-$t.start"
  touch "$stamp"
  start=$(date +%s.%N)
  rc=0
  "$build/tests/fuzz/fuzz_$t" -runs="$runs" -timeout="$timeout" -rss_limit_mb=2048 -max_len=4096 \
    -artifact_prefix="$findings/" -print_final_stats=1 "$corpus" >"$log" 2>&1 || rc=$?
  end=$(date +%s.%N)
  done_runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  eps=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  failures=$(find "$findings" -type f -newer "$stamp" | wc -l)
  printf '%-10s %12s %10s %10.0f %8s\n' "$t" "${done_runs:-0}" "${eps:-0}" "$(echo "$end - $start" | bc)" "$failures"
  if [ "$rc" -ne 0 ] || [ "$failures" -ne 0 ]; then
    status=1
    echo "fuzz_$t: exit $rc; findings in $findings, log $log:" >&2
    grep -E 'ERROR|==[0-9]+==|SUMMARY|Test unit written' "$log" | head -20 >&2 || true
  fi
done
exit $status
