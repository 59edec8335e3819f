#!/usr/bin/env bash
# The host kernels built for another CPU level than this build's, and their unit tests run (CTest
# host_arch_<ARCH>, label host_arch). The suite's own build targets TRIDENT_HOST_ARCH (native by
# default), so on an AVX-512 machine the kernels' AVX2 code, what a compute node without AVX-512
# runs, would never be compiled nor checked. This script configures a second build of the same
# tree with -DTRIDENT_HOST_ARCH=ARCH, builds the unit tests of the host kernels, checks that the
# core's objects and the tests have no AVX-512 instruction (zmm registers) and that the core has
# AVX (ymm) ones where ARCH is x86-64-v3, and runs the tests.
#
#   bash tests/host_arch/host_arch_build.sh ROOT MAIN_BUILD [ARCH]     (ARCH default x86-64-v3)
#
# The second build lives in MAIN_BUILD/host-arch-ARCH and is kept between runs (only what changed
# is compiled again); with Debian's ccache its objects are cached in
# ~/.cache/trident/ccache-host-arch (paths relative to ROOT, so a fresh clone at another path hits
# the cache). Exit status: 0 when everything built and passed, 1 otherwise, 77 (skipped,
# with the reason) when the main build's host code is already compiled without AVX-512 (as
# -march=native on an AVX2 CPU): then the suite's unit tests run these paths themselves.
set -uo pipefail
root=$(cd "$1" && pwd)
main=$(cd "$2" && pwd)
arch=${3:-x86-64-v3}
jobs=${JOBS:-2}
skip() { echo "host_arch: skipped: $*"; exit 77; }
fail() { echo "host_arch: FAILED: $*" >&2; exit 1; }
# shellcheck source=../unit_runs.sh
. "$root/tests/unit_runs.sh"
t0=$(date +%s)
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$main/CMakeCache.txt"; }
main_arch=$(cache_value TRIDENT_HOST_ARCH)
cxx=$(cache_value CMAKE_CXX_COMPILER)
[ -n "$cxx" ] || fail "$main/CMakeCache.txt names no C++ compiler"
march() { [ "$1" = none ] || [ -z "$1" ] || echo "-march=$1"; }
defines() { echo | "$cxx" $(march "$1") -dM -E -x c++ - ; }
if ! defines "$main_arch" | grep -q '__AVX512F__'; then
  skip "this build's host code (TRIDENT_HOST_ARCH=${main_arch:-unset}) is already compiled without AVX-512," \
    "so the suite's own unit tests run its non-AVX-512 paths"
fi
defines "$arch" >/dev/null 2>&1 || fail "$cxx does not accept -march=$arch"

# the unit tests of the host kernels: every op, the host-thread helpers, fused kernels, the layer
# variants, fused attention, dropout, the 16-bit conversions, the model (AdamW included)
tests=(test_ops test_host_parallel test_fused test_layer_variants test_flash_attention test_dropout test_half test_model)
build=$main/host-arch-$arch
launcher=""
cache_note="no ccache"
if command -v ccache >/dev/null 2>&1; then
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/trident/ccache-host-arch
  mkdir -p "$cache" && CCACHE_DIR=$cache ccache --set-config=max_size="${HOST_ARCH_CCACHE_SIZE:-2G}" &&
    launcher="env;CCACHE_DIR=$cache;CCACHE_BASEDIR=$root;ccache" && cache_note="ccache $cache"
fi
echo "host_arch: building ${tests[*]} with -DTRIDENT_HOST_ARCH=$arch in $build ($jobs jobs, $cache_note)"
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTRIDENT_HOST_ARCH="$arch" \
     -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" >"$build.configure.log" 2>&1; then
  tail -30 "$build.configure.log" >&2
  fail "configure (log: $build.configure.log)"
fi
grep -q "^TRIDENT_MARCH_OK_.*:INTERNAL=1" "$build/CMakeCache.txt" || fail "the second build did not take -march=$arch"
if ! cmake --build "$build" -j "$jobs" --target "${tests[@]}" >"$build.build.log" 2>&1; then
  grep -m 20 -E "error|Error" "$build.build.log" >&2
  fail "build (log: $build.build.log)"
fi
echo "host_arch: built in $(($(date +%s) - t0)) s"

status=0
# what the compiler emitted for this level: the core's objects (the kernels) use AVX registers
# (ymm) where the level has AVX2, and no AVX-512 register (zmm) appears in them or in the tests
objects=$(find "$build/src" -name '*.o' | sort)
[ -n "$objects" ] || fail "no object files of the core under $build/src"
# shellcheck disable=SC2086
core_ymm=$(objdump -d --no-show-raw-insn $objects | grep -c '%ymm')
# shellcheck disable=SC2086
core_zmm=$(objdump -d --no-show-raw-insn $objects | grep -c '%zmm')
echo "host_arch: the core's $(echo "$objects" | wc -l) objects: $core_ymm instructions on ymm, $core_zmm on zmm"
if [ "$core_zmm" -ne 0 ]; then
  echo "host_arch: the core has $core_zmm instructions on AVX-512 registers (zmm) under -march=$arch" >&2
  status=1
fi
if [ "$arch" = x86-64-v3 ] && [ "$core_ymm" -eq 0 ]; then
  echo "host_arch: the core has no AVX (ymm) instruction under -march=$arch: the flag did not reach the kernels" >&2
  status=1
fi
for t in "${tests[@]}"; do
  exe=$build/tests/unit/$t
  [ -x "$exe" ] || fail "$exe was not built"
  zmm=$(objdump -d --no-show-raw-insn "$exe" | grep -c '%zmm')
  if [ "$zmm" -ne 0 ]; then
    echo "host_arch: $t has $zmm instructions on AVX-512 registers (zmm) under -march=$arch" >&2
    status=1
  fi
  run_unit host_arch "$exe" "$build/$t.log" || status=1
done
echo "host_arch: $([ $status -eq 0 ] && echo PASS || echo FAIL) for -march=$arch in $(($(date +%s) - t0)) s"
exit $status
