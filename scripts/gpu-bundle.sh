#!/usr/bin/env bash
# Packs a CUDA build made here into a self-contained folder for a GPU machine that has the CUDA
# toolkit, cuBLAS and NCCL but none of moesim's other run-time libraries (the device tool's
# machines: no yaml-cpp, fmt, SimGrid, Boost, Open MPI, and no package registry to fetch them).
#
#   scripts/gpu-bundle.sh [--build build-gpu] [--out .gpubundle]
#
# Builds nothing: configure and build first, e.g.
#   cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMOESIM_WITH_CUDA=ON \
#     -DCMAKE_CUDA_ARCHITECTURES=90
#   cmake --build build-gpu --target moesim moesim_kernels_gpu_test \
#     moesim_kernels_ta_moe_loss_gpu_test exec_gpu_test kernels_bench exec_overhead_bench
# The folder holds
#   bin/    the binaries, and Open MPI's mpirun (orterun) and orted;
#   lib/    every shared library they load that is not glibc, CUDA, cuBLAS or NCCL (those come
#           from the GPU machine, whose driver the CUDA libraries must match);
#   compat/ libstdc++ and libgcc_s, used only where the machine's own are older than the build's;
#   ompi/   Open MPI's and PMIx's components and help files, relocated by OPAL_* / PMIX_*
#           variables that env.sh sets.
#   env.sh  sourced on the GPU machine: sets PATH, LD_LIBRARY_PATH (the machine's CUDA and the
#           NCCL of its Python packages when the toolkit has none) and the relocation variables.
# scripts/gpu-check.sh --bundle DIR runs the GPU checks from such a folder.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$here/build-gpu
out=$here/.gpubundle
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$(cd "$2" && pwd); shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "gpu-bundle.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

bins=(moesim tests/kernels/moesim_kernels_gpu_test tests/kernels/moesim_kernels_ta_moe_loss_gpu_test
      tests/exec/exec_gpu_test bench/kernels_bench bench/exec_overhead_bench)
for b in "${bins[@]}"; do
  [ -x "$build/$b" ] || { echo "gpu-bundle.sh: $build/$b is not built" >&2; exit 2; }
done

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/compat" "$out/ompi"
for b in "${bins[@]}"; do cp "$build/$b" "$out/bin/"; done
# The tests read scenarios under the source folder compiled into them; gpu-check.sh links it.
sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" > "$out/source_dir"
strip --strip-debug "$out"/bin/* 2>/dev/null || true
ompi_pkglib=$(ompi_info --path pkglibdir --parsable 2>/dev/null | sed 's/.*://')
ompi_pkgdata=$(ompi_info --path pkgdatadir --parsable 2>/dev/null | sed 's/.*://')
pmix_lib=$(dirname "$(readlink -f /usr/lib/x86_64-linux-gnu/libpmix.so.2)")
cp "$(readlink -f "$(command -v orterun)")" "$out/bin/mpirun"
cp "$(readlink -f "$(command -v orted)")" "$out/bin/orted"
cp -r "$ompi_pkglib" "$out/ompi/pkglib"
# One host, shared memory: the fabric components (UCX, libfabric, verbs, PSM) and their libraries
# stay behind, and so does ROMIO's MPI-IO (moesim does no MPI-IO).
find "$out/ompi/pkglib" \( -name '*ucx*' -o -name '*ofi*' -o -name '*psm*' -o -name '*openib*' \
  -o -name '*usnic*' -o -name '*verbs*' -o -name '*portals*' -o -name '*romio*' \
  -o -name '*hcoll*' -o -name '*fca*' -o -name '*ucc*' \) -delete
cp -r "$ompi_pkgdata" "$out/ompi/pkgdata"
cp -r "$pmix_lib/pmix" "$out/ompi/pmixlib"
[ -d /usr/share/pmix ] && cp -r /usr/share/pmix "$out/ompi/pmixdata"
mkdir -p "$out/ompi/etc"
[ -f /etc/openmpi/openmpi-mca-params.conf ] && cp /etc/openmpi/openmpi-mca-params.conf "$out/ompi/etc/"

# The shared libraries of every binary and component, minus what the GPU machine provides.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libutil\.so|libcuda\.so|libcudart\.so|libcublas|libnccl|libnvidia)'
compat='^(libstdc\+\+\.so|libgcc_s\.so)'
files=("$out"/bin/* $(find "$out/ompi" -name '*.so'))
ldd "${files[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    if [[ $name =~ $skip ]]; then continue; fi
    if [[ $name =~ $compat ]]; then cp -L "$path" "$out/compat/$name"; else cp -L "$path" "$out/lib/$name"; fi
  done

cat > "$out/env.sh" <<'EOF'
# Sourced on the GPU machine (see scripts/gpu-bundle.sh).
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH=$B/bin:$PATH
cuda_lib=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && cuda_lib=$cuda_lib:$d
done
# NCCL: the toolkit's where it has one, else the one PyTorch's wheels bring.
nccl_lib=""
if ! ls /usr/local/cuda/lib*/libnccl.so.2 > /dev/null 2>&1; then
  nccl_lib=$(dirname "$(find / -xdev -name libnccl.so.2 2>/dev/null | head -1)" 2>/dev/null)
fi
cublas_lib=""
if ! ls /usr/local/cuda/lib*/libcublas.so.* > /dev/null 2>&1; then
  cublas_lib=$(dirname "$(find / -xdev -name 'libcublas.so.1*' 2>/dev/null | head -1)" 2>/dev/null)
fi
export LD_LIBRARY_PATH=$B/lib$cuda_lib${nccl_lib:+:$nccl_lib}${cublas_lib:+:$cublas_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The build's libstdc++ only where the machine's lacks a version the binaries need.
if ldd "$B/bin/moesim" 2>&1 | grep -q "version .GLIBCXX\|version .GCC\|libstdc++.*not found"; then
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$B/compat
  ldd "$B/bin/moesim" 2>&1 | grep -q "version .GLIBCXX" && export LD_LIBRARY_PATH=$B/compat:$LD_LIBRARY_PATH
fi
# Open MPI and PMIx, relocated (their compiled-in paths are Debian's).
export OPAL_PKGLIBDIR=$B/ompi/pkglib OPAL_PKGDATADIR=$B/ompi/pkgdata OPAL_SYSCONFDIR=$B/ompi/etc
export OPAL_BINDIR=$B/bin OPAL_LIBDIR=$B/lib
export PMIX_MCA_mca_base_component_path=$B/ompi/pmixlib
[ -d "$B/ompi/pmixdata" ] && export PMIX_INSTALL_PREFIX=$B/ompi PMIX_PKGDATADIR=$B/ompi/pmixdata
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One host, shared memory only: no InfiniBand or UCX probing on a machine without them.
export PMIX_MCA_pcompress_base_silence_warning=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_osc=^ucx OMPI_MCA_mca_base_component_show_load_errors=0
EOF
du -sh "$out"
