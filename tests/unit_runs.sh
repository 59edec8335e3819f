# Sourced by the scripts that build a second tree of the project and run its unit executables
# (tests/host_arch/host_arch_build.sh, tests/device_on_host/device_on_host.sh).
#
#   run_unit NAME EXE LOG   runs one GoogleTest executable on one thread, its output in LOG, and
#                           prints "NAME: <executable> passed (N tests from M test suites ran)", or
#                           the log's tail and "FAILED"; returns 0 or 1
run_unit() {
  local name=$1 exe=$2 log=$3 t
  t=$(basename "$exe")
  if OMP_NUM_THREADS=1 "$exe" --gtest_brief=1 >"$log" 2>&1; then
    echo "$name: $t passed ($(grep -m1 -o '[0-9]* tests\? from [0-9]* test suites\? ran' "$log"))"
    return 0
  fi
  tail -40 "$log" >&2
  echo "$name: $t FAILED (log: $log)" >&2
  return 1
}
