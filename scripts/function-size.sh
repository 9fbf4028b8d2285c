#!/usr/bin/env bash
# function-size.sh: lists every function of apps/, strategies/ and exec/ longer than 150 lines
# (clang-tidy's readability-function-size over the build's compile_commands.json), the limit the
# project keeps so that each function does one thing. Exit 1 if any is found.
#
#   scripts/function-size.sh [BUILD_DIR] [LINES]     (defaults: build, 150)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
lines=${2:-150}
if ! command -v clang-tidy >/dev/null; then
  echo "function-size.sh: clang-tidy is not installed (apt-get install clang-tidy)" >&2
  exit 2
fi
if [[ ! -f $build/compile_commands.json ]]; then
  echo "function-size.sh: no $build/compile_commands.json (configure the build first)" >&2
  exit 2
fi
config="{CheckOptions: [{key: readability-function-size.LineThreshold, value: $lines}]}"
found=0
for f in $(git ls-files 'apps/*.cpp' 'strategies/*.cpp' 'exec/*.cpp'); do
  out=$(clang-tidy -p "$build" --quiet --checks='-*,readability-function-size' --config="$config" \
    "$f" 2>/dev/null | grep "warning:" || true)
  if [[ -n $out ]]; then
    echo "$out"
    found=1
  fi
done
if [[ $found == 0 ]]; then echo "function-size.sh: no function over $lines lines"; fi
exit $found
