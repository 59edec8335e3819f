#!/usr/bin/env bash
# scripts/gpu_check.sh's phases after the GPU boundary (unit, train, llama, moe, bench, profile, ncu,
# and the extra ones), rehearsed on the host so that a rare GPU run does not find the script's own
# mistakes: a stand-in nvidia-smi (one "GPU", no device is used) and a stand-in ncu (checks the
# options it is given, runs the command, writes one kernel's rows), the host build in place of the
# kit's CUDA build, the host's fp32 reference losses made here. Asserts that every phase passes,
# that the fp32 runs equal the reference bit for bit (the same executable and inputs), that bf16
# stays within its band, that the benchmark picked its micro-batches from the memory model and
# reported a row per shape and attention path (a GPT and a Llama shape), and that the profile named
# three kernels, which the ncu phase profiled.
# The unit phase runs every unit-test executable with its first test only (GTEST_FILTER): the
# phase's loop, its counts and its note are rehearsed; the suite itself runs every unit test.
#   gpu_check_logic.sh REPO BUILD WORKDIR
set -euo pipefail
root=$1 build=$2 work=$3
rm -rf "$work"
mkdir -p "$work/bin"
cat >"$work/bin/nvidia-smi" <<'SMI'
#!/bin/sh
# stand-in for gpu_check.sh's logic rehearsal: reports one GPU, runs nothing
case "$*" in
  -L) echo "GPU 0: Stand-in GPU (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
  *memory.total,driver_version,clocks*) echo "Stand-in GPU, 16384 MiB, 0.0, 0 MHz" ;;
  *memory.total,driver_version*) echo "Stand-in GPU, 16384 MiB, 0.0" ;;
  *memory.total*) echo "Stand-in GPU, 16384" ;;
  *) exit 1 ;;
esac
SMI
chmod +x "$work/bin/nvidia-smi"
cat >"$work/bin/ncu" <<'NCU'
#!/usr/bin/env bash
# stand-in Nsight Compute for gpu_check.sh's logic rehearsal: checks the options the ncu phase
# gives, runs the profiled command as ncu would, and writes one kernel's SpeedOfLight rows as CSV
set -euo pipefail
log="" label="" clock=""
while [ $# -gt 0 ]; do
  case $1 in
    --nvtx|--csv) shift ;;
    --clock-control) clock=$2; shift 2 ;;
    --nvtx-include) label=$2; shift 2 ;;
    --log-file) log=$2; shift 2 ;;
    --launch-count|--section) shift 2 ;;
    -*) echo "stand-in ncu: unexpected option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ "$clock" = none ] || { echo "stand-in ncu: --clock-control none expected" >&2; exit 2; }
case $label in ?*/) ;; *) echo "stand-in ncu: --nvtx-include LABEL/ expected, got '$label'" >&2; exit 2 ;; esac
[ "${TRIDENT_KERNEL_TIMER_NVTX:-}" = 1 ] || { echo "stand-in ncu: TRIDENT_KERNEL_TIMER_NVTX=1 expected" >&2; exit 2; }
"$@"
{
  echo '==PROF== Disconnected from process'
  echo '"ID","Kernel Name","Grid Size","Block Size","Section Name","Metric Name","Metric Unit","Metric Value"'
  for m in "Duration,us,12.5" "Compute (SM) Throughput,%,41.0" "Memory Throughput,%,77.0" "DRAM Throughput,%,70.5"; do
    IFS=, read -r name unit value <<<"$m"
    echo "\"0\",\"stand_in_kernel(${label%/})\",\"(132, 1, 1)\",\"(256, 1, 1)\",\"GPU Speed Of Light Throughput\",\"$name\",\"$unit\",\"$value\""
  done
} >"$log"
NCU
chmod +x "$work/bin/ncu"
export TRIDENT_GPU_PREFIX=$work/prefix   # nothing of a real kit is touched
# 10 iterations instead of 50 per band run: the logic is the same, the numbers are not the point here
export GPU_BAND_ITERS=10
# shellcheck source=scripts/gpu_common.sh
source "$root/scripts/gpu_common.sh"
gpu_host_reference "$root" "$build" "$work/reference"
filter="" n_unit=0
for t in "$build"/tests/unit/test_*; do
  [ -x "$t" ] && [ -f "$t" ] || continue
  case $t in *.cmake) continue ;; esac
  list=$("$t" --gtest_list_tests)
  first=$(awk '/^[^ ]/ {s = $1} /^  / {print s $1; exit}' <<<"$list")
  [ -n "$first" ] || { echo "gpu_check_logic: FAIL: $(basename "$t") lists no test"; exit 1; }
  filter+=${filter:+:}$first
  n_unit=$((n_unit + 1))
done
[ "$n_unit" -gt 0 ] || { echo "gpu_check_logic: FAIL: no unit-test executable in $build/tests/unit"; exit 1; }
set +e
GTEST_FILTER=$filter PATH=$work/bin:$PATH GPU_CHECK_NO_KIT=1 GPU_CHECK_BUILD_DIR=$build GPU_CHECK_REFERENCE_DIR=$work/reference \
  GPU_CHECK_WORK=$work/check GPU_CHECK_RESULTS_DIR= PYTHON=${PYTHON:-/usr/bin/python3} GPU_CHECK_BUDGET=2400 \
  GPU_CHECK_UNIT_LIMIT=600 GPU_CHECK_TRAIN_LIMIT=900 GPU_CHECK_LLAMA_LIMIT=300 GPU_CHECK_MOE_LIMIT=300 GPU_CHECK_BENCH_LIMIT=600 \
  GPU_CHECK_PROFILE_LIMIT=300 GPU_CHECK_NCU_LIMIT=300 GPU_CHECK_EXTRA=1 GPU_CHECK_LONG_SEQ=1024 GPU_CHECK_LONG_LIMIT=300 \
  GPU_CHECK_PROFILE_ARGS="--model.num_layers 2 --model.hidden_size 128 --model.num_heads 4 --model.seq_length 64 \
--model.max_position_embeddings 64 --train.micro_batch_size 2 --train.global_batch_size 2" \
  GPU_CHECK_BENCH_ARGS="--shapes smoke,llama-smoke --attention flash,unfused --seq 64 --max-micro-batch 2 --iters 3 --warmup 1 --no-torch" \
  bash "$root/scripts/gpu_check.sh" "$work/out" >"$work/gpu_check.log" 2>&1
rc=$?
set -e
fail() { echo "gpu_check_logic: FAIL: $*"; tail -n 40 "$work/gpu_check.log"; exit 1; }
[ $rc -eq 0 ] || fail "gpu_check.sh exited $rc"
report=$work/out/report.md
for ph in start gpu unit train llama moe bench profile ncu long; do
  grep -q "^| $ph | ok |" "$report" || fail "phase $ph did not pass"
done
grep -q "Stopped" "$report" && fail "the run stopped early"
grep -q "^| train | ok | [0-9]* | 7 of 7 comparisons pass |" "$report" || fail "the train phase's note does not say 7 of 7"
grep -q "^| llama | ok | [0-9]* | 3 of 3 comparisons pass |" "$report" || fail "the llama phase's note does not say 3 of 3"
grep -q "^| profile | ok | [0-9]* | heaviest kernels: [^,]*, [^,]*, [^,]* |" "$report" ||
  fail "the profile phase's note does not name three kernels"
grep -q "^| ncu | ok | [0-9]* | 3 kernels profiled |" "$report" || fail "the ncu phase's note does not say 3 kernels"
grep -q "^| moe | ok | [0-9]* | 5 of 5 MoE comparisons pass |" "$report" || fail "the moe phase's note does not say 5 of 5"
grep -q "^| long | ok | [0-9]* | 1 of 1 comparisons pass; fp32: [0-9]* tok/s; [0-9]* ms/iteration;bf16: " "$report" ||
  fail "the long phase's note does not say 1 of 1 and the speeds"
grep -q "^| unit | ok | [0-9]* | $n_unit passed, 0 failed |" "$report" || fail "the unit phase's note"
[ "$(grep -c -E ' exit +0  passed +1  failed +0$' "$work/out/unit.txt")" -eq "$n_unit" ] ||
  fail "unit.txt: not every one of the $n_unit unit-test executables ran its one test"
grep -q "^| bench | ok | [0-9]* | 4 rows |" "$report" || fail "the bench phase's note does not say 4 rows"
n=$(ls "$work/out" | wc -l)
[ "$n" -le 10 ] || fail "$n files in the output folder (at most 10 come back from the GPU machine)"
"${PYTHON:-/usr/bin/python3}" - "$work/out" <<'PY' || fail "results"
import csv, json, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(f"{out}/train.csv")))
fp32 = [r for r in rows if r["comparison"] == "fp32 GPU vs fp32 host" and r["app"] != "moe"]
assert sorted(r["app"] for r in fp32) == ["bert", "gpt", "t5"], fp32
for r in fp32:  # the same executable on the same inputs: the same losses, digit for digit
    assert float(r["worst relative loss difference"]) == 0.0 and r["steps"] == "10", r
band = [r for r in rows if r["comparison"].startswith("bf16") and r["app"] != "moe"]
assert len(band) == 4 and all(r["pass"] == "True" for r in band), band
for r in band:  # bf16 really ran: not equal to fp32
    assert 0.0 < float(r["worst relative loss difference"]) <= 2.0 ** -9, r
moe = [r for r in rows if r["app"] == "moe"]  # fp32 loss and metrics equal the host's, bf16 in its band
assert [r["comparison"] for r in moe][0] == "fp32 GPU vs fp32 host" and len(moe) == 5, moe
assert all(float(r["worst relative loss difference"]) == 0.0 for r in moe[:4]) and moe[0]["steps"] == "10", moe
assert 0.0 < float(moe[4]["worst relative loss difference"]) <= 2.0 ** -9, moe[4]
bench = json.load(open(f"{out}/bench.json"))
res = bench["results"]
assert [(r["shape"], r["attention"]) for r in res] == [("smoke", "flash"), ("llama-smoke", "flash"), ("smoke", "unfused"),
                                                       ("llama-smoke", "unfused")], res
for r in res:
    if r["shape"] == "smoke":  # the memory model's choice; the Llama stacks run --llama-micro-batch
        assert r["model_micro_batch"] == 2 and r["trident"]["micro_batch"] == 2, r
    else:
        assert r["trident"]["micro_batch"] == 1 and r["groups"] == 2, r
    assert r["trident"]["tokens_per_s"] > 0 and len(r["trident"]["losses"]) == 3, r
profile = json.load(open(f"{out}/profile.json"))
assert profile["kernels"] and "adamw_step" in profile["skip"], profile.get("skip")
prof = open(f"{out}/profile.md").read()
assert prof.count("\n| ") >= 5 and "ms / step" in prof, prof
ncu = open(f"{out}/ncu.md").read()
assert ncu.count("stand_in_kernel(") == 3 and "77.0 %" in ncu, ncu
llama = list(csv.DictReader(open(f"{out}/llama.csv")))
assert [r["comparison"] for r in llama[:3]] == ["fp32 GPU vs fp32 host", "bf16 vs fp32 GPU", "bf16 + flash vs fp32 GPU"]
assert float(llama[0]["worst relative loss difference"]) == 0.0 and llama[0]["steps"] == "10", llama[0]
for r in llama[1:3]:
    assert 0.0 < float(r["worst relative loss difference"]) <= 2.0 ** -9, r
long = [r for r in llama if r["model"] == "long"]  # the long-sequence phase's rows, after the Llama phase's
assert [r["comparison"] for r in long][0] == "1024 tokens: bf16 vs fp32 GPU" and len(long) == 3, long
assert 0.0 < float(long[0]["worst relative loss difference"]) <= 2.0 ** -9 and long[0]["steps"] == "4", long[0]
unit = open(f"{out}/unit.txt").read()
assert "failed    0" in unit and "passed" in unit, unit
print("gpu_check_logic: every phase passed; fp32 equal to the reference on gpt, bert, t5; bf16 within 2^-9:",
      ", ".join(f"{r['app']}{' flash' if 'flash' in r['comparison'] else ''} {float(r['worst relative loss difference']):.2e}" for r in band))
PY
echo "gpu_check_logic: PASS"
