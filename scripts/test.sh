#!/usr/bin/env bash
# Sets everything up (missing Debian packages, Release build) and runs the whole test suite.
#
#   scripts/test.sh            Release build in build/, all tests (unit, CLI, MPI; GPU tests
#                              skip cleanly without a device)
#   scripts/test.sh --asan     second configuration with -fsanitize=address,undefined in
#                              build-asan/, unit tests only (not the mpirun-launched ones: OpenMPI
#                              leaves allocations behind at MPI_Finalize that LeakSanitizer reports)
#   scripts/test.sh --format   check clang-format on every C++ source (no changes made)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=${1:-all}
jobs=$(nproc 2>/dev/null || echo 2)

case "$mode" in
  all)
    "$here/scripts/setup.sh" --build-dir "$here/build"
    cd "$here/build"
    ctest --output-on-failure -j "$jobs" --timeout 900
    ;;
  --asan)
    "$here/scripts/setup.sh" --build-dir "$here/build-asan" --type Asan
    cd "$here/build-asan"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      ctest --output-on-failure -j "$jobs" -L unit -LE mpi --timeout 900
    ;;
  --format)
    "$here/scripts/setup.sh" --no-build
    cd "$here"
    files=$(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh')
    # shellcheck disable=SC2086
    clang-format --dry-run -Werror $files
    echo "clang-format: $(echo "$files" | wc -w) files clean"
    ;;
  *)
    echo "test.sh: unknown mode '$mode' (expected nothing, --asan or --format)" >&2
    exit 2
    ;;
esac
