#!/usr/bin/env bash
# Runs one libFuzzer harness for a fixed number of executions from its seed corpus, with a fixed
# seed (the same inputs every time); new inputs go to a scratch directory, never into the seeds.
# usage: run_fuzzer.sh BUILD_DIR NAME RUNS SEED_DIR... ; exit 77 (skipped) when not built.
set -uo pipefail
build=$1 name=$2 runs=$3
shift 3
exe="$build/$name"
[ -x "$exe" ] || { echo "skipped: $exe was not built (fuzz_build: clang++ or libFuzzer missing)"; exit 77; }
seeds=()
for d in "$@"; do seeds+=("$(cd "$d" && pwd)"); done
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LSAN_OPTIONS="suppressions=$here/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
work="$build/work_$name"
rm -rf "$work" && mkdir -p "$work/new" "$work/crashes"
cd "$work"
# libFuzzer's own failure code is 77, CTest's skip code: report failures as 1
"$exe" -runs="$runs" -seed=1 -max_len=4096 -timeout=30 -rss_limit_mb=4096 -error_exitcode=1 -timeout_exitcode=1 \
  -artifact_prefix="$work/crashes/" -print_final_stats=1 "$work/new" "${seeds[@]}" >"$work/log" 2>&1
rc=$?
grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ +DONE)" "$work/log"
if [ "$rc" -ne 0 ]; then
  tail -n 60 "$work/log"
  echo "$name: FAILED (exit $rc); reproducer(s): $(ls "$work/crashes" 2>/dev/null | tr '\n' ' ')"
  exit 1
fi
echo "$name: $runs executions, no crash, no sanitizer report, no failed property"
