#!/usr/bin/env bash
# One-command set-up for moesim on a Debian machine: installs the Debian packages of
# docs/design.md §8 that are missing, then configures and builds Release, and installs the Python
# package into BUILD/python-venv.
#
#   scripts/setup.sh [--build-dir DIR] [--type Release|Debug|Asan] [--no-build]
#
# Idempotent: packages already present are skipped, `apt-get update` runs at most once, and
# an existing build directory is reused (incremental build).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir="$here/build"
build_type=Release
do_build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --type) build_type=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$1' (expected --build-dir DIR, --type T, --no-build)" >&2; exit 2 ;;
  esac
done

packages=(build-essential cmake pkg-config libyaml-cpp-dev libboost-graph-dev libsimgrid-dev
  libcli11-dev libfmt-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin clang-format gnuplot-nox chromium libprotobuf-dev protobuf-compiler
  pybind11-dev python3-dev python3-pandas python3-venv python3-pip python3-setuptools
  python3-wheel)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ "$do_build" = 1 ] || exit 0

jobs=$(nproc 2>/dev/null || echo 2)
cmake_args=(-S "$here" -B "$build_dir")
case "$build_type" in
  # -O1 -g1: ASan's recommended level, and line tables are all its reports need; -O2 -g took
  # 2.4x as long to compile (a cold sanitizer build was most of CI's time). The sanitizer run is
  # the unit tests only, so no CUDA kernels (no device on CI: their tests skip) and no benchmarks.
  Asan) cmake_args+=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESIM_SANITIZE=ON
                     "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
                     "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
                     -DMOESIM_WITH_CUDA=OFF -DMOESIM_BUILD_BENCH=OFF) ;;
  # Debian's interpreter, whose python3-pandas the Python package's users and tests import (a
  # python3 earlier on PATH, e.g. pyenv's, has no Debian packages).
  *) cmake_args+=(-DCMAKE_BUILD_TYPE="$build_type" -DPython_EXECUTABLE=/usr/bin/python3) ;;
esac
cmake "${cmake_args[@]}" >/dev/null
cmake --build "$build_dir" -j "$jobs"

# The Python package (apps/python), installed with the system's tools into a virtual environment
# that sees Debian's packages (pandas): BUILD/python-venv/bin/python has `import moesim`. pip
# takes the module the build above made; nothing is downloaded (--no-index, --no-build-isolation).
if grep -q '^MOESIM_PYTHON:BOOL=ON' "$build_dir/CMakeCache.txt"; then
  venv="$build_dir/python-venv"
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
  MOESIM_BUILD_DIR="$build_dir" "$venv/bin/python" -m pip install -q --no-index --no-deps \
    --no-build-isolation --force-reinstall "$here/apps/python" >/dev/null
  echo "setup.sh: Python package installed: $venv/bin/python -c 'import moesim'" >&2
fi
