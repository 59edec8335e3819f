#!/usr/bin/env bash
# The GPU checks of the CUDA backend, as one script for a GPU machine that has only the kit
# (.gpu_kit/, made by scripts/gpu_kit.sh) and its own image: nvcc, CMake, a python3 with torch.
#
#   bash scripts/gpu_check.sh OUTDIR
#
# Phases, each under its own time limit, all within GPU_CHECK_BUDGET seconds (default 420: the
# 7 minutes of a 15-minute GPU loan left after the machine's start, the transfers and a rerun):
#   kit        check the kit's manifest and checksums, unpack it into /tmp/trident-gpu and the
#              sample data into data/sample
#   start      the prebuilt apps and tests: every library resolves (ldd) and `--version` runs
#              (MPI starts, nothing touches the GPU); the kit's source digest equals this tree's
#   rebuild    only when the start check fails or the sources differ (or GPU_CHECK_REBUILD=1):
#              configure and build the apps and unit tests here from the kit
#              (GPU_CHECK_REBUILD=configure only configures: a check of the kit's headers,
#              libraries and Kokkos that keeps the prebuilt binaries)
#   gpu        nvidia-smi sees a GPU; without one the script stops here, says so, and exits 0
# 1. Correctness:
#   unit       every unit-test executable on the GPU (ops against host references and finite
#              differences, fused against unfused kernels, bf16 conversions and GEMMs)
#   train      the tiny GPT, BERT and T5 decks for 50 iterations without dropout: fp32 on the GPU
#              against the host's fp32 losses carried in the kit, and for GPT and BERT bf16 and
#              bf16 + flash attention (cuDNN's fused attention, model.attention_backend auto, where
#              the kit has its frontend; BERT's padding as its padding mask) against the GPU's fp32
#              within the bf16 band (2^-9)
#   llama      the Llama-family deck (inputs/llama_tiny_ci.ini: RoPE, RMSNorm, SwiGLU, 4 heads in 2
#              groups, untied) for 50 iterations, fp32 against the host's fp32 losses, bf16 and
#              bf16 + flash attention against the GPU's fp32 within the bf16 band
#   moe        the mixture-of-experts deck (inputs/moe_tiny_ci.ini: llama_tiny_ci with 4 SwiGLU
#              experts per layer, top-2, load-balancing and z losses) for 50 iterations, fp32
#              against the host's fp32 losses and bf16 against the GPU's fp32 within the bf16 band,
#              and the MoE metrics (aux, z, max load) of fp32 against the host's within 1e-3
# 2. Step times against PyTorch on the same GPU:
#   bench      perf/bench_gpu.py: GPT-2 124M, 350M and 1.3B in bf16 (micro-batches from the memory
#              model) and a Llama-3-8B-shaped stack of 4 layers at sequence 4096, with cuDNN's
#              fused attention (model.attention_backend cudnn), then Trident's unfused attention
#              (cuBLAS products) as time allows, against PyTorch eager and, at 124M,
#              torch.compile; it starts no run once only the last two phases' time is left
# 3. Where the time goes:
#   profile    GPT-2 124M bf16 at micro-batch 8 for 4 steps under the kernel timer
#              (perf/kernel_timer.cpp) with CUDA_LAUNCH_BLOCKING=1, the first 2 steps skipped:
#              milliseconds and calls per step of every kernel and cuBLAS call
#              (perf/gpu_profile.py breakdown), and the three heaviest Kokkos kernels
# 4. Why:
#   ncu        Nsight Compute (--clock-control none) on one launch of each of those three kernels,
#              found by the kernel timer's NVTX ranges (TRIDENT_KERNEL_TIMER_NVTX=1): duration,
#              SM and memory throughput (perf/gpu_profile.py ncu); where ncu cannot read the
#              counters (gVisor machines) the phase says so and passes
# With GPU_CHECK_EXTRA=1, after these (budget permitting; raise GPU_CHECK_BUDGET):
#   tensorboard  at most 20 s: TensorBoard's own EventAccumulator reads the fp32 GPT run's
#              log.tensorboard_dir; every train/loss step equals float32 of the metrics file's loss
#   long       at most 45 s: long sequences on one GPU (cp = 1): inputs/llama_long_ci.ini at 32768 tokens
#              (GPU_CHECK_LONG_SEQ), micro-batch 1, fused attention, 4 iterations in fp32 and in bf16:
#              bf16 against fp32 within the bf16 band, and tokens/s and ms per iteration of each (the
#              median after the first), appended to llama.csv
#   hf         optional (skipped when $PYTHON has no transformers): a tiny GPT trained here for 40
#              iterations, exported by convert_checkpoint; transformers' GPT2LMHeadModel
#              (from_pretrained, float32, TF32 off, on the GPU) scores the evaluation mode's windows
#              within 1e-5 of `pretrain_gpt --eval.only` on the GPU (validation/hf_models.py)
#   hf_llama   optional (skipped without transformers), at most 45 s: a tiny Llama 3-style (GQA,
#              llama3 rope scaling) and a Qwen 3-style (q/k norms) directory written by
#              validation/hf_llama.py, imported and exported by convert_checkpoint; transformers'
#              AutoModelForCausalLM (float32, TF32 off, on the GPU) scores each export within 1e-5 of
#              `pretrain_gpt --eval.only` on the GPU, and within 1e-6 of hf_llama.py's own float64 model
# OUTDIR receives at most 10 files: report.md (phases with wall times, results), log.txt (all
# output), unit.txt, train.csv, llama.csv, bench.md, bench.json, profile.md, profile.json, ncu.md.
# The report also goes to perf/results/.
# Exit status: 0 when every phase that ran passed (also when it stopped at the GPU boundary),
# 1 when a phase failed, 2 for a usage error.
#
# For rehearsing the script's own logic on a machine without a GPU (tests/gpu_kit: a stand-in
# nvidia-smi on PATH and the host build): GPU_CHECK_BUILD_DIR=<build> runs that build instead of
# the kit's; GPU_CHECK_NO_KIT=1 skips the kit phase, the sample data being in data/sample and the
# host's losses in GPU_CHECK_REFERENCE_DIR; GPU_CHECK_BENCH_ARGS adds arguments to bench_gpu.py;
# GPU_CHECK_RESULTS_DIR (default perf/results, empty for none) receives copies of the reports;
# GPU_CHECK_{UNIT,TRAIN,LLAMA,MOE,PROFILE,NCU,LONG,HF,HF_LLAMA}_LIMIT change those phases' limits (45, 60,
# 30, 30, 40, 60, 45, 90, 45 s: a GPU's), GPU_CHECK_BENCH_LIMIT the benchmark's (default: what is
# left but the profile and ncu limits); GPU_CHECK_LONG_SEQ the long phase's sequence length;
# GPU_CHECK_PROFILE_ARGS replaces the profile run's shape arguments; GPU_CHECK_NCU (default ncu) is
# the Nsight Compute command.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/gpu_common.sh
source "$root/scripts/gpu_common.sh"
[ $# -ge 1 ] || { echo "usage: bash scripts/gpu_check.sh OUTDIR" >&2; exit 2; }
mkdir -p "$1" || exit 2
out=$(cd "$1" && pwd)
kit=${GPU_KIT:-$root/.gpu_kit}
budget=${GPU_CHECK_BUDGET:-420}
export PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
work=$GPU_PREFIX/work
results=${GPU_CHECK_RESULTS_DIR-$root/perf/results}  # empty: the report stays in OUTDIR only
[ -n "${GPU_CHECK_WORK:-}" ] && work=$GPU_CHECK_WORK
t_start=$(date +%s)
deadline=$((t_start + budget))
exec > >(tee "$out/log.txt") 2>&1

phases=() failed=0 stopped=""
# run_phase NAME LIMIT_S FUNCTION: runs FUNCTION under its own limit, records its wall time
run_phase() {
  local name=$1 limit=$2 fn=$3 t0 rc left
  left=$((deadline - $(date +%s)))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -le 5 ]; then
    phases+=("$name|skipped|0|the budget of ${budget} s is spent")
    gpu_log "== $name: skipped (budget spent)"
    return 1
  fi
  gpu_log "== $name (limit ${limit} s)"
  t0=$(date +%s)
  note=""
  phase_deadline=$((t0 + limit))
  "$fn"
  rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then
    phases+=("$name|ok|$dt|$note")
  elif [ $rc -eq 124 ] || [ "$(date +%s)" -ge "$phase_deadline" ]; then
    phases+=("$name|timed out|$dt|$note")
    failed=1
  else
    phases+=("$name|FAILED|$dt|$note")
    failed=1
  fi
  gpu_log "== $name: ${phases[-1]#*|}"
  return $rc
}
# why a phase failed: printed, and kept for the report
why() { note="$*"; echo "$*"; }
# left in this phase, for the commands inside it
left() { local l=$((phase_deadline - $(date +%s))); [ $l -lt 1 ] && l=1; echo $l; }

write_report() {
  local f=$out/report.md p name st dt nt
  {
    echo "# gpu_check $(date -u +%Y-%m-%d) on $(uname -n)"
    echo
    if [ "${GPU_CHECK_NO_KIT:-0}" = 1 ]; then
      echo "Kit: none (GPU_CHECK_NO_KIT=1); build ${GPU_CHECK_BUILD_DIR:-?}."
    else
      echo "Kit: $(sed -n 's/^made=//p' "$kit/MANIFEST" 2>/dev/null); sources $(sed -n 's/^sources=//p' "$kit/MANIFEST" 2>/dev/null), git $(sed -n 's/^git=//p' "$kit/MANIFEST" 2>/dev/null)."
    fi
    echo "This tree's sources: $(gpu_source_digest "$root"). Budget ${budget} s; total $(( $(date +%s) - t_start )) s."
    [ -n "$stopped" ] && { echo; echo "**Stopped: $stopped**"; }
    echo
    echo "| phase | result | wall s | notes |"
    echo "|---|---|---|---|"
    for p in "${phases[@]}"; do
      IFS='|' read -r name st dt nt <<<"$p"
      echo "| $name | $st | $dt | $nt |"
    done
    for x in unit.txt train.csv llama.csv bench.md profile.md ncu.md; do
      [ -s "$out/$x" ] || continue
      echo; echo "## $x"; echo
      case $x in *.md) sed 's/^# /### /' "$out/$x" ;; *) echo '```'; cat "$out/$x"; echo '```' ;; esac
    done
  } >"$f"
  [ -n "$results" ] && mkdir -p "$results" 2>/dev/null && cp "$f" "$results/gpu_check_$(date -u +%Y-%m-%d).md" 2>/dev/null
  echo
  cat "$f"
}
trap 'write_report' EXIT

# ---- kit ------------------------------------------------------------------------------------------
unpack() {  # TARBALL DIR: with xz where the image has it, else with Python's tarfile
  if command -v xz >/dev/null 2>&1; then
    xz -dc -T0 "$1" | tar -C "$2" -xf -
  else
    "$PYTHON" - "$1" "$2" <<'PY'
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    kw = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
    t.extractall(sys.argv[2], **kw)
PY
  fi
}
phase_kit() {
  [ -f "$kit/MANIFEST" ] || { why "no kit at $kit (make it with scripts/gpu_kit.sh and carry .gpu_kit)"; return 1; }
  local line part sum size
  while read -r line; do
    read -r part sum size <<<"${line#part=}"
    echo "$sum  $kit/$part" | sha256sum -c --quiet - || { why "kit part $part does not match its checksum"; return 1; }
  done < <(grep '^part=' "$kit/MANIFEST")
  [ "$(sed -n 's/^prefix=//p' "$kit/MANIFEST")" = "$GPU_PREFIX" ] || { why "the kit was made for another prefix than $GPU_PREFIX"; return 1; }
  if [ -f "$GPU_PREFIX/.kit-workspace" ]; then
    why "$GPU_PREFIX is where gpu_kit.sh assembles the kit on this machine: not unpacking over it (rehearse with scripts/gpu_rehearsal.sh)"
    return 1
  fi
  rm -rf "$GPU_DEPS" "$GPU_KOKKOS" "$GPU_BUILD" "$work"
  mkdir -p "$GPU_PREFIX" "$work"
  for part in deps kokkos build; do
    unpack "$kit/$part.tar.xz" "$GPU_PREFIX" || { why "unpacking $part.tar.xz failed"; return 1; }
  done
  unpack "$kit/data.tar.xz" "$work" || { why "unpacking data.tar.xz failed"; return 1; }
  mkdir -p "$root/data/sample"
  cp -r "$work/data/sample/." "$root/data/sample/"
  note="$(du -sm "$GPU_PREFIX" | cut -f1) MiB unpacked"
}

# ---- start check ----------------------------------------------------------------------------------
start_check() {  # BUILD
  local b=$1 f bad=0 missing stub lib_path=$LD_LIBRARY_PATH
  # no GPU driver here: the toolkit's stub stands in for libcuda.so.1 in this check only
  if stub=$(gpu_stub_driver_dir); then
    echo "no GPU driver library (libcuda.so.1) here: the start check loads the CUDA toolkit's stub"
    lib_path=$lib_path:$stub
  fi
  for f in "$b"/apps/* "$b"/tests/unit/test_*; do
    [ -x "$f" ] && [ -f "$f" ] || continue
    case $f in *.cmake) continue ;; esac
    missing=$(LD_LIBRARY_PATH=$lib_path ldd "$f" 2>&1 | grep "not found" | awk '{print $1}' | paste -sd' ')
    if [ -n "$missing" ]; then
      echo "$(basename "$f"): $missing not found"
      bad=1
    fi
  done
  [ $bad -eq 0 ] || return 1
  LD_LIBRARY_PATH=$lib_path timeout 30 "$b/apps/pretrain_gpt" --version || { echo "pretrain_gpt --version failed"; return 1; }
}
phase_start() {
  gpu_env
  echo "CUDA library directories: $(gpu_cuda_lib_dirs | paste -sd' ')"
  if [ -n "${GPU_CHECK_BUILD_DIR:-}" ]; then
    GPU_BUILD=$GPU_CHECK_BUILD_DIR
    gpu_env
    start_check "$GPU_BUILD" || return 1
    note="the build in $GPU_BUILD (GPU_CHECK_BUILD_DIR)"
    return 0
  fi
  local want have
  want=$(sed -n 's/^sources=//p' "$kit/MANIFEST")
  have=$(gpu_source_digest "$root")
  if [ "$want" != "$have" ]; then
    note="the kit was built from sources $want, this tree is $have: rebuilding"
    need_rebuild=1
    return 0
  fi
  if ! start_check "$GPU_BUILD"; then
    note="the prebuilt binaries do not start here: rebuilding"
    need_rebuild=1
    return 0
  fi
  note="prebuilt binaries start"
}

# ---- rebuild here -----------------------------------------------------------------------------------
phase_rebuild() {
  local b=$GPU_PREFIX/build-device flags targets=() t
  flags=$(cat "$GPU_KOKKOS/trident_cuda_flags" 2>/dev/null)
  command -v cmake >/dev/null || { why "no cmake here"; return 1; }
  timeout "$(left)" bash -c "source '$root/scripts/gpu_common.sh'; gpu_env; \
    gpu_configure '$root' '$b' ${flags:+\"-DCMAKE_CUDA_FLAGS=$flags\"} -DPython3_EXECUTABLE=\"\$(command -v $PYTHON)\"" ||
    { note="configure failed"; return 1; }
  if [ "${GPU_CHECK_REBUILD:-}" = configure ]; then
    note="configured only (GPU_CHECK_REBUILD=configure); the prebuilt binaries stay in use"
    return 0
  fi
  targets=("${GPU_APPS[@]}" gemm_roofline trident_kernel_timer)
  for t in "$root"/tests/unit/test_*.cpp; do targets+=("$(basename "${t%.cpp}")"); done
  timeout "$(left)" cmake --build "$b" -j "$(nproc)" --target "${targets[@]}" 2>&1 | tee "$work/rebuild.log"
  if [ "${PIPESTATUS[0]}" -ne 0 ]; then
    note="build failed: $(grep -m1 -E 'error|fatal' "$work/rebuild.log" | cut -c1-160 | tr '|' '/')"
    return 1
  fi
  GPU_BUILD=$b
  gpu_env
  start_check "$GPU_BUILD" || return 1
  note="built here in $b"
}

# ---- GPU -----------------------------------------------------------------------------------------------
phase_gpu() {
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    stopped="at the GPU boundary: no NVIDIA GPU here (nvidia-smi -L fails); everything before it passed"
    note="no GPU"
    return 0
  fi
  nvidia-smi -L
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  note="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n1)"
}

# ---- unit tests on the GPU ---------------------------------------------------------------------------------
phase_unit() {
  local t name rc passed failed_n total_fail=0
  : >"$out/unit.txt"
  for t in "$GPU_BUILD"/tests/unit/test_*; do
    [ -x "$t" ] && [ -f "$t" ] || continue
    case $t in *.cmake) continue ;; esac
    name=$(basename "$t")
    timeout "$(left)" "$t" --gtest_brief=1 >"$work/$name.log" 2>&1
    rc=$?
    passed=$(sed -n 's/.*\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$work/$name.log" | tail -n1)
    failed_n=$(sed -n 's/.*\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$work/$name.log" | tail -n1)
    printf '%-24s exit %3d  passed %4s  failed %4s\n' "$name" "$rc" "${passed:-0}" "${failed_n:-0}" | tee -a "$out/unit.txt"
    if [ $rc -ne 0 ]; then
      total_fail=1
      grep -E '^\[  FAILED  \]|Failure|error' "$work/$name.log" | head -n 20 | tee -a "$out/unit.txt"
    fi
  done
  note="$(awk '{p += $5; f += $7} END {print p " passed, " f " failed"}' <(grep 'exit' "$out/unit.txt"))"
  return $total_fail
}

# ---- training on the GPU against the host and within the bf16 band ---------------------------------------
phase_train() {
  local app dtype flash rc=0
  for run in "gpt fp32 false" "gpt bf16 false" "gpt bf16 true" "bert fp32 false" "bert bf16 false" "bert bf16 true" \
             "t5 fp32 false"; do  # the fp32 runs are those of gpu_host_reference (GPU_TRAIN_APPS)
    read -r app dtype flash <<<"$run"
    (cd "$root" && timeout "$(left)" "$GPU_BUILD/apps/pretrain_$app" --deck "inputs/${app}_tiny_ci.ini" \
      $(gpu_band_args) --precision.dtype "$dtype" --model.flash_attention "$flash" \
      --log.metrics_file "$work/${app}_${dtype}_${flash}.csv" \
      $([ "$app $dtype $flash" = "gpt fp32 false" ] && echo --log.tensorboard_dir "$work/tb_gpt")) \
      >"$work/${app}_${dtype}_${flash}.log" 2>&1 ||
      { echo "pretrain_$app $dtype flash=$flash failed:"; tail -n 15 "$work/${app}_${dtype}_${flash}.log"; rc=1; }
  done
  "$PYTHON" - "$work" "$out/train.csv" "${GPU_CHECK_REFERENCE_DIR:-$work/data/reference}" <<'PY' || rc=1
import csv, os, sys
work, dst, ref = sys.argv[1], sys.argv[2], sys.argv[3]
def losses(p):
    return [float(r["loss"]) for r in csv.DictReader(open(p))] if os.path.exists(p) else None
rows, ok = [], True
band_bf16 = 2.0 ** -9
# fp32 on the GPU against fp32 on the host (oneDNN vs cuBLAS summation orders): measured first here
tol_fp32 = float(os.environ.get("GPU_CHECK_FP32_TOL", "1e-4"))
for app in ("gpt", "bert", "t5"):
    gpu, host = losses(f"{work}/{app}_fp32_false.csv"), losses(f"{ref}/{app}_fp32_host.csv")
    if gpu and host and len(gpu) == len(host):
        w = max(abs(g - h) / abs(h) for g, h in zip(gpu, host))
        rows.append((app, "fp32 GPU vs fp32 host", len(gpu), f"{w:.3e}", f"{tol_fp32:.1e}", w <= tol_fp32))
    else:
        rows.append((app, "fp32 GPU vs fp32 host", 0, "missing", f"{tol_fp32:.1e}", False))
    if app == "t5":
        continue
    for flash in ("false", "true"):
        b = losses(f"{work}/{app}_bf16_{flash}.csv")
        what = "bf16" + (" + flash" if flash == "true" else "") + " vs fp32 GPU"
        if gpu and b and len(gpu) == len(b):
            w = max(abs(x - y) / abs(x) for x, y in zip(gpu, b))
            rows.append((app, what, len(b), f"{w:.3e}", f"{band_bf16:.1e}", w <= band_bf16))
        else:
            rows.append((app, what, 0, "missing", f"{band_bf16:.1e}", False))
with open(dst, "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["app", "comparison", "steps", "worst relative loss difference", "tolerance", "pass"])
    w.writerows(rows)
for r in rows:
    print(f"{r[0]:5s} {r[1]:28s} {r[2]:3} steps  worst {r[3]:>10s}  tolerance {r[4]}  {'ok' if r[5] else 'FAIL'}")
sys.exit(0 if all(r[5] for r in rows) else 1)
PY
  note="$(awk -F, 'NR > 1 {n++; if ($6 == "True") p++} END {print p + 0 " of " n + 0 " comparisons pass"}' "$out/train.csv" 2>/dev/null)"
  return $rc
}

# ---- mixture of experts: against the host and in the bf16 band ---------------------------------------------
# TensorBoard's own reader (the machine's python3 has the tensorboard package) on the event file of
# the GPU's fp32 GPT run: every train/loss step equals float32 of the metrics file's loss
phase_tensorboard() {
  "$PYTHON" - "$work/tb_gpt" "$work/gpt_fp32_false.csv" <<'PY'
import csv, struct, sys
try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:
    print("the tensorboard package is not present: its reader was not run")
    sys.exit(0)
ea = EventAccumulator(sys.argv[1])
ea.Reload()
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
got = {e.step: e.value for e in ea.Scalars("train/loss")}
rows = list(csv.DictReader(open(sys.argv[2])))
bad = [r["iteration"] for r in rows if got.get(int(r["iteration"])) != f32(float(r["loss"]))]
print(f"TensorBoard's EventAccumulator: {len(got)} train/loss steps, {len(rows)} metrics rows, mismatches {bad}")
sys.exit(1 if bad or len(got) != len(rows) else 0)
PY
}

phase_moe() {
  local dtype rc=0
  for dtype in fp32 bf16; do
    # shellcheck disable=SC2046
    (cd "$root" && timeout "$(left)" "$GPU_BUILD/apps/pretrain_gpt" --deck inputs/moe_tiny_ci.ini \
      $(gpu_band_args) --precision.dtype "$dtype" --model.flash_attention false \
      --log.metrics_file "$work/moe_${dtype}_false.csv") >"$work/moe_${dtype}_false.log" 2>&1 ||
      { echo "pretrain_gpt moe $dtype failed:"; tail -n 15 "$work/moe_${dtype}_false.log"; rc=1; }
  done
  "$PYTHON" - "$work" "$out/train.csv" "${GPU_CHECK_REFERENCE_DIR:-$work/data/reference}" <<'PY' || rc=1
import csv, os, sys
work, dst, ref = sys.argv[1], sys.argv[2], sys.argv[3]
def rows_of(p):
    return list(csv.DictReader(open(p))) if os.path.exists(p) else []
def col(p, k):
    return [float(r[k]) for r in rows_of(p)] or None
tol_fp32 = float(os.environ.get("GPU_CHECK_FP32_TOL", "1e-4"))
out, ok = [], True
def compare(what, a, b, tol):
    global ok
    if a and b and len(a) == len(b):
        w = max(abs(x - y) / abs(y) for x, y in zip(a, b))
        out.append(("moe", what, len(a), f"{w:.3e}", f"{tol:.1e}", w <= tol))
    else:
        out.append(("moe", what, 0, "missing", f"{tol:.1e}", False))
    ok = ok and out[-1][5]
gpu, host = f"{work}/moe_fp32_false.csv", f"{ref}/moe_fp32_host.csv"
compare("fp32 GPU vs fp32 host", col(gpu, "loss"), col(host, "loss"), tol_fp32)
for k in ("moe_aux_loss", "moe_z_loss", "moe_max_load"):
    compare(f"{k} fp32 GPU vs host", col(gpu, k), col(host, k), 1e-3)
compare("bf16 vs fp32 GPU", col(f"{work}/moe_bf16_false.csv", "loss"), col(gpu, "loss"), 2.0 ** -9)
new = not os.path.exists(dst)
with open(dst, "a", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    if new:
        w.writerow(["app", "comparison", "steps", "worst relative loss difference", "tolerance", "pass"])
    w.writerows(out)
for r in out:
    print(" | ".join(str(x) for x in r))
sys.exit(0 if ok else 1)
PY
  note="$(awk -F, '$1 == "moe" {n++; if ($6 == "True") p++} END {print p + 0 " of " n + 0 " MoE comparisons pass"}' "$out/train.csv" 2>/dev/null)"
  return $rc
}

# ---- the Llama-family layer: against the host and in the bf16 band --------------------------------------
phase_llama() {
  local dtype flash rc=0
  for run in "fp32 false" "bf16 false" "bf16 true"; do
    read -r dtype flash <<<"$run"
    # shellcheck disable=SC2046
    (cd "$root" && timeout "$(left)" "$GPU_BUILD/apps/pretrain_gpt" --deck inputs/llama_tiny_ci.ini \
      $(gpu_band_args) --precision.dtype "$dtype" --model.flash_attention "$flash" \
      --log.metrics_file "$work/llama_${dtype}_${flash}.csv") >"$work/llama_${dtype}_${flash}.log" 2>&1 ||
      { echo "pretrain_gpt llama $dtype flash=$flash failed:"; tail -n 15 "$work/llama_${dtype}_${flash}.log"; rc=1; }
  done
  "$PYTHON" - "$work" "$out/llama.csv" "${GPU_CHECK_REFERENCE_DIR:-$work/data/reference}" <<'PY' || rc=1
import csv, os, sys
work, dst, ref = sys.argv[1], sys.argv[2], sys.argv[3]
def rows_of(p):
    return list(csv.DictReader(open(p))) if os.path.exists(p) else []
def losses(p):
    return [float(r["loss"]) for r in rows_of(p)] or None
tol_fp32 = float(os.environ.get("GPU_CHECK_FP32_TOL", "1e-4"))
band = 2.0 ** -9
out = []
gpu, host = losses(f"{work}/llama_fp32_false.csv"), losses(f"{ref}/llama_fp32_host.csv")
def compare(what, a, b, tol):
    if a and b and len(a) == len(b):
        w = max(abs(x - y) / abs(y) for x, y in zip(a, b))
        out.append(("llama", what, len(a), f"{w:.3e}", f"{tol:.1e}", w <= tol))
    else:
        out.append(("llama", what, 0, "missing", f"{tol:.1e}", False))
compare("fp32 GPU vs fp32 host", gpu, host, tol_fp32)
compare("bf16 vs fp32 GPU", losses(f"{work}/llama_bf16_false.csv"), gpu, band)
compare("bf16 + flash vs fp32 GPU", losses(f"{work}/llama_bf16_true.csv"), gpu, band)
with open(dst, "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["model", "comparison", "steps", "worst relative loss difference", "tolerance", "pass"])
    w.writerows(out)
for r in out:
    print(f"{r[0]:5s} {r[1]:28s} {r[2]:3} steps  {r[3]:>10s}  tolerance {r[4]}  {'ok' if r[5] else 'FAIL'}")
sys.exit(0 if all(r[5] for r in out) else 1)
PY
  note="$(awk -F, 'NR > 1 && NR < 5 {n++; if ($6 == "True") p++} END {print p + 0 " of " n + 0 " comparisons pass"}' \
    "$out/llama.csv" 2>/dev/null)"
  return $rc
}

# ---- long sequences: attention over 32k tokens on one GPU (cp = 1) -------------------------------------------
phase_long() {
  local dtype rc=0 seq=${GPU_CHECK_LONG_SEQ:-32768}
  for dtype in fp32 bf16; do
    (cd "$root" && timeout "$(left)" "$GPU_BUILD/apps/pretrain_gpt" --deck inputs/llama_long_ci.ini \
      --parallel.cp 1 --model.seq_length "$seq" --model.max_position_embeddings "$seq" --precision.dtype "$dtype" \
      --train.micro_batch_size 1 --train.global_batch_size 1 --train.iters 4 --optim.warmup_iters 0 \
      --eval.interval 0 --checkpoint.save "" --log.interval 1 --log.metrics_file "$work/long_${dtype}.csv") \
      >"$work/long_${dtype}.log" 2>&1 ||
      { echo "pretrain_gpt long $dtype failed:"; tail -n 15 "$work/long_${dtype}.log"; rc=1; }
  done
  "$PYTHON" - "$work" "$out/llama.csv" "$seq" <<'PY' || rc=1
import csv, os, statistics, sys
work, dst, seq = sys.argv[1], sys.argv[2], sys.argv[3]
def rows_of(p):
    return list(csv.DictReader(open(p))) if os.path.exists(p) else []
out = []
a, b = rows_of(f"{work}/long_bf16.csv"), rows_of(f"{work}/long_fp32.csv")
if a and b and len(a) == len(b):
    w = max(abs(float(x["loss"]) - float(y["loss"])) / abs(float(y["loss"])) for x, y in zip(a, b))
    out.append(("long", f"{seq} tokens: bf16 vs fp32 GPU", len(a), f"{w:.3e}", f"{2.0 ** -9:.1e}", w <= 2.0 ** -9))
else:
    out.append(("long", f"{seq} tokens: bf16 vs fp32 GPU", 0, "missing", f"{2.0 ** -9:.1e}", False))
for name, rows in (("fp32", b), ("bf16", a)):
    timed = rows[1:] if len(rows) > 1 else rows  # the first iteration allocates and warms up
    if timed:
        tok = statistics.median(float(r["tokens_per_s"]) for r in timed)
        ms = statistics.median(float(r["ms_per_iter"]) for r in timed)
        out.append(("long", f"speed {name}: {tok:.0f} tok/s; {ms:.0f} ms/iteration", len(rows), f"{tok:.1f}", "-", True))
with open(dst, "a", newline="") as f:
    csv.writer(f, lineterminator="\n").writerows(out)
for r in out:
    print(" | ".join(str(x) for x in r))
sys.exit(0 if all(r[5] for r in out) else 1)
PY
  note="$(awk -F, '$1 == "long" && $2 ~ /vs/ {n++; if ($6 == "True") p++} END {print p + 0 " of " n + 0 " comparisons pass"}' \
    "$out/llama.csv" 2>/dev/null); $(sed -n 's/^long,speed \([^,]*\),.*/\1/p' "$out/llama.csv" 2>/dev/null | paste -sd ';' -)"
  return $rc
}

# ---- Hugging Face export loaded by transformers -----------------------------------------------------------
phase_hf() {
  if ! "$PYTHON" -c "import transformers" >/dev/null 2>&1; then
    note="skipped: $PYTHON has no transformers"
    return 0
  fi
  local ck=$work/hf_ck hf=$work/hf_export shard=data/sample/kjv_gpt2_00001.h5 ours theirs
  rm -rf "$ck" "$hf"
  (cd "$root" && timeout "$(left)" "$GPU_BUILD/apps/pretrain_gpt" --deck inputs/gpt_tiny_ci.ini --train.iters 40 \
    --eval.interval 0 --model.hidden_dropout 0 --model.attention_dropout 0 --checkpoint.save "$ck") \
    >"$work/hf.log" 2>&1 || { note="training failed"; tail -n 15 "$work/hf.log"; return 1; }
  timeout "$(left)" "$GPU_BUILD/apps/convert_checkpoint" --to hf --input "$ck" --output "$hf" \
    --vocab-file "$root/data/sample/gpt2/encoder.json" --merge-file "$root/data/sample/gpt2/vocab.bpe" \
    >>"$work/hf.log" 2>&1 || { note="export failed"; tail -n 5 "$work/hf.log"; return 1; }
  ours=$(cd "$root" && timeout "$(left)" "$GPU_BUILD/apps/pretrain_gpt" --deck inputs/gpt_tiny_ci.ini \
    --checkpoint.load "$ck" --eval.only true --eval.shard "$shard" --eval.windows 64 2>>"$work/hf.log" |
    sed -n 's/^eval loss: //p')
  theirs=$(cd "$root" && timeout "$(left)" "$PYTHON" validation/hf_models.py gpt-eval --model "$hf" --shard "$shard" \
    --windows 64 --seq 32 --transformers --device cuda 2>>"$work/hf.log" | sed -n 's/^eval loss: //p')
  [ -n "$ours" ] && [ -n "$theirs" ] || { note="no loss (Trident '$ours', transformers '$theirs')"; tail -n 15 "$work/hf.log"; return 1; }
  note=$("$PYTHON" -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); r = abs(a - b) / abs(b)
print(f'GPT2LMHeadModel.from_pretrained on the GPU: {b:.9g}, --eval.only {a:.9g}, relative {r:.1e} (tolerance 1e-5)')
sys.exit(0 if r <= 1e-5 else 1)" "$ours" "$theirs")
}

# ---- Llama-family Hugging Face exports loaded by transformers ------------------------------------------------
phase_hf_llama() {
  if ! "$PYTHON" -c "import transformers" >/dev/null 2>&1; then
    note="skipped: $PYTHON has no transformers"
    return 0
  fi
  local shard=data/sample/kjv_gpt2_00001.h5 fam opts src imp exp ours theirs own notes=() rc=0
  for fam in llama qwen3; do
    case $fam in
      llama) opts="--rope-scaling llama3:8,1,4,32 --rope-theta 500000" ;;
      qwen3) opts="--head-dim 24" ;;
    esac
    src=$work/hfl_$fam imp=$work/hfl_${fam}_ck exp=$work/hfl_${fam}_export
    rm -rf "$src" "$imp" "$exp"
    # shellcheck disable=SC2086
    (cd "$root" && timeout "$(left)" "$PYTHON" validation/hf_llama.py write --family $fam --out "$src" --seed 5 \
      --init-std 0.2 $opts) >>"$work/hf_llama.log" 2>&1 || { note="$fam: writing failed"; tail -n 5 "$work/hf_llama.log"; return 1; }
    timeout "$(left)" "$GPU_BUILD/apps/convert_checkpoint" --to trident --input "$src" --output "$imp" \
      >>"$work/hf_llama.log" 2>&1 || { note="$fam: import failed"; tail -n 5 "$work/hf_llama.log"; return 1; }
    timeout "$(left)" "$GPU_BUILD/apps/convert_checkpoint" --to hf --input "$imp" --output "$exp" \
      >>"$work/hf_llama.log" 2>&1 || { note="$fam: export failed"; tail -n 5 "$work/hf_llama.log"; return 1; }
    ours=$(cd "$root" && timeout "$(left)" "$GPU_BUILD/apps/pretrain_gpt" --deck "$imp/model.ini" --checkpoint.load "$imp" \
      --eval.only true --eval.shard "$shard" --eval.windows 16 --model.seq_length 32 --train.micro_batch_size 4 \
      --train.global_batch_size 4 --data.train_shards "data/sample/kjv_gpt2_*.h5" 2>>"$work/hf_llama.log" |
      sed -n 's/^eval loss: //p')
    theirs=$(cd "$root" && timeout "$(left)" "$PYTHON" validation/hf_llama.py eval --model "$exp" --shard "$shard" \
      --windows 16 --seq 32 --transformers --device cuda 2>>"$work/hf_llama.log" | sed -n 's/^eval loss: //p')
    own=$(cd "$root" && timeout "$(left)" "$PYTHON" validation/hf_llama.py eval --model "$exp" --shard "$shard" \
      --windows 16 --seq 32 2>>"$work/hf_llama.log" | sed -n 's/^eval loss: //p')
    [ -n "$ours" ] && [ -n "$theirs" ] && [ -n "$own" ] ||
      { note="$fam: no loss (Trident '$ours', transformers '$theirs', hf_llama.py '$own')"; tail -n 15 "$work/hf_llama.log"; return 1; }
    notes+=("$("$PYTHON" -c "import sys; a, b, c = map(float, sys.argv[1:4]); r, s = abs(a - b) / abs(b), abs(c - b) / abs(b)
print(f'{sys.argv[4]}: AutoModelForCausalLM {b:.9g}, --eval.only {a:.9g} ({r:.1e}, tolerance 1e-5), hf_llama.py {c:.9g} ({s:.1e}, 1e-6)')
sys.exit(0 if r <= 1e-5 and s <= 1e-6 else 1)" "$ours" "$theirs" "$own" "$fam")") || rc=1
  done
  note=$(printf '%s; ' "${notes[@]}")
  return $rc
}

# ---- benchmark ---------------------------------------------------------------------------------------------
phase_bench() {
  mkdir -p "$work/bench"
  # shellcheck disable=SC2086
  timeout "$(left)" "$PYTHON" "$root/perf/bench_gpu.py" --build-dir "$GPU_BUILD" --work-dir "$work/bench" \
    --out-dir "$work/bench" --deadline $((phase_deadline - 10)) --python "$PYTHON" \
    ${GPU_CHECK_BENCH_ARGS:---shapes 124m,350m,1.3b,llama8b4 --attention cudnn,unfused --compile-shapes 124m --iters 6 --warmup 2}
  local rc=$?
  local md
  md=$(ls -t "$work"/bench/gpu_*.md 2>/dev/null | head -n1)
  [ -n "$md" ] && cp "$md" "$out/bench.md" && cp "${md%.md}.json" "$out/bench.json" 2>/dev/null
  [ -n "$md" ] && [ -n "$results" ] && cp "$md" "$results/" 2>/dev/null
  note="$(grep -c '^| [^ ]* | \(cudnn\|flash\|unfused\) |' "$out/bench.md" 2>/dev/null) rows"
  return $rc
}

# ---- per-kernel breakdown ------------------------------------------------------------------------------------
profile_cmd() {  # the profile run's pretrain_gpt command (GPT-2 124M bf16, fused attention as auto picks it, micro-batch 8, 4 steps)
  local shape=${GPU_CHECK_PROFILE_ARGS:---model.num_layers 12 --model.hidden_size 768 --model.num_heads 12 \
--model.seq_length 1024 --model.max_position_embeddings 1024 --train.micro_batch_size 8 --train.global_batch_size 8}
  echo "$GPU_BUILD/apps/pretrain_gpt --deck perf/decks/gpt_bench.ini $shape --precision.dtype bf16" \
    "--model.flash_attention true --precision.recompute none --eval.interval 0 --log.interval 1"
}
phase_profile() {
  local lib=$GPU_BUILD/perf/libtrident_kernel_timer.so
  [ -f "$lib" ] || { why "no kernel timer at $lib"; return 1; }
  # shellcheck disable=SC2046
  (cd "$root" && KOKKOS_PROFILE_LIBRARY=$lib KOKKOS_TOOLS_LIBS=$lib CUDA_LAUNCH_BLOCKING=1 \
    TRIDENT_KERNEL_TIMER_OUT=$out/profile.json TRIDENT_KERNEL_TIMER_SKIP=optim::adamw_step:2 \
    timeout "$(left)" $(profile_cmd) --train.iters 4) >"$work/profile.log" 2>&1 ||
    { why "the profiled run failed: $(tail -n 3 "$work/profile.log" | tr '\n|' ' /')"; return 1; }
  "$PYTHON" "$root/perf/gpu_profile.py" breakdown "$out/profile.json" --steps 2 --out "$out/profile.md" \
    --top "$work/top_kernels.txt" || { why "no kernel in the timer's report"; return 1; }
  note="heaviest kernels: $(paste -sd ',' "$work/top_kernels.txt" | sed 's/,/, /g')"
}

# ---- Nsight Compute on the heaviest kernels -------------------------------------------------------------------
phase_ncu() {
  local ncu=${GPU_CHECK_NCU:-ncu} lib=$GPU_BUILD/perf/libtrident_kernel_timer.so label i=0 files=() first
  command -v "$ncu" >/dev/null 2>&1 || { note="skipped: no $ncu here"; return 0; }
  [ -s "$work/top_kernels.txt" ] || { why "no kernels to profile (the profile phase did not name any)"; return 1; }
  while read -r label; do
    i=$((i + 1))
    { echo "# label: $label"; } >"$work/ncu_$i.csv"
    # shellcheck disable=SC2046
    (cd "$root" && KOKKOS_PROFILE_LIBRARY=$lib KOKKOS_TOOLS_LIBS=$lib TRIDENT_KERNEL_TIMER_NVTX=1 \
      TRIDENT_KERNEL_TIMER_OUT=$work/ncu_timer_$i.json timeout "$(left)" "$ncu" --clock-control none --nvtx \
      --nvtx-include "$label/" --launch-count 1 --section SpeedOfLight --csv --log-file "$work/ncu_$i.raw" \
      $(profile_cmd) --train.iters 2) >"$work/ncu_$i.log" 2>&1
    cat "$work/ncu_$i.raw" >>"$work/ncu_$i.csv" 2>/dev/null
    files+=("$work/ncu_$i.csv")
  done <"$work/top_kernels.txt"
  if "$PYTHON" "$root/perf/gpu_profile.py" ncu "${files[@]}" --out "$out/ncu.md"; then
    note="$(grep -c '^| .* | `' "$out/ncu.md") kernels profiled"
    return 0
  fi
  first=$(grep -h -m1 -E '==ERROR==|LibraryNotLoaded|ERR_NVGPUCTRPERM' "$work"/ncu_*.raw "$work"/ncu_*.log 2>/dev/null | head -n1)
  if [ -n "$first" ]; then  # counters unreadable here (a gVisor machine): said, not failed
    note="skipped: ncu could not profile here: $(echo "$first" | cut -c1-150 | tr '|' '/')"
    return 0
  fi
  why "ncu profiled no kernel: $(tail -n 2 "$work/ncu_1.log" | tr '\n|' ' /')"
  return 1
}

need_rebuild=0
[ "${GPU_CHECK_REBUILD:-0}" != 0 ] && need_rebuild=1
if [ "${GPU_CHECK_NO_KIT:-0}" = 1 ]; then
  mkdir -p "$work"
  phases+=("kit|skipped|0|GPU_CHECK_NO_KIT=1: data/sample and GPU_CHECK_REFERENCE_DIR are used")
else
  run_phase kit 60 phase_kit || exit 1
fi
run_phase start 60 phase_start || exit 1
if [ $need_rebuild -eq 1 ]; then
  run_phase rebuild "${GPU_CHECK_BUILD_LIMIT:-330}" phase_rebuild || exit 1
fi
run_phase gpu 20 phase_gpu || exit 1
[ -n "$stopped" ] && { gpu_log "gpu_check: STOP $stopped"; exit 0; }
run_phase unit "${GPU_CHECK_UNIT_LIMIT:-45}" phase_unit
run_phase train "${GPU_CHECK_TRAIN_LIMIT:-60}" phase_train
run_phase llama "${GPU_CHECK_LLAMA_LIMIT:-30}" phase_llama
run_phase moe "${GPU_CHECK_MOE_LIMIT:-30}" phase_moe
profile_limit=${GPU_CHECK_PROFILE_LIMIT:-40} ncu_limit=${GPU_CHECK_NCU_LIMIT:-60}
run_phase bench "${GPU_CHECK_BENCH_LIMIT:-$((deadline - $(date +%s) - profile_limit - ncu_limit))}" phase_bench
run_phase profile "$profile_limit" phase_profile
run_phase ncu "$ncu_limit" phase_ncu
if [ "${GPU_CHECK_EXTRA:-0}" = 1 ]; then
  run_phase tensorboard 20 phase_tensorboard
  run_phase long "${GPU_CHECK_LONG_LIMIT:-45}" phase_long
  run_phase hf "${GPU_CHECK_HF_LIMIT:-90}" phase_hf
  run_phase hf_llama "${GPU_CHECK_HF_LLAMA_LIMIT:-45}" phase_hf_llama
fi
exit $failed
