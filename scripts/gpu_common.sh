# What scripts/gpu_kit.sh (run here, on a CPU machine with the CUDA toolkit) and
# scripts/gpu_check.sh (run on the GPU machine) share. Sourced, not run.
#
# Everything in the kit lives under one fixed prefix on both machines, so that the absolute paths
# a build records (RPATHs, Kokkos' CMake config, the MPI and HDF5 compiler wrappers) are the same
# where the kit is made and where it is used:
#   $GPU_PREFIX/deps     Debian packages unpacked with dpkg -x (runtime libraries, headers, mpiexec)
#   $GPU_PREFIX/kokkos   a CUDA-enabled Kokkos install
#   $GPU_PREFIX/build    Trident's CUDA build (prebuilt here)
#   $GPU_PREFIX/cudnn-frontend  the cuDNN frontend's headers, for the cudnn attention entry
GPU_PREFIX=${TRIDENT_GPU_PREFIX:-/tmp/trident-gpu}
GPU_DEPS=$GPU_PREFIX/deps
GPU_LIBDIR=$GPU_DEPS/usr/lib/x86_64-linux-gnu
GPU_KOKKOS=$GPU_PREFIX/kokkos
GPU_BUILD=$GPU_PREFIX/build
GPU_CUDNN_FE=$GPU_PREFIX/cudnn-frontend  # the cuDNN frontend's headers (header-only; include/)
GPU_ARCH=${CUDA_ARCH:-90}
# Where the GPU scripts keep what they build outside the repository (Kokkos builds, the kit's Debian
# packages and host reference, the rehearsal's chroot, cuda_build's build directory).
GPU_CACHE=${TRIDENT_GPU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trident-gpu}
# The parts of the kit, each a tar.xz in the kit folder (.gpu_kit/ in the repository root).
GPU_KIT_PARTS=(deps kokkos build data)
# The apps and tests the GPU run uses; the fallback build builds just these.
GPU_APPS=(pretrain_gpt pretrain_bert pretrain_t5 generate_gpt convert_checkpoint)

gpu_log() { printf '%s %s\n' "[$(date +%H:%M:%S)]" "$*"; }

# A digest of every file that goes into the CUDA build: the prebuilt binaries in the kit are used
# only when the source tree they were built from has the same digest (no .git is needed for it:
# the GPU machine receives only the working tree).
gpu_source_digest() {  # ROOT
  (cd "$1" && find CMakeLists.txt cmake src apps tests perf -type f \
      \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name 'CMakeLists.txt' -o -name '*.cmake' \) \
      -print 2>/dev/null | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
}

# Directories holding CUDA's runtime, cuBLAS and NCCL: the toolkit's, then the NVIDIA wheels of
# the machine's PyTorch (the GPU machine's NCCL may come only from there), then ldconfig's.
gpu_cuda_lib_dirs() {
  local d dirs=() py
  for d in ${CUDA_HOME:+$CUDA_HOME/lib64} /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
    [ -d "$d" ] && dirs+=("$d")
  done
  py=${PYTHON:-python3}
  if command -v "$py" >/dev/null 2>&1; then
    while IFS= read -r d; do [ -n "$d" ] && dirs+=("$d"); done < <("$py" - 2>/dev/null <<'PY'
import glob, os, site, sys
roots = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib")) + glob.glob(os.path.join(r, "nvidia", "cu1*", "lib"))):
        print(d)
PY
)
  fi
  printf '%s\n' "${dirs[@]}" | awk '!seen[$0]++'
}

# The first file matching one of the names in the CUDA library directories (or ldconfig's list).
gpu_find_cuda_lib() {  # NAME...
  local d n
  while IFS= read -r d; do
    for n in "$@"; do [ -e "$d/$n" ] && { echo "$d/$n"; return 0; }; done
  done < <(gpu_cuda_lib_dirs)
  for n in "$@"; do
    d=$(ldconfig -p 2>/dev/null | awk -v n="$n" '$1 == n {print $NF; exit}')
    [ -n "$d" ] && { echo "$d"; return 0; }
  done
  return 1
}

# NCCL's header directory next to a libnccl found above (toolkit: include/, wheel: ../include).
gpu_nccl_include() {  # LIBNCCL
  local d
  d=$(dirname "$1")
  for c in "$d/../include" "$d/../../include" /usr/local/cuda/include /usr/include; do
    [ -f "$c/nccl.h" ] && { (cd "$c" && pwd); return 0; }
  done
  return 1
}

# Environment for running (and building) against the kit.
gpu_env() {
  local dirs
  dirs=$(gpu_cuda_lib_dirs | paste -sd: -)
  export LD_LIBRARY_PATH="$GPU_BUILD/src:$GPU_KOKKOS/lib:$GPU_KOKKOS/lib64:$GPU_LIBDIR${dirs:+:$dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$GPU_DEPS/usr/bin:$PATH"
  [ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"
  # MPICH's hydra finds its proxy on PATH; UCX loads its transport modules next to libucs
  export HYDRA_PROXY_PATH="$GPU_DEPS/usr/bin"
  # one node: UCX over shared memory, without probing network devices the machine may not have
  export UCX_TLS=${UCX_TLS:-self,sm} UCX_WARN_UNUSED_ENV_VARS=n
  return 0
}

# A folder holding the CUDA toolkit's stub of the driver library as libcuda.so.1, for a machine
# without the driver: the executables link libcuda.so.1 (Kokkos does), and `--version` must run
# there too. Printed only where no libcuda.so.1 is found; calls into the stub fail, and none is made
# before the GPU phase.
gpu_stub_driver_dir() {
  local stub d=$GPU_PREFIX/stub-driver
  ldconfig -p 2>/dev/null | grep -q "libcuda\.so\.1 " && return 1
  gpu_find_cuda_lib libcuda.so.1 >/dev/null && return 1
  for stub in ${CUDA_HOME:+$CUDA_HOME/lib64/stubs/libcuda.so} /usr/local/cuda/lib64/stubs/libcuda.so \
              /usr/local/cuda/targets/x86_64-linux/lib/stubs/libcuda.so; do
    [ -f "$stub" ] || continue
    mkdir -p "$d" && ln -sf "$stub" "$d/libcuda.so.1" && { echo "$d"; return 0; }
  done
  return 1
}

# nvcc's release: "13.0"
gpu_nvcc_version() {  # NVCC
  "$1" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'
}
# An installed Kokkos' version number: "40699"
gpu_kokkos_install_version() {  # PREFIX
  sed -n 's/^#define KOKKOS_VERSION \([0-9]*\).*/\1/p' "$1"/include/KokkosCore_config.h "$1"/include/Kokkos_Version_Info.hpp \
    2>/dev/null | head -n1
}
# Kokkos' version from a source tree: "4.6.99"
gpu_kokkos_src_version() {  # SRC
  sed -n 's/^set(Kokkos_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' "$1/CMakeLists.txt" | paste -sd. -
}
# Extra CMake options for building a Kokkos source tree. Development snapshots before 4.7 that
# default to the new mdspan-based View crash on the first move-assignment of a View (a null
# record decremented: seen with the June 2025 4.6.99 snapshot, at -O0 and -O3, Serial, OpenMP and
# CUDA builds alike); their legacy View is used instead.
gpu_kokkos_options() {  # SRC
  local v maj min
  v=$(gpu_kokkos_src_version "$1")
  maj=${v%%.*} min=$(echo "$v" | cut -d. -f2)
  if grep -qs "IMPL_VIEW_LEGACY" "$1/cmake/kokkos_enable_options.cmake" && { [ "$maj" -lt 4 ] || { [ "$maj" -eq 4 ] && [ "$min" -lt 7 ]; }; }; then
    echo "-DKokkos_ENABLE_IMPL_VIEW_LEGACY=ON"
  fi
}

# Configure Trident's CUDA build against the kit: SRC BUILD [extra cmake arguments...]
gpu_configure() {
  local src=$1 build=$2 nccl inc gen=()
  shift 2
  nccl=$(gpu_find_cuda_lib libnccl.so libnccl.so.2) || { echo "gpu_configure: NCCL (libnccl.so.2) not found" >&2; return 1; }
  inc=$(gpu_nccl_include "$nccl") || { echo "gpu_configure: nccl.h not found next to $nccl" >&2; return 1; }
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  cmake -S "$src" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DTRIDENT_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$GPU_ARCH" -DTRIDENT_HOST_ARCH=none \
    -DBUILD_SHARED_LIBS=ON -UKokkos_DIR -DKokkos_ROOT="$GPU_KOKKOS" \
    -DCMAKE_PREFIX_PATH="$GPU_DEPS/usr" -DCMAKE_IGNORE_PREFIX_PATH=/usr \
    -DMPI_C_COMPILER="$GPU_DEPS/usr/bin/mpicc.mpich" -DMPI_CXX_COMPILER="$GPU_DEPS/usr/bin/mpicxx.mpich" \
    -DMPIEXEC_EXECUTABLE="$GPU_DEPS/usr/bin/mpiexec.hydra" \
    -DHDF5_ROOT="$GPU_LIBDIR/hdf5/mpich" -DHDF5_C_COMPILER_EXECUTABLE="$GPU_DEPS/usr/bin/h5pcc.mpich" \
    -DICU_ROOT="$GPU_DEPS/usr" -DBoost_ROOT="$GPU_DEPS/usr" -DGTest_ROOT="$GPU_DEPS/usr" \
    -DNCCL_LIBRARY="$nccl" -DNCCL_INCLUDE_DIR="$inc" \
    ${GPU_CUDNN_FE:+$([ -f "$GPU_CUDNN_FE/include/cudnn_frontend.h" ] && echo "-DTRIDENT_CUDNN_FRONTEND=$GPU_CUDNN_FE")} "$@"
}

# The version of a cuDNN frontend source tree (its include/cudnn_frontend_version.h), e.g. 1.23.0
gpu_cudnn_fe_version() {  # DIR
  local h=$1/include/cudnn_frontend_version.h
  [ -f "$h" ] || return 1
  printf '%s.%s.%s\n' "$(awk '/define CUDNN_FRONTEND_MAJOR_VERSION/ {print $3}' "$h")" \
    "$(awk '/define CUDNN_FRONTEND_MINOR_VERSION/ {print $3}' "$h")" "$(awk '/define CUDNN_FRONTEND_PATCH_VERSION/ {print $3}' "$h")"
}

# The short training runs repeated on the GPU and, for the reference, on the host (fp32): the tiny
# CI decks, GPU_BAND_ITERS iterations (50; the host rehearsal of the script's logic,
# tests/gpu_kit/gpu_check_logic.sh, runs fewer), dropout off, no evaluation.
GPU_TRAIN_APPS=(gpt bert t5 llama moe)
# the app of a band run (llama, moe: pretrain_gpt with inputs/llama_tiny_ci.ini, inputs/moe_tiny_ci.ini)
gpu_train_app() { case $1 in llama | moe) echo gpt ;; *) echo "$1" ;; esac; }
gpu_band_args() {
  echo "--train.iters ${GPU_BAND_ITERS:-50} --model.hidden_dropout 0 --model.attention_dropout 0 --eval.interval 0" \
    "--log.interval 10"
}
# The host's fp32 losses of those runs: ROOT HOST_BUILD OUTDIR -> OUTDIR/<app>_fp32_host.csv
gpu_host_reference() {
  local app
  mkdir -p "$3"
  for app in "${GPU_TRAIN_APPS[@]}"; do
    # shellcheck disable=SC2046
    (cd "$1" && "$2/apps/pretrain_$(gpu_train_app "$app")" --deck "inputs/${app}_tiny_ci.ini" $(gpu_band_args) --precision.dtype fp32 \
      --model.flash_attention false --log.metrics_file "$3/${app}_fp32_host.csv" >"$3/${app}_fp32_host.log" 2>&1) ||
      { echo "the host reference run of pretrain_$app failed ($3/${app}_fp32_host.log)" >&2; return 1; }
  done
}
