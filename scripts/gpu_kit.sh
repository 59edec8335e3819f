#!/usr/bin/env bash
# Assembles the GPU kit: everything scripts/gpu_check.sh needs on a GPU machine that reaches no
# package registry and receives only the working tree plus carried, git-ignored folders.
# Run it here, on the development machine (Debian 12 with the CUDA toolkit in /usr/local/cuda,
# apt-get working, Trident's host build and sample data in place: `bash scripts/bootstrap.sh build`).
#
#   bash scripts/gpu_kit.sh --kokkos-src DIR   # a Kokkos source tree (4.x); built here for CUDA
#   bash scripts/gpu_kit.sh --kokkos-root DIR  # or a CUDA-enabled Kokkos install to carry as it is
#   bash scripts/gpu_kit.sh --kokkos-only --kokkos-src DIR [--cudnn-frontend-src DIR]
#                                              # only the cached CUDA Kokkos (step 3 below), which
#                                              # the CTest `cuda_build` builds Trident against;
#                                              # needs nvcc, cmake and g++, not the host build;
#                                              # then runs tests/cuda/cuda_build.sh once, without
#                                              # its time limit, so that its build directory and
#                                              # ccache are warm before the suite's first run
#   options: --kit DIR (default .gpu_kit), --jobs N, --arch SM (default 90), --max-mib N (60),
#            --no-prewarm (--kokkos-only: only the Kokkos, no cuda_build run),
#            --cudnn-frontend-src DIR (a source tree of NVIDIA's cuDNN frontend, header-only, as the
#            search tool's fetch of NVIDIA/cudnn-frontend gives it: its include/ is cached, once
#            per version, in $TRIDENT_GPU_CACHE/cudnn-frontend-<version>/ with the link
#            $TRIDENT_GPU_CACHE/cudnn-frontend, which cuda_build and later kits use; the kit
#            needs it, for the cudnn attention entry)
#
# The cached CUDA Kokkos: $TRIDENT_GPU_CACHE (default ~/.cache/trident-gpu)/kokkos-<version>-
# cuda<nvcc major>-sm<arch>/, built once per version, nvcc, compat header and options (a stamp), with
# the link $TRIDENT_GPU_CACHE/cuda-kokkos-sm<arch> to its install (relocatable: it works from the
# cache as from $GPU_PREFIX/kokkos).
#
# The kit (.gpu_kit/, git-ignored; at most --max-mib MiB) holds four xz tarballs and a manifest:
#   deps.tar.xz    Debian packages fetched with `apt-get download` and unpacked with `dpkg -x`
#                  into /tmp/trident-gpu/deps (never into /): the runtime libraries the CUDA build
#                  needs (MPICH with UCX and hydra's mpiexec, parallel HDF5, Boost.Program_options,
#                  ICU and what they load), plus the headers, CMake configs and compiler wrappers
#                  that a rebuild on the GPU machine needs (Boost's headers cut to those Trident
#                  includes). Wrappers are rewritten for that prefix.
#   kokkos.tar.xz  the CUDA-enabled Kokkos install (/tmp/trident-gpu/kokkos), and the cuDNN
#                  frontend's headers (/tmp/trident-gpu/cudnn-frontend); the Kokkos built here with this
#                  machine's nvcc outside the repository (--kokkos-src), or copied (--kokkos-root).
#                  Kokkos older than 4.7 gets scripts/gpu/cuda13_compat.h force-included when nvcc
#                  is 13 or newer (two runtime-API signatures CUDA 13 removed).
#   build.tar.xz   Trident's CUDA build (/tmp/trident-gpu/build, shared libraries): the apps, the
#                  unit tests, the perf tools; built against the kit itself, as the GPU machine
#                  would rebuild it. The manifest records the digest of the sources it was built
#                  from; gpu_check.sh rebuilds there when the digest or the start check disagrees.
#   data.tar.xz    the prepared sample shards and vocabularies, and the host's fp32 losses of the
#                  runs gpu_check.sh repeats on the GPU (its reference for the CUDA backend).
# Nothing of Kokkos (source, build or install) ever goes into the repository.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/gpu_common.sh
source "$root/scripts/gpu_common.sh"

kit=$root/.gpu_kit kokkos_src="" kokkos_root="" jobs=$(nproc) max_mib=60 kokkos_only=0 prewarm=1 cudnn_fe_src=""
while [ $# -gt 0 ]; do
  case "$1" in
    --kit) kit=$2; shift 2 ;;
    --kokkos-src) kokkos_src=$2; shift 2 ;;
    --kokkos-root) kokkos_root=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --arch) GPU_ARCH=$2; shift 2 ;;
    --max-mib) max_mib=$2; shift 2 ;;
    --kokkos-only) kokkos_only=1; shift ;;
    --no-prewarm) prewarm=0; shift ;;
    --cudnn-frontend-src) cudnn_fe_src=$2; shift 2 ;;
    -h|--help) sed -n '2,42p' "$0"; exit 0 ;;
    *) echo "gpu_kit: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
die() { echo "gpu_kit: error: $*" >&2; exit 1; }
cache=$GPU_CACHE
host_build=${HOST_BUILD:-$root/build}
t0=$(date +%s)
phase_start=$t0
phase() { local now; now=$(date +%s); gpu_log "gpu_kit: $1 ($((now - phase_start)) s)"; phase_start=$now; }

# cached_cuda_kokkos: builds (once per stamp) the source tree's Kokkos for CUDA into the cache and
# sets kstage (the install) and compat_flags (what every source compiled against that install at
# $GPU_KOKKOS needs). The install is relocatable (CMake configs relative to themselves); it holds
# include/trident_cuda13_compat.h exactly when sources compiled against it must force-include it.
cached_cuda_kokkos() {
  [ -f "$kokkos_src/CMakeLists.txt" ] || die "--kokkos-src $kokkos_src is not a Kokkos source tree"
  local kv kopts kmaj kmin kcache stamp arch_opt build_flags=""
  kv=$(gpu_kokkos_src_version "$kokkos_src")
  [ -n "$kv" ] || die "--kokkos-src $kokkos_src: no Kokkos version in its CMakeLists.txt"
  kopts=$(gpu_kokkos_options "$kokkos_src")
  kmaj=${kv%%.*} kmin=$(echo "$kv" | cut -d. -f2)
  kcache=$cache/kokkos-$kv-cuda$cuda_major-sm$GPU_ARCH
  kstage=$kcache/stage$GPU_KOKKOS
  compat_flags=""
  if [ "${cuda_major:-0}" -ge 13 ] && { [ "$kmaj" -lt 4 ] || { [ "$kmaj" -eq 4 ] && [ "$kmin" -lt 7 ]; }; }; then
    compat_flags="-include $GPU_KOKKOS/include/trident_cuda13_compat.h"
    # Kokkos' own sources: the header from the cache (nothing is written to $GPU_PREFIX here)
    build_flags="-include $kcache/compat/trident_cuda13_compat.h"
  fi
  stamp="$kv $nvcc_version $(sha256sum "$root/scripts/gpu/cuda13_compat.h" | cut -c1-16) ${compat_flags:+compat} $kopts"
  if [ "$(cat "$kcache/.stamp" 2>/dev/null)" != "$stamp" ]; then
    gpu_log "gpu_kit: building Kokkos $kv for CUDA (sm_$GPU_ARCH) in $kcache (outside the repository)"
    rm -rf "$kcache"
    mkdir -p "$kcache/compat"
    cp "$root/scripts/gpu/cuda13_compat.h" "$kcache/compat/trident_cuda13_compat.h"
    arch_opt=$(case $GPU_ARCH in 90) echo HOPPER90 ;; 80) echo AMPERE80 ;; 89) echo ADA89 ;; 100) echo BLACKWELL100 ;;
               *) die "no Kokkos architecture option known for sm_$GPU_ARCH" ;; esac)
    cmake -S "$kokkos_src" -B "$kcache/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$GPU_KOKKOS" \
      -DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_SERIAL=ON -DKokkos_ARCH_"$arch_opt"=ON \
      -DKokkos_ENABLE_COMPILE_AS_CMAKE_LANGUAGE=ON -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CXX_STANDARD=17 \
      -DBUILD_SHARED_LIBS=ON -DKokkos_ENABLE_TESTS=OFF -DKokkos_ENABLE_EXAMPLES=OFF $kopts \
      ${build_flags:+"-DCMAKE_CUDA_FLAGS=$build_flags"} >"$kcache/configure.log" 2>&1 ||
      { tail -n 30 "$kcache/configure.log"; die "Kokkos configure failed ($kcache/configure.log)"; }
    cmake --build "$kcache/build" -j "$jobs" >"$kcache/build.log" 2>&1 ||
      { grep -m 20 -E 'error' "$kcache/build.log"; die "Kokkos build failed ($kcache/build.log)"; }
    DESTDIR=$kcache/stage cmake --install "$kcache/build" >/dev/null
    [ -n "$compat_flags" ] && cp "$root/scripts/gpu/cuda13_compat.h" "$kstage/include/trident_cuda13_compat.h"
    # the install must not name the place it was built or staged in (it is used from both)
    if grep -rlI -e "$kcache" "$kstage" >/dev/null 2>&1; then
      die "the staged Kokkos install names its build directory ($(grep -rlI -e "$kcache" "$kstage" | head -n 3 | paste -sd' ')): not relocatable"
    fi
    echo "$stamp" >"$kcache/.stamp"
  fi
  ln -sfn "$kstage" "$cache/cuda-kokkos-sm$GPU_ARCH"
}

# cached_cudnn_frontend: the frontend's include/ (and licence) copied from --cudnn-frontend-src into
# the cache once per version, and the link $cache/cudnn-frontend to it; without the option, the link
# made earlier. Sets fe_dir (empty: none).
cached_cudnn_frontend() {
  local v
  fe_dir=""
  if [ -n "$cudnn_fe_src" ]; then
    v=$(gpu_cudnn_fe_version "$cudnn_fe_src") || die "--cudnn-frontend-src $cudnn_fe_src has no include/cudnn_frontend_version.h"
    if [ ! -f "$cache/cudnn-frontend-$v/include/cudnn_frontend.h" ]; then
      rm -rf "$cache/cudnn-frontend-$v"
      mkdir -p "$cache/cudnn-frontend-$v"
      cp -r "$cudnn_fe_src/include" "$cache/cudnn-frontend-$v/"
      cp "$cudnn_fe_src"/LICENSE* "$cache/cudnn-frontend-$v/" 2>/dev/null || true
    fi
    ln -sfn "cudnn-frontend-$v" "$cache/cudnn-frontend"
  fi
  [ -f "$cache/cudnn-frontend/include/cudnn_frontend.h" ] && fe_dir=$(readlink -f "$cache/cudnn-frontend")
  return 0
}

# ---- 0. what this needs here --------------------------------------------------------------------
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$nvcc" ] || die "nvcc not found (the CUDA toolkit, /usr/local/cuda)"
nvcc_version=$(gpu_nvcc_version "$nvcc")
cuda_major=${nvcc_version%%.*}
if [ $kokkos_only -eq 1 ]; then
  for c in cmake g++ sha256sum; do command -v "$c" >/dev/null || die "'$c' is needed"; done
  [ -n "$kokkos_src" ] || die "--kokkos-only needs --kokkos-src DIR (a Kokkos 4.x source tree)"
  mkdir -p "$cache"
  cached_cuda_kokkos
  cached_cudnn_frontend
  gpu_log "gpu_kit: the cuDNN frontend: ${fe_dir:-none (cuda_build skips without it: pass --cudnn-frontend-src DIR)}"
  gpu_log "gpu_kit: the cached CUDA Kokkos is $cache/cuda-kokkos-sm$GPU_ARCH -> $kstage ($(du -sm "$kstage" | cut -f1) MiB, $(( $(date +%s) - t0 )) s)"
  if [ $prewarm -eq 1 ]; then
    # the CTest cuda_build once, without its time limit: a cold build can take longer than CTest
    # allows on a small machine; what it compiles stays in its build directory and ccache
    gpu_log "gpu_kit: warming cuda_build's build directory and ccache: one run of tests/cuda/cuda_build.sh (--no-prewarm skips it)"
    rc=0
    CUDA_BUILD_LIMIT=0 JOBS=$jobs CUDA_ARCH=$GPU_ARCH TRIDENT_GPU_CACHE=$cache bash "$root/tests/cuda/cuda_build.sh" "$root" || rc=$?
    case $rc in
      0) gpu_log "gpu_kit: cuda_build is warm ($(( $(date +%s) - t0 )) s in all)" ;;
      77) gpu_log "gpu_kit: cuda_build skipped (reason above): its cache is not warmed" ;;
      *) gpu_log "gpu_kit: warning: the warming run of cuda_build failed (exit $rc, reason above); the Kokkos is ready," \
           "and what did compile is cached" ;;
    esac
  fi
  exit 0
fi
for c in cmake apt-get dpkg dpkg-deb xz tar g++; do command -v "$c" >/dev/null || die "'$c' is needed"; done
[ -x "$host_build/apps/pretrain_gpt" ] || die "no host build in $host_build (bash scripts/bootstrap.sh build)"
[ -n "$kokkos_src$kokkos_root" ] || die "give --kokkos-src DIR (a Kokkos 4.x source tree) or --kokkos-root DIR (a CUDA Kokkos install)"
mkdir -p "$cache" "$kit"
kit=$(cd "$kit" && pwd)
gpu_log "gpu_kit: kit $kit, prefix $GPU_PREFIX, sm_$GPU_ARCH, nvcc $nvcc_version, cache $cache"

# ---- 1. sample data and the host's reference losses --------------------------------------------
bash "$root/data/prepare_sample.sh" --out "$root/data/sample" --bin "$host_build/apps" >/dev/null
ref=$cache/reference
mkdir -p "$ref"
digest_host=$(gpu_source_digest "$root")
# the runs gpu_check.sh repeats on the GPU in fp32 (dropout off), here on the host
if [ "$(cat "$ref/.digest" 2>/dev/null)" != "$digest_host" ]; then
  rm -f "$ref"/*.csv
  OMP_NUM_THREADS=$jobs gpu_host_reference "$root" "$host_build" "$ref" || die "host reference runs failed"
  echo "$digest_host" >"$ref/.digest"
fi
phase "sample data and host reference losses ready"

# ---- 2. Debian packages -> $GPU_DEPS -------------------------------------------------------------
# Runtime: every library the CUDA build and mpiexec load, found with ldd on the host build and
# mapped to its package (glibc, libstdc++/libgcc and CUDA's own libraries excluded: the GPU
# machine has its own, and newer). Development: what a rebuild there needs.
runtime_pkgs() {
  local f
  {
    for f in "$host_build"/apps/* "$host_build"/tests/unit/test_* /usr/bin/mpiexec.hydra /usr/bin/hydra_pmi_proxy \
             /usr/lib/x86_64-linux-gnu/ucx/*.so*; do
      [ -f "$f" ] && [ -x "$f" -o "${f%.so*}" != "$f" ] || continue
      ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $3}'
    done
  } | sort -u | while read -r lib; do
    # merged /usr: a package may have registered the file under /lib or under /usr/lib
    lib=$(readlink -f "$lib")
    { dpkg -S "$lib" 2>/dev/null || dpkg -S "${lib/#\/usr\/lib\//\/lib\/}" 2>/dev/null ||
      echo "gpu_kit: warning: no package owns $lib; not carried" >&2; } | cut -d: -f1 | cut -d, -f1
  done | sort -u | { grep -v -E '^(libc6|libstdc\+\+6|libgcc-s1|libgomp1|libdnnl2|libopenblas.*|ocl-icd-libopencl1|libtrilinos-.*)$' || true; }
}
dev_pkgs=(mpich libmpich12 libmpich-dev libucx0 libhwloc15 libhdf5-mpich-103-1 libhdf5-mpich-dev
          libboost-program-options1.74.0 libboost-program-options1.74-dev libboost1.74-dev
          libicu72 libicu-dev libgtest-dev nlohmann-json3-dev zlib1g-dev liblzma-dev libzstd-dev
          libsentencepiece0 libsentencepiece-dev)
mapfile -t pkgs < <( (runtime_pkgs; printf '%s\n' "${dev_pkgs[@]}") | sort -u)
debs=$cache/debs
mkdir -p "$debs"
missing=()
# the archive's candidate versions (an installed one may have come from elsewhere: the same
# sonames, maybe another patch level)
for p in "${pkgs[@]}"; do
  ls "$debs/${p}_"*.deb >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  sandbox=()
  [ "$(id -u)" = 0 ] && sandbox=(-o APT::Sandbox::User=root)  # root: no _apt user to hand the files to
  (cd "$debs" && apt-get "${sandbox[@]}" download -q "${missing[@]}" >/dev/null) || die "apt-get download ${missing[*]} failed"
fi
rm -rf "$GPU_DEPS"
mkdir -p "$GPU_DEPS"
# marks this prefix as a kit workspace: gpu_check.sh refuses to unpack a kit over it
echo "assembled by scripts/gpu_kit.sh from $root" >"$GPU_PREFIX/.kit-workspace"
for p in "${pkgs[@]}"; do
  deb=$(ls -t "$debs/${p}_"*.deb | head -n1)
  dpkg -x "$deb" "$GPU_DEPS"
done
printf '%s\n' "${pkgs[@]}" >"$cache/deps.list"
# prune: documentation, static archives (but GoogleTest's), Fortran, HDF5's C++ bindings
rm -rf "$GPU_DEPS"/usr/share/{doc,man,lintian,info,bug} "$GPU_DEPS"/etc/init.d
find "$GPU_DEPS" -name '*.a' ! -name 'libgtest*.a' ! -name 'libgmock*.a' -delete
find "$GPU_DEPS" \( -name '*fortran*' -o -name '*.mod' -o -name '*.f90' \) -exec rm -rf {} + 2>/dev/null || true
# Boost: only the headers Trident's sources reach, as g++ and as nvcc see them (the CUDA build
# compiles them as CUDA: other compiler configs), all of boost/config, and Boost's CMake configs
boost_keep=$(mktemp)
grep -rhoE '#include <boost/[^>]+>' "$root"/src "$root"/apps "$root"/tests 2>/dev/null | sort -u >"$boost_keep.cpp"
if [ -s "$boost_keep.cpp" ]; then
  {
    g++ -std=c++17 -M -I"$GPU_DEPS/usr/include" "$boost_keep.cpp"
    "$nvcc" -std=c++17 -M -x cu -I"$GPU_DEPS/usr/include" "$boost_keep.cpp"
  } >"$boost_keep.d" || die "listing the Boost headers Trident includes failed"
  { tr ' \\' '\n\n' <"$boost_keep.d" | grep "^$GPU_DEPS/usr/include/boost/"
    find "$GPU_DEPS/usr/include/boost/config" -type f; } | sort -u >"$boost_keep"
  find "$GPU_DEPS/usr/include/boost" -type f | grep -v -x -F -f "$boost_keep" | xargs rm -f
  find "$GPU_DEPS/usr/include/boost" -type d -empty -delete
fi
rm -f "$boost_keep" "$boost_keep.cpp" "$boost_keep.d"
# unversioned names for every library (what -lX finds when a wrapper lists it)
(cd "$GPU_LIBDIR" && for f in lib*.so.*; do
  b=${f%%.so.*}.so
  [ -e "$b" ] || [ -L "$b" ] || ln -s "$f" "$b"
done)
# wrappers: Debian's paths -> the kit's prefix; the plain names CMake's modules look for
for w in mpicc.mpich mpicxx.mpich mpic++.mpich h5pcc.mpich h5c++.mpich; do
  f=$GPU_DEPS/usr/bin/$w
  [ -f "$f" ] || continue
  sed -i -e "s#=/usr#=$GPU_DEPS/usr#g" -e "s#=\"/usr#=\"$GPU_DEPS/usr#g" -e "s#=/etc/mpich#=$GPU_DEPS/etc/mpich#g" \
         -e "s# /usr/bin/# $GPU_DEPS/usr/bin/#g" -e "s#-L/usr/lib#-L$GPU_DEPS/usr/lib#g" -e "s#-I/usr/include#-I$GPU_DEPS/usr/include#g" "$f"
done
(cd "$GPU_DEPS/usr/bin" && for n in mpicc mpicxx mpiexec h5pcc; do
  case $n in mpiexec) t=mpiexec.hydra ;; *) t=$n.mpich ;; esac
  [ -e "$t" ] && ln -sf "$t" "$n"
done)
phase "Debian packages: ${#pkgs[@]} unpacked into $GPU_DEPS ($(du -sm "$GPU_DEPS" | cut -f1) MiB)"

# ---- 3. CUDA-enabled Kokkos -> $GPU_KOKKOS --------------------------------------------------------
compat_flags=""
if [ -n "$kokkos_root" ]; then
  [ -d "$kokkos_root/include" ] || die "--kokkos-root $kokkos_root has no include/"
  grep -rqs "Kokkos_ENABLE_CUDA\b.*ON\|KOKKOS_ENABLE_CUDA" "$kokkos_root"/include/KokkosCore_config.h ||
    die "--kokkos-root $kokkos_root is not a CUDA-enabled Kokkos (KokkosCore_config.h has no KOKKOS_ENABLE_CUDA)"
  rm -rf "$GPU_KOKKOS"
  mkdir -p "$GPU_PREFIX"
  cp -a "$kokkos_root" "$GPU_KOKKOS"
else
  cached_cuda_kokkos
  rm -rf "$GPU_KOKKOS"
  mkdir -p "$GPU_PREFIX"
  cp -a "$kstage" "$GPU_KOKKOS"
fi
# the flags every source compiled against this Kokkos needs (read back by gpu_check.sh)
echo "$compat_flags" >"$GPU_KOKKOS/trident_cuda_flags"
phase "Kokkos (CUDA) in $GPU_KOKKOS ($(du -sm "$GPU_KOKKOS" | cut -f1) MiB)${compat_flags:+, with the CUDA 13 compat header}"

# the cuDNN frontend's headers -> $GPU_CUDNN_FE (gpu_configure passes them to CMake)
cached_cudnn_frontend
[ -n "$fe_dir" ] || die "no cuDNN frontend: pass --cudnn-frontend-src DIR (a source tree of NVIDIA/cudnn-frontend, e.g. the search tool's fetch of it), once per machine"
rm -rf "$GPU_CUDNN_FE"
cp -r "$fe_dir" "$GPU_CUDNN_FE"
phase "cuDNN frontend $(gpu_cudnn_fe_version "$GPU_CUDNN_FE") in $GPU_CUDNN_FE ($(du -sm "$GPU_CUDNN_FE" | cut -f1) MiB)"

# ---- 4. Trident's CUDA build, against the kit -----------------------------------------------------
gpu_env
digest=$(gpu_source_digest "$root")
gpu_configure "$root" "$GPU_BUILD" ${compat_flags:+"-DCMAKE_CUDA_FLAGS=$compat_flags"} \
  -DPython3_EXECUTABLE=/usr/bin/python3 >"$cache/trident-configure.log" 2>&1 ||
  { tail -n 40 "$cache/trident-configure.log"; die "configuring Trident's CUDA build against the kit failed"; }
targets=("${GPU_APPS[@]}" gemm_roofline trident_kernel_timer)
for t in "$root"/tests/unit/test_*.cpp; do targets+=("$(basename "${t%.cpp}")"); done
cmake --build "$GPU_BUILD" -j "$jobs" --target "${targets[@]}" >"$cache/trident-build.log" 2>&1 ||
  { grep -m 20 -E 'error' "$cache/trident-build.log"; die "Trident's CUDA build failed ($cache/trident-build.log)"; }
# every library resolves, but the GPU driver's libcuda.so.1 (only a GPU machine has it)
unresolved=$(ldd "$GPU_BUILD/apps/pretrain_gpt" | grep "not found" | grep -v "libcuda\.so\.1" || true)
[ -z "$unresolved" ] || die "pretrain_gpt has unresolved libraries: $(echo "$unresolved" | tr -s ' \t' ' ' | paste -sd' ')"
phase "Trident CUDA build in $GPU_BUILD (sources $digest)"

# ---- 5. pack --------------------------------------------------------------------------------------
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pack() {  # NAME DIR [paths relative to DIR...]
  local name=$1 dir=$2
  shift 2
  tar -C "$dir" -cf - "$@" | xz -T"$jobs" -9 >"$stage/$name.tar.xz"
}
pack deps "$GPU_PREFIX" deps
pack kokkos "$GPU_PREFIX" kokkos cudnn-frontend
build_files=(build/CMakeCache.txt build/src/libtrident_core.so build/perf/gemm_roofline build/perf/libtrident_kernel_timer.so)
for a in "${GPU_APPS[@]}"; do build_files+=("build/apps/$a"); done
for t in "$root"/tests/unit/test_*.cpp; do build_files+=("build/tests/unit/$(basename "${t%.cpp}")"); done
strip --strip-unneeded "${build_files[@]/#/$GPU_PREFIX/}" 2>/dev/null || true
pack build "$GPU_PREFIX" "${build_files[@]}"
mkdir -p "$stage/data/sample" "$stage/data/reference"
(cd "$root/data/sample" && cp --parents gpt2/encoder.json gpt2/vocab.bpe bert/vocab.txt kjv_gpt2_*.h5 kjv_bert_*.h5 kjv_t5_*.h5 "$stage/data/sample/")
cp "$ref"/*.csv "$stage/data/reference/"
tar -C "$stage" -cf - data | xz -T"$jobs" -9 >"$stage/data.tar.xz"
rm -rf "$stage/data"
{
  echo "made=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) ($(. /etc/os-release && echo "$PRETTY_NAME"))"
  echo "prefix=$GPU_PREFIX"
  echo "arch=$GPU_ARCH"
  echo "nvcc=$nvcc_version"
  echo "kokkos=$(gpu_kokkos_install_version "$GPU_KOKKOS")"
  echo "cuda_flags=$compat_flags"
  echo "sources=$digest"
  echo "git=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo none)$(git -C "$root" diff --quiet HEAD -- 2>/dev/null || echo +changes)"
  echo "packages=$(paste -sd' ' "$cache/deps.list")"
  for p in "${GPU_KIT_PARTS[@]}"; do echo "part=$p.tar.xz $(sha256sum "$stage/$p.tar.xz" | cut -d' ' -f1) $(stat -c %s "$stage/$p.tar.xz")"; done
} >"$stage/MANIFEST"
total=$(du -cb "$stage"/* | tail -n1 | cut -f1)
mib=$(( (total + 1048575) / 1048576 ))
[ "$mib" -le "$max_mib" ] || { du -h "$stage"/*; die "the kit is $mib MiB, over --max-mib $max_mib"; }
rm -rf "${kit:?}"/*
mv "$stage"/* "$kit/"
du -h "$kit"/* | sed 's/^/  /'
phase "kit in $kit: $mib MiB (limit $max_mib)"
gpu_log "gpu_kit: done in $(( $(date +%s) - t0 )) s; carry it with the device tool: carry [\".gpu_kit\"], then bash scripts/gpu_check.sh \$OUT"
