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
cmake -S "$src/tests/fuzz" -B "$out" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DTRIDENT_SOURCE_DIR="$src" -DTRIDENT_CORE_LIB="$core" -DTRIDENT_CORE_LINK="$links" >"$out/configure.log" 2>&1 ||
  { cat "$out/configure.log"; exit 1; }
cmake --build "$out" -j "${JOBS:-2}"
