#!/usr/bin/env bash
# GPU checks of the CUDA backend, as one script (run on a machine with an NVIDIA GPU):
#   1. configure and build Trident against the CUDA-enabled Kokkos install at $KOKKOS_ROOT
#      (Kokkos is the user's: this script never builds it), with the tests;
#   2. run the unit tests on the GPU (every op against its host reference and finite
#      differences, the fused kernels against the unfused ops, bf16 conversions and GEMMs);
#   3. train the tiny CI deck on one GPU in fp32, bf16 and bf16 + flash attention, and check that
#      the bf16 losses track fp32 within the bf16 band (the same check as on the host); the same
#      for BERT's tiny deck (pretrain_bert, padding masks in both attention paths);
#   4. run the GPU benchmark (perf/bench_gpu.py) and leave its report in perf/results/.
# Without a GPU it says so and exits 0.
#
#   KOKKOS_ROOT=/opt/kokkos-cuda CUDA_ARCH=90 scripts/gpu_check.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-cuda}
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi -L fails): GPU checks skipped"
  exit 0
fi
: "${KOKKOS_ROOT:?set KOKKOS_ROOT to a CUDA-enabled Kokkos install (4.7 or later for CUDA 13)}"
ARCH=${CUDA_ARCH:-90}
JOBS=${JOBS:-$(nproc)}
nvidia-smi -L
echo "== configure and build ($BUILD, sm_$ARCH, Kokkos at $KOKKOS_ROOT)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTRIDENT_ENABLE_CUDA=ON -DKokkos_ROOT="$KOKKOS_ROOT" \
      -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DTRIDENT_BUILD_TESTS=ON
cmake --build "$BUILD" -j "$JOBS"
echo "== unit tests on the GPU"
(cd "$BUILD" && ctest -L unit --output-on-failure -j 4)
echo "== tiny deck on one GPU: fp32, bf16, bf16 + flash attention"
bash data/prepare_sample.sh >/dev/null
for app in gpt bert; do
  for run in "fp32 false" "bf16 false" "bf16 true"; do
    set -- $run
    "$BUILD/apps/pretrain_$app" --deck "inputs/${app}_tiny_ci.ini" --train.iters 50 --model.hidden_dropout 0 \
      --model.attention_dropout 0 --precision.dtype "$1" --model.flash_attention "$2" --eval.interval 0 \
      --log.interval 10 --log.metrics_file "$BUILD/gpu_${app}_$1_$2.csv"
  done
done
/usr/bin/python3 - "$BUILD" <<'PY'
import csv, sys
b = sys.argv[1]
load = lambda n: [float(r["loss"]) for r in csv.DictReader(open(f"{b}/gpu_{n}.csv"))]
for app in ("gpt", "bert"):
    ref = load(f"{app}_fp32_false")
    for n in ("bf16_false", "bf16_true"):
        w = max(abs(x - y) / x for x, y in zip(ref, load(f"{app}_{n}")))
        print(f"{app} {n}: worst relative loss difference to fp32 over 50 steps {w:.2e} (band {2**-9:.2e})")
        assert w <= 2**-9, (app, n)
PY
echo "== GPU benchmark"
/usr/bin/python3 perf/bench_gpu.py --build-dir "$BUILD"
echo "gpu_check: done"
