#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz/CMakeLists.txt) with clang++ into BUILD_DIR.
# usage: build_fuzzers.sh SOURCE_DIR BUILD_DIR CORE_LIB [LINK_LIBRARY...]
# Exit 77 (CTest: skipped) with the reason when clang++ or libFuzzer is missing.
set -euo pipefail
src=$1 out=$2 core=$3
shift 3
links=$(IFS=';'; echo "$*")
command -v clang++ >/dev/null 2>&1 || { echo "skipped: clang++ not found (scripts/bootstrap.sh test installs clang and libclang-rt-14-dev)"; exit 77; }
mkdir -p "$out"
probe="$out/probe.cpp"
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe"
if ! clang++ -fsanitize=fuzzer,address,undefined "$probe" -o "$out/probe" >"$out/probe.log" 2>&1; then
  echo "skipped: clang++ cannot link libFuzzer (install libclang-rt-14-dev): $(tail -n 2 "$out/probe.log")"
  exit 77
fi
# One build directory is kept between runs ($TRIDENT_FUZZ_CACHE, default ~/.cache/trident-fuzz):
# the sources (src/ and tests/fuzz/) are mirrored there, a file written only when its bytes
# changed (tests/mirror_tree.py), so that a new clone recompiles only what differs from the last
# build and relinks against its own core library; the harnesses are then copied into BUILD_DIR.
# Where the cache cannot be used (no git, no writable home), everything is built in BUILD_DIR.
cache=${TRIDENT_FUZZ_CACHE:-${HOME:-/nonexistent}/.cache/trident-fuzz}
python=$(command -v /usr/bin/python3 || command -v python3 || true)
if [ -n "$python" ] && git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1 && mkdir -p "$cache" 2>/dev/null; then
  exec 9>"$cache/.lock"
  command -v flock >/dev/null 2>&1 && { flock -w 900 9 || { echo "another fuzz_build holds $cache/.lock"; exit 1; }; }
  "$python" "$src/tests/mirror_tree.py" "$src" "$cache/src" fuzz_build src tests/fuzz || exit 1
  tree=$cache/src bdir=$cache/build
else
  tree=$src bdir=$out
fi
cmake -S "$tree/tests/fuzz" -B "$bdir" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DTRIDENT_SOURCE_DIR="$tree" -DTRIDENT_CORE_LIB="$core" -DTRIDENT_CORE_LINK="$links" >"$out/configure.log" 2>&1 ||
  { cat "$out/configure.log"; exit 1; }
cmake --build "$bdir" -j "${JOBS:-2}"
if [ "$bdir" != "$out" ]; then
  for exe in "$bdir"/fuzz_*; do
    [ -f "$exe" ] && [ -x "$exe" ] && cp -f "$exe" "$out/"
  done
fi
