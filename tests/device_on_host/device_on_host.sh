#!/usr/bin/env bash
# The kernels' device layouts run on the host (CTest device_on_host, label device_on_host): CI has no
# GPU, so the branches a CUDA build takes (common/device_parallel.hpp kDeviceKernels: a warp per
# row, two-pass column sums, the fused attention's device kernels, the optimizer's one value per
# thread) would otherwise never run before a GPU is lent. This script configures a second build of
# the same tree with -DTRIDENT_DEVICE_KERNELS_ON_HOST=ON, builds the unit tests of the kernels,
# pretrain_gpt and pretrain_bert, runs the unit tests (each checks its kernels against a definition
# or finite differences), and trains GPT, Llama, MoE and BERT tiny decks in both builds, comparing
# the losses and gradient norms of every iteration: the device layouts add in other orders than the
# host's, so they agree to rounding, not bitwise. Last, it profiles the device path's launches and
# waits per training step (perf/step_profile.py) at GPT-2 124M and Llama-3-8B shapes and holds them
# to their budgets.
#
#   bash tests/device_on_host/device_on_host.sh ROOT MAIN_BUILD
#
# The second build lives in MAIN_BUILD/device-on-host and is kept between runs; with Debian's
# ccache its objects are cached in ~/.cache/trident/ccache-device-on-host (paths relative to ROOT, so
# a fresh clone at another path hits the cache). Exit status: 0 when everything built and passed,
# 1 otherwise.
set -uo pipefail
root=$(cd "$1" && pwd)
main=$(cd "$2" && pwd)
jobs=${JOBS:-2}
fail() { echo "device_on_host: FAILED: $*" >&2; exit 1; }
# shellcheck source=../unit_runs.sh
. "$root/tests/unit_runs.sh"
t0=$(date +%s)
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$main/CMakeCache.txt"; }
cxx=$(cache_value CMAKE_CXX_COMPILER)
[ -n "$cxx" ] || fail "$main/CMakeCache.txt names no C++ compiler"
python=$(cache_value Python3_EXECUTABLE)
[ -n "$python" ] || python=/usr/bin/python3
[ -x "$main/apps/pretrain_gpt" ] || fail "$main/apps/pretrain_gpt is not built"

launcher=""
cache_note="no ccache"
if command -v ccache >/dev/null 2>&1; then
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/trident/ccache-device-on-host
  mkdir -p "$cache" && CCACHE_DIR=$cache ccache --set-config=max_size="${DEVICE_ON_HOST_CCACHE_SIZE:-2G}" &&
    launcher="env;CCACHE_DIR=$cache;CCACHE_BASEDIR=$root;ccache" && cache_note="ccache $cache"
fi
tests=(test_ops test_fused test_flash_attention test_grouped_attention test_packed_sequences test_ring_attention test_layer_variants test_dropout test_moe test_model test_model_families test_device_parallel)
build=$main/device-on-host
echo "device_on_host: building ${tests[*]} pretrain_gpt pretrain_bert with -DTRIDENT_DEVICE_KERNELS_ON_HOST=ON in $build" \
  "($jobs jobs, $cache_note)"
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTRIDENT_DEVICE_KERNELS_ON_HOST=ON \
  -DTRIDENT_HOST_ARCH="$(cache_value TRIDENT_HOST_ARCH)" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" >"$build.configure.log" 2>&1; then
  tail -30 "$build.configure.log" >&2
  fail "configure (log: $build.configure.log)"
fi
grep -q "^TRIDENT_DEVICE_KERNELS_ON_HOST:BOOL=ON" "$build/CMakeCache.txt" || fail "the second build did not take the option"
if ! cmake --build "$build" -j "$jobs" --target "${tests[@]}" pretrain_gpt pretrain_bert trident_kernel_timer >"$build.build.log" 2>&1; then
  grep -m 20 -E "error|Error" "$build.build.log" >&2
  fail "build (log: $build.build.log)"
fi
echo "device_on_host: built in $(($(date +%s) - t0)) s"

status=0
for t in "${tests[@]}"; do
  exe=$build/tests/unit/$t
  [ -x "$exe" ] || fail "$exe was not built"
  run_unit device_on_host "$exe" "$build/$t.log" || status=1
done

# training: the same deck in the host build and in this one
OMP_NUM_THREADS=1 "$python" "$root/tests/device_on_host/compare_training.py" --root "$root" \
  --host-app "$main/apps/pretrain_gpt" --device-app "$build/apps/pretrain_gpt" --work "$build/training" || status=1
# the device path's structure per step (perf/step_profile.py): launches per layer and waits per step
# within the budgets of docs/DESIGN.md "Waiting for the device"
profile() {
  local name=$1
  shift
  if OMP_NUM_THREADS=1 "$python" "$root/perf/step_profile.py" --build-dir "$build" --work "$build/profile_$name" \
    --out "$build/profile_$name.json" --max-launches-per-layer "${LAUNCH_BUDGET:-40}" \
    --max-waits-per-step "${WAIT_BUDGET:-4}" "$@" >"$build/profile_$name.log" 2>&1; then
    echo "device_on_host: step profile $name: $("$python" -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(', '.join(f'{k} {d[k]:g}' for k in ('launches_per_step', 'launches_per_layer', 'library_calls_per_step', \
'waits_per_step')))" "$build/profile_$name.json") (budgets: ${LAUNCH_BUDGET:-40} launches per layer, ${WAIT_BUDGET:-4} waits per step)"
  else
    tail -30 "$build/profile_$name.log" >&2
    echo "device_on_host: step profile $name FAILED (log: $build/profile_$name.log)" >&2
    status=1
  fi
}
# 4 of the decks' layers: launches per layer and waits per step do not depend on the layer count
# GPT-2 124M with the fused attention, which the GPU runs through cuDNN (the cudnn entry; the
# unfused attention's launches per layer, 19, are in perf/results/step_profile_2026-12-07.md)
profile gpt2_124m_cudnn --deck "$root/inputs/gpt2_124m.ini" --micro-batch 16 --layers 4 \
  --set model.flash_attention true
profile llama3_8b --deck "$root/inputs/llama3_8b.ini" --micro-batch 1 --layers 4
echo "device_on_host: $([ $status -eq 0 ] && echo PASS || echo FAIL) in $(($(date +%s) - t0)) s"
exit $status
