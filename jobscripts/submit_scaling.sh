#!/bin/bash
# Submits a weak- or strong-scaling series of a pretraining app: one job per rank count, each
# writing its metrics to $OUT/ranks_<N>.csv; perf/scaling.py then tabulates and plots the series
# (tokens/s, parallel efficiency, TFLOP/s per rank).
#
#   MODE=strong APP=gpt DECK=inputs/gpt2_124m.ini RANKS="4 8 16 32" RANKS_PER_NODE=4 \
#     OUT=runs/scaling_124m jobscripts/submit_scaling.sh
#   /usr/bin/python3 perf/scaling.py --dir runs/scaling_124m
#
# Parameters (environment, with defaults):
#   MODE            strong: the deck's global batch at every size; weak: the global batch grows
#                   with the data-parallel size (global = deck's global x N / first N)    strong
#   APP             gpt | bert | t5                                                        gpt
#   DECK            input deck                                        inputs/gpt_small.ini
#   RANKS           rank counts (each a multiple of tp x pp)                               "1 2"
#   RANKS_PER_NODE  ranks per node (GPUs per node on GPU sites)                            4
#   ITERS           iterations per job (the first is left out of the rates)                20
#   OUT             series directory                                     runs/scaling_<mode>
#   EXTRA           more deck overrides for every job (parallel layout, data paths, ...)
#   RUNNER          sbatch (submit to Slurm) | local (run one after another with mpiexec
#                   here, e.g. 1 and 2 ranks on a workstation)                             sbatch
#   SBATCH_ARGS     more sbatch options (account, partition, time)
set -euo pipefail
set -f  # globs in EXTRA (data.train_shards) reach the app as written
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mode=${MODE:-strong} app=${APP:-gpt} deck=${DECK:-inputs/gpt_small.ini} ranks=${RANKS:-"1 2"}
per_node=${RANKS_PER_NODE:-4} iters=${ITERS:-20} out=${OUT:-runs/scaling_$mode} runner=${RUNNER:-sbatch}
case $mode in strong|weak) ;; *) echo "MODE must be strong or weak (got $mode)" >&2; exit 2;; esac
case $app in gpt|bert|t5) ;; *) echo "APP must be gpt, bert or t5 (got $app)" >&2; exit 2;; esac
[ -f "$deck" ] || { echo "no deck $deck" >&2; exit 2; }
global=$(awk -F= '/^\[/{s=$0} s=="[train]" && $1~/global_batch_size/{gsub(/ /,"",$2); print $2}' "$deck")
[ -n "$global" ] || { echo "$deck has no train.global_batch_size" >&2; exit 2; }
mkdir -p "$out"
first=""
{
  echo "# scaling series: mode $mode, app $app, deck $deck, ranks $ranks, $per_node ranks per node, $iters iterations"
  echo "# extra: ${EXTRA:-}"
} > "$out/series.txt"
for n in $ranks; do
  first=${first:-$n}
  gb=$global
  [ "$mode" = weak ] && gb=$((global * n / first))
  args="--train.iters $iters --train.global_batch_size $gb --log.metrics_file $out/ranks_$n.csv --log.interval 5 \
--eval.interval 0 --checkpoint.save= --checkpoint.save_initial false ${EXTRA:-}"
  echo "ranks $n global_batch $gb" >> "$out/series.txt"
  if [ "$runner" = local ]; then
    echo "== $n ranks (global batch $gb)"
    # shellcheck disable=SC2086
    eval mpiexec -n "$n" build/apps/pretrain_$app --deck "$deck" $args > "$out/ranks_$n.out" 2>&1 || {
      echo "the $n-rank run failed: see $out/ranks_$n.out" >&2; exit 1; }
  else
    nodes=$(( (n + per_node - 1) / per_node ))
    tasks=$(( n < per_node ? n : per_node ))
    # shellcheck disable=SC2086
    DECK=$deck EXTRA=$args sbatch --export=ALL --nodes="$nodes" --ntasks-per-node="$tasks" \
      --job-name="trident-scaling-$n" --output="$out/ranks_$n.out" ${SBATCH_ARGS:-} "jobscripts/pretrain_$app.sbatch"
  fi
done
echo "series in $out; when the jobs are done: /usr/bin/python3 perf/scaling.py --dir $out"
