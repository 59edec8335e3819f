#!/usr/bin/env bash
# Trident bootstrap: installs what is missing (Debian 12, as root), builds, and then
#   gpt   prepares the sample data and runs GPT pretraining (inputs/gpt_small.ini) on local MPI ranks
#   test  runs the whole CTest suite
#   build only builds
# Environment: BUILD_DIR (default build), JOBS (default nproc), NP (ranks for `gpt`, default 2),
#              CTEST_ARGS (extra ctest arguments, e.g. "-LE slow").
set -euo pipefail
mode=${1:-gpt}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}
np=${NP:-2}

packages=(cmake g++ make pkg-config mpich libmpich-dev libhdf5-mpich-dev libboost-program-options-dev
          libtrilinos-kokkos-dev libdnnl-dev ocl-icd-opencl-dev libopenblas-dev libicu-dev libgtest-dev nlohmann-json3-dev
          zlib1g-dev liblzma-dev libzstd-dev libsentencepiece-dev libcpp-httplib-dev
          python3-torch python3-numpy python3-h5py python3-matplotlib bible-kjv bible-kjv-text)
command -v npm >/dev/null 2>&1 || packages+=(npm)
packages+=(procps)
# the job-script tests start a single-node Slurm (tests/slurm)
[ "$mode" = test ] && packages+=(slurmctld slurmd slurm-client munge)
# the fuzz harnesses (tests/fuzz): clang with libFuzzer and the sanitizers
[ "$mode" = test ] && packages+=(clang libclang-rt-14-dev)
# the format check of the changed C++ files (tests/format, scripts/check_format.sh: clang-format and git)
[ "$mode" = test ] && packages+=(clang-format git)
# the compressed-input tests (tests/data/check_preprocess.py compressed): the zstd, gzip and xz tools
[ "$mode" = test ] && packages+=(zstd gzip xz-utils)
# the SentencePiece checks (tests/data): spm_train and spm_encode, the library's own command line
[ "$mode" = test ] && packages+=(sentencepiece)
# the independent reader of the TensorBoard files (tests/e2e/tensorboard_checks.py): protoc and
# Python's protobuf runtime
[ "$mode" = test ] && packages+=(protobuf-compiler python3-protobuf)
# the CUDA build check's compiler cache (tests/cuda/cuda_build.sh; it builds without one too)
[ "$mode" = test ] && packages+=(ccache)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "== installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

echo "== building in $build"
mkdir -p "$build"
# the configure log stays in the build directory; its Trident lines (GEMM library, a oneDNN that
# could not be used) are shown
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >"$build/configure.log" 2>&1; then
  cat "$build/configure.log" >&2
  echo "== configure failed (log: $build/configure.log)" >&2
  exit 1
fi
grep -E '(^-- )?Trident' "$build/configure.log" || true
cmake --build "$build" -j "$jobs"

case "$mode" in
  build) ;;
  gpt)
    bash "$root/data/prepare_sample.sh" --out "$root/data/sample" --bin "$build/apps"
    mkdir -p "$root/runs/gpt_small"
    cd "$root"
    echo "== GPT pretraining: mpiexec -n $np $build/apps/pretrain_gpt --deck inputs/gpt_small.ini"
    mpiexec -n "$np" "$build/apps/pretrain_gpt" --deck inputs/gpt_small.ini
    # validation loss against the corpus' unigram entropy, and the loss curve
    /usr/bin/python3 validation/check_learning.py validation/gpt_small_learning --metrics runs/gpt_small/metrics.csv \
      --shards "data/sample/kjv_gpt2_*.h5" --plot runs/gpt_small/loss.png
    ;;
  test)
    cd "$build"
    rm -f Testing/junit.xml
    rc=0
    ctest --output-on-failure -j "$jobs" --output-junit "$build/Testing/junit.xml" ${CTEST_ARGS:-} || rc=$?
    # every skipped test with its reason (a test skips only with exit code 77 and says why)
    if [ -f Testing/junit.xml ]; then
      /usr/bin/python3 "$root/scripts/suite_report.py" skipped Testing/junit.xml || true
    fi
    exit $rc
    ;;
  *)
    echo "usage: $0 gpt|test|build" >&2
    exit 2
    ;;
esac
