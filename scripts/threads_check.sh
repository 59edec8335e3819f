#!/usr/bin/env bash
# The race check: Trident built against a Kokkos whose host execution space is OpenMP, and the
# unit and MPI suites run with several threads per rank (CTest label `threads`). A kernel that
# scatters without atomics or reads what another thread writes fails there as it would on a GPU,
# where no GPU is at hand.
#
#   bash scripts/threads_check.sh --kokkos-src DIR [--threads N] [--build DIR] [--jobs N] [--record]
#     --kokkos-src  a Kokkos 4.x source tree; built with OpenMP outside the repository, in
#                   $TRIDENT_GPU_CACHE (default ~/.cache/trident-gpu)/kokkos-openmp-<version>
#     --kokkos-root or an OpenMP-enabled Kokkos install to use as it is
#     --threads     threads per rank (default 4; on 2 cores 2 ranks x 4 threads oversubscribe, which
#                   makes interleavings more varied)
#     --build       the build directory (default build-threads)
#     --record      write the summary to perf/results/threads_check_<date>.md
# Exit status: that of ctest -L threads.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kokkos_src="" kokkos_root="" threads=4 build=$root/build-threads jobs=$(nproc) record=0
while [ $# -gt 0 ]; do
  case "$1" in
    --kokkos-src) kokkos_src=$2; shift 2 ;;
    --kokkos-root) kokkos_root=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --record) record=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "threads_check: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
die() { echo "threads_check: error: $*" >&2; exit 1; }
# shellcheck source=scripts/gpu_common.sh
source "$root/scripts/gpu_common.sh"
cache=$GPU_CACHE
t0=$(date +%s)
if [ -z "$kokkos_root" ]; then
  [ -f "$kokkos_src/CMakeLists.txt" ] || die "give --kokkos-src DIR (a Kokkos 4.x source tree) or --kokkos-root DIR"
  kv=$(gpu_kokkos_src_version "$kokkos_src")
  kopts=$(gpu_kokkos_options "$kokkos_src")
  kcache=$cache/kokkos-openmp-$kv${kopts:+-legacy-view}
  kokkos_root=$kcache/install
  if [ ! -f "$kcache/.done" ]; then
    echo "threads_check: building Kokkos $kv with OpenMP in $kcache (outside the repository)"
    rm -rf "$kcache"
    mkdir -p "$kcache"
    cmake -S "$kokkos_src" -B "$kcache/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$kokkos_root" \
      -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_SERIAL=ON -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON \
      -DKokkos_ENABLE_TESTS=OFF $kopts >"$cache/kokkos-openmp-configure.log" 2>&1 || die "Kokkos configure failed"
    cmake --build "$kcache/build" -j "$jobs" >"$cache/kokkos-openmp-build.log" 2>&1 || die "Kokkos build failed"
    cmake --install "$kcache/build" >/dev/null
    touch "$kcache/.done"
  fi
fi
echo "threads_check: Trident against $kokkos_root in $build, $threads threads per rank"
mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -UKokkos_DIR -DKokkos_ROOT="$kokkos_root" \
  -DTRIDENT_TEST_THREADS="$threads" >"$build/threads_configure.log" 2>&1 ||
  { tail -n 30 "$build/threads_configure.log"; die "configure failed"; }
grep -q "tests labelled .threads." "$build/threads_configure.log" || die "the Kokkos at $kokkos_root runs no host threads (OpenMP)"
cmake --build "$build" -j "$jobs" >"$build/threads_build.log" 2>&1 || { grep -m 20 error "$build/threads_build.log"; die "build failed"; }
t1=$(date +%s)
set +e
(cd "$build" && ctest -L threads --output-on-failure -j 1 2>&1 | tee "$build/threads_ctest.log")
rc=${PIPESTATUS[0]}
set -e
if [ $record -eq 1 ]; then
  # one file a day; each run adds its section
  rec=$root/perf/results/threads_check_$(date +%Y-%m-%d).md
  [ -f "$rec" ] || printf '# Race checks (Kokkos with OpenMP), %s\n' "$(date +%Y-%m-%d)" >"$rec"
  {
    echo
    echo "## $threads threads per rank, $(date +%H:%M): $(grep -E 'tests passed' "$build/threads_ctest.log" | tail -n1)"
    echo
    echo "\`bash scripts/threads_check.sh --threads $threads --record\` on $(uname -n) ($(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')):"
    echo "Kokkos $(gpu_kokkos_install_version "$kokkos_root") with OpenMP and Serial, built outside the repository${kopts:+ with $kopts};"
    echo "build $((t1 - t0)) s, \`ctest -L threads\` $(( $(date +%s) - t1 )) s: each unit-test executable whole and every MPI test"
    echo "(tests/mpi's layout, precision and BERT/T5 checks) with OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=passive."
    echo
    echo '```'
    grep -E "tests passed|Test +#|Failed|\*\*\*" "$build/threads_ctest.log" | sed 's/ \+/ /g'
    echo '```'
  } >>"$rec"
  echo "threads_check: recorded $rec"
fi
exit "$rc"
