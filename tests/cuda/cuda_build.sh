#!/usr/bin/env bash
# The CUDA build check (CTest `cuda_build`, label `cuda`): configures and builds every target of
# Trident (apps, libraries, unit and MPI tests, perf tools) with -DTRIDENT_ENABLE_CUDA=ON, against
# this machine's CUDA toolkit and a CUDA-enabled Kokkos, so that a change that breaks the GPU path
# fails on a machine without a GPU. Nothing runs on a GPU here; it is a compile and link check.
#
#   bash tests/cuda/cuda_build.sh [ROOT]        (ROOT: the source tree, default this script's)
#
# The Kokkos: $TRIDENT_CUDA_KOKKOS (a CUDA-enabled install), else the cached one that
#   bash scripts/gpu_kit.sh --kokkos-only --kokkos-src <Kokkos 4.x source tree>
# builds once per machine ($TRIDENT_GPU_CACHE, default ~/.cache/trident-gpu, link cuda-kokkos-sm90).
# The toolkit: $CUDACXX, else nvcc on PATH, else /usr/local/cuda/bin/nvcc; NCCL next to it.
# Exit status: 0 when everything built, 1 when the configure or the build failed (its first errors
# are printed) or did not finish in time (the lock, the limit below), 77 (skipped, with the
# reason) without a toolkit, NCCL, a CUDA Kokkos or the cuDNN frontend's headers (the cudnn attention
# entry, ops/sdpa_cudnn_cuda.cpp, compiles against them), or outside a git checkout.
#
# One build directory is reused between runs, so that only what changed is compiled again:
# $TRIDENT_GPU_CACHE/cuda-build-sm<arch>/ holds a mirror of the tree (src/) and its build
# (build/). Before each build the mirror is made equal to the tree as git lists it (tracked and
# untracked-not-ignored files; removed files are removed); a file is rewritten only when its bytes
# differ, so the build tool's own dependency tracking (compiler depfiles, headers included)
# decides what is rebuilt. A change of Kokkos, nvcc, architecture, flags or generator starts a
# clean build. Runs on one machine are serialised by a lock.
#
# Debian's ccache, where installed, launches the host and the CUDA compiler, with its cache in
# $TRIDENT_GPU_CACHE/ccache (at most $CUDA_BUILD_CCACHE_SIZE, default 5G): a lost build directory
# or a change undone costs cache look-ups, not compiles. Without ccache it builds all the same and
# says so.
#
# The flags are the cheapest that still take every translation unit through nvcc's whole front
# end (cudafe++ and cicc: device code to PTX) and the host compiler, and link every target: device
# code as PTX for compute_<arch> only (-DCMAKE_CUDA_ARCHITECTURES=<arch>-virtual: no SASS, ptxas
# does not compile), host code at -O0 (Release otherwise: -DNDEBUG), no debug information. What
# this cannot see: ptxas' errors and resource limits (registers, shared memory, stack), problems
# in SASS only, warnings and errors the host compiler gives only when optimising. The GPU kit's
# build (scripts/gpu_kit.sh, and gpu_check.sh's rebuild on the GPU machine) still compiles SASS
# for sm_<arch> at -O3.
#
# Time: the whole run, the wait for the lock included, ends within $CUDA_BUILD_LIMIT seconds
# (default 1140, under CTest's 1200; 0: no limit, as the GPU kit's pre-warm runs it); the lock is
# waited for at most 600 s. A build cut short fails with the reason; what it compiled is kept (build
# directory and ccache), so the next run goes on from there.
set -uo pipefail
root=$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")/../..}" && pwd)
# shellcheck source=scripts/gpu_common.sh
source "$root/scripts/gpu_common.sh"
arch=$GPU_ARCH
jobs=${JOBS:-$(nproc)}
cache=$GPU_CACHE
limit=${CUDA_BUILD_LIMIT:-1140}
lock_wait=600
skip() { echo "cuda_build: skipped: $*"; exit 77; }
fail() { echo "cuda_build: FAILED: $*" >&2; exit 1; }
t0=$(date +%s)

# ---- the toolkit and the Kokkos ------------------------------------------------------------------
nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || skip "no CUDA toolkit (nvcc not on PATH nor at /usr/local/cuda/bin/nvcc; set CUDACXX)"
nvcc_version=$(gpu_nvcc_version "$nvcc")
cuda_home=$(cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd)
export CUDA_HOME=$cuda_home  # the toolkit's libraries first where NCCL is looked for
if [ -n "${TRIDENT_CUDA_KOKKOS:-}" ]; then
  kokkos=$TRIDENT_CUDA_KOKKOS
  [ -d "$kokkos" ] || fail "TRIDENT_CUDA_KOKKOS=$kokkos does not exist"
else
  kokkos=$cache/cuda-kokkos-sm$arch
  [ -d "$kokkos" ] || skip "no CUDA-enabled Kokkos: TRIDENT_CUDA_KOKKOS is unset and the cache has none ($kokkos);" \
    "make it once with: bash scripts/gpu_kit.sh --kokkos-only --kokkos-src <Kokkos 4.x source tree>"
fi
kokkos=$(readlink -f "$kokkos")
# the cuDNN frontend (header-only) for the cudnn attention entry: $TRIDENT_CUDNN_FRONTEND, else the
# cached one gpu_kit.sh --cudnn-frontend-src keeps
cudnn_fe=${TRIDENT_CUDNN_FRONTEND:-$cache/cudnn-frontend}
[ -f "$cudnn_fe/include/cudnn_frontend.h" ] || skip "no cuDNN frontend ($cudnn_fe/include/cudnn_frontend.h);" \
  "cache it once with: bash scripts/gpu_kit.sh --kokkos-only --kokkos-src <Kokkos source> --cudnn-frontend-src <cudnn-frontend source>"
cudnn_fe=$(readlink -f "$cudnn_fe")
grep -qs "^#define KOKKOS_ENABLE_CUDA" "$kokkos/include/KokkosCore_config.h" ||
  fail "$kokkos is not a CUDA-enabled Kokkos install (include/KokkosCore_config.h defines no KOKKOS_ENABLE_CUDA)"
# NCCL as the GPU kit finds it (the toolkit's, a PyTorch wheel's, ldconfig's)
nccl_lib=$(gpu_find_cuda_lib libnccl.so libnccl.so.2) || skip "no NCCL (libnccl.so) next to the CUDA toolkit $cuda_home"
nccl_inc=$(gpu_nccl_include "$nccl_lib") || skip "no nccl.h next to $nccl_lib"
# a Kokkos before 4.7 built against CUDA 13 by the GPU kit: its sources and Trident's
# force-include the compat header it carries (scripts/gpu/cuda13_compat.h)
cuda_flags=""
[ -f "$kokkos/include/trident_cuda13_compat.h" ] && cuda_flags="-include $kokkos/include/trident_cuda13_compat.h"
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
python=${PYTHON3:-$(command -v /usr/bin/python3 || command -v python3)}
[ -n "$python" ] || skip "no python3 to mirror the tree with"
git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1 || skip "$root is not a git checkout (the mirror copies the files git lists)"

work=$cache/cuda-build-sm$arch
mkdir -p "$work" || fail "cannot create $work"
exec 9>"$work/.lock"
if command -v flock >/dev/null 2>&1; then
  [ "$limit" -gt 0 ] && [ "$limit" -lt $((2 * lock_wait)) ] && lock_wait=$((limit / 2))
  flock -w "$lock_wait" 9 ||
    fail "timed out after $lock_wait s waiting for the lock $work/.lock: another cuda_build (or the GPU kit's" \
      "pre-warm) is building there; run again when it is done"
fi
# what the objects depend on beyond the sources: the Kokkos install (path and configuration), the
# toolkit, the architecture, the generator and the flags
stamp="kokkos=$kokkos $(cat "$kokkos"/include/KokkosCore_config.h "$kokkos"/lib*/cmake/Kokkos/KokkosConfig*.cmake 2>/dev/null |
  sha256sum | cut -c1-16) nvcc=$nvcc $nvcc_version arch=$arch-virtual host=-O0 gen=${gen[*]:-make} flags=$cuda_flags"
if [ "$(cat "$work/stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "cuda_build: a clean build ($([ -f "$work/stamp" ] && echo "the toolkit, Kokkos, architecture, flags or generator changed" || echo "none yet") in $work)"
  rm -rf "$work/build" "$work/src"
  echo "$stamp" >"$work/stamp"
fi
# the compiler cache
ccache_dir=$cache/ccache
launcher=""
if command -v ccache >/dev/null 2>&1 && mkdir -p "$ccache_dir"; then
  # a new host compiler behind nvcc misses the cache (ccache itself sees only nvcc)
  CCACHE_DIR=$ccache_dir ccache --set-config=max_size="${CUDA_BUILD_CCACHE_SIZE:-5G}" &&
    CCACHE_DIR=$ccache_dir ccache --set-config=compiler_check="string:nvcc $nvcc_version, $(gcc --version 2>/dev/null | head -n1), $(c++ --version 2>/dev/null | head -n1)" &&
    CCACHE_DIR=$ccache_dir ccache --zero-stats >/dev/null &&
    launcher="env;CCACHE_DIR=$ccache_dir;ccache"
fi
ccache_note="ccache $ccache_dir"
[ -n "$launcher" ] || { ccache_note="no ccache"; echo "cuda_build: no ccache (Debian package ccache): building without a compiler cache"; }
echo "cuda_build: nvcc $nvcc_version ($nvcc), PTX for compute_$arch (no SASS), host -O0, $ccache_note, Kokkos $(gpu_kokkos_install_version "$kokkos") ($kokkos)${cuda_flags:+, CUDA 13 compat header}, $jobs jobs"

# ---- the mirror ----------------------------------------------------------------------------------
"$python" "$root/tests/mirror_tree.py" "$root" "$work/src" cuda_build || fail "mirroring $root into $work/src failed"

# ---- configure and build -------------------------------------------------------------------------
log=$work/build.log
# the flags: see the top of this file
if ! cmake -S "$work/src" -B "$work/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    "-DCMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG" "-DCMAKE_CUDA_FLAGS_RELEASE=-O0 -DNDEBUG" \
    -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" -DCMAKE_CUDA_COMPILER_LAUNCHER="$launcher" \
    -DTRIDENT_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch-virtual" -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DCUDAToolkit_ROOT="$cuda_home" -DBUILD_SHARED_LIBS=ON -UKokkos_DIR -DKokkos_ROOT="$kokkos" \
    "-DCMAKE_CUDA_FLAGS=$cuda_flags" -DPython3_EXECUTABLE="$python" -DNCCL_LIBRARY="$nccl_lib" -DNCCL_INCLUDE_DIR="$nccl_inc" \
    -DTRIDENT_CUDNN_FRONTEND="$cudnn_fe" >"$work/configure.log" 2>&1; then
  tail -n 40 "$work/configure.log"
  fail "configuring the CUDA build failed (log: $work/configure.log)"
fi
t1=$(date +%s)
bound=()
if [ "$limit" -gt 0 ]; then
  left=$((limit - (t1 - t0)))
  [ "$left" -ge 60 ] || fail "$((t1 - t0)) s of the $limit s limit (CUDA_BUILD_LIMIT) went on the lock, mirror and configure; no time left to build"
  bound=(timeout -k 15 "$left")
fi
"${bound[@]}" cmake --build "$work/build" -j "$jobs" >"$log" 2>&1
rc=$?
stats() {  # this run's ccache hits and misses
  [ -n "$launcher" ] || return 0
  CCACHE_DIR=$ccache_dir ccache --print-stats 2>/dev/null | awk '
    $1 ~ /_cache_hit$/ {h += $2} $1 == "cache_miss" {m = $2} END {printf "; ccache: %d hits, %d misses", h, m}'
}
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
  at=$(grep -oE '^\[[0-9]+/[0-9]+\]' "$log" | tail -n1)
  fail "the build did not finish within the $limit s limit (CUDA_BUILD_LIMIT; $(( $(date +%s) - t1 )) s of building$(stats)${at:+, stopped at step $at})." \
    "What it compiled is kept, so the next run goes on from there; a cold cache takes" \
    "longer than CTest allows on a small machine: warm it once with 'CUDA_BUILD_LIMIT=0 bash tests/cuda/cuda_build.sh'" \
    "(scripts/gpu_kit.sh --kokkos-only does that after making the Kokkos)"
fi
if [ $rc -ne 0 ]; then
  # the first errors with their context, and the targets that failed
  grep -n -E -B2 -A6 '(error|Error)[: ]' "$log" | head -n 80
  grep -E '^(FAILED:|make.*Error)' "$log" | head -n 20
  fail "the CUDA build failed (exit $rc; log: $log)"
fi
built=$(grep -c -E '^\[ *[0-9]+(/[0-9]+\]|%\]) (Building|Linking)' "$log")
echo "cuda_build: passed: every target built with -DTRIDENT_ENABLE_CUDA=ON ($built files compiled or linked this run," \
  "mirror and configure $((t1 - t0)) s, build $(( $(date +%s) - t1 )) s$(stats); log $log)"
