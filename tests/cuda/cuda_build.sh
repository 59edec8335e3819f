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
# are printed), 77 (skipped, with the reason) without a toolkit, NCCL or a CUDA Kokkos, or outside
# a git checkout.
#
# One build directory is reused between runs, so that only what changed is compiled again:
# $TRIDENT_GPU_CACHE/cuda-build-sm<arch>/ holds a mirror of the tree (src/) and its build
# (build/). Before each build the mirror is made equal to the tree as git lists it (tracked and
# untracked-not-ignored files; removed files are removed); a file is rewritten only when its bytes
# differ, so the build tool's own dependency tracking (compiler depfiles, headers included)
# decides what is rebuilt. A change of Kokkos, nvcc, architecture or generator starts a clean
# build. Runs on one machine are serialised by a lock.
set -uo pipefail
root=$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")/../..}" && pwd)
# shellcheck source=scripts/gpu_common.sh
source "$root/scripts/gpu_common.sh"
arch=$GPU_ARCH
jobs=${JOBS:-$(nproc)}
cache=$GPU_CACHE
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
  flock -w 1800 9 || fail "another cuda_build has held $work/.lock for half an hour"
fi
# what the objects depend on beyond the sources: the Kokkos install (path and configuration), the
# toolkit, the architecture, the generator and the flags
stamp="kokkos=$kokkos $(cat "$kokkos"/include/KokkosCore_config.h "$kokkos"/lib*/cmake/Kokkos/KokkosConfig*.cmake 2>/dev/null |
  sha256sum | cut -c1-16) nvcc=$nvcc $nvcc_version arch=$arch gen=${gen[*]:-make} flags=$cuda_flags"
if [ "$(cat "$work/stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "cuda_build: a clean build ($([ -f "$work/stamp" ] && echo "the toolkit, Kokkos, architecture or generator changed" || echo "none yet") in $work)"
  rm -rf "$work/build" "$work/src"
  echo "$stamp" >"$work/stamp"
fi
echo "cuda_build: nvcc $nvcc_version ($nvcc), sm_$arch, Kokkos $(gpu_kokkos_install_version "$kokkos") ($kokkos)${cuda_flags:+, CUDA 13 compat header}, $jobs jobs"

# ---- the mirror ----------------------------------------------------------------------------------
"$python" "$root/tests/mirror_tree.py" "$root" "$work/src" cuda_build || fail "mirroring $root into $work/src failed"

# ---- configure and build -------------------------------------------------------------------------
log=$work/build.log
if ! cmake -S "$work/src" -B "$work/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DTRIDENT_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DCUDAToolkit_ROOT="$cuda_home" -DBUILD_SHARED_LIBS=ON -UKokkos_DIR -DKokkos_ROOT="$kokkos" \
    "-DCMAKE_CUDA_FLAGS=$cuda_flags" -DPython3_EXECUTABLE="$python" -DNCCL_LIBRARY="$nccl_lib" -DNCCL_INCLUDE_DIR="$nccl_inc" \
    >"$work/configure.log" 2>&1; then
  tail -n 40 "$work/configure.log"
  fail "configuring the CUDA build failed (log: $work/configure.log)"
fi
t1=$(date +%s)
cmake --build "$work/build" -j "$jobs" >"$log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  # the first errors with their context, and the targets that failed
  grep -n -E -B2 -A6 '(error|Error)[: ]' "$log" | head -n 80
  grep -E '^(FAILED:|make.*Error)' "$log" | head -n 20
  fail "the CUDA build failed (exit $rc; log: $log)"
fi
built=$(grep -c -E '^\[ *[0-9]+(/[0-9]+\]|%\]) (Building|Linking)' "$log")
echo "cuda_build: passed: every target built with -DTRIDENT_ENABLE_CUDA=ON ($built files compiled or linked this run," \
  "mirror and configure $((t1 - t0)) s, build $(( $(date +%s) - t1 )) s; log $log)"
