# Sourced by the job scripts (jobscripts/*.sbatch): the site environment, the app check, host
# threads, and the run itself with signal forwarding and resubmission. Jobs never compile.
#
# Environment (all optional):
#   TRIDENT_SITE       site file jobscripts/sites/<site>.env (module loads, srun flags)   generic
#   TRIDENT_BUILD      build directory holding apps/                                      build
#   TRIDENT_RESUBMIT   when the app stops for the time limit (exit 3) or its watchdog (exit 5), submit this same
#                      script again, at most this many times in a chain                  0
#   TRIDENT_SBATCH_ARGS sbatch options for the resubmitted job (those given on the first sbatch
#                      command line, e.g. "--nodes=4 --time=12:00:00"; #SBATCH lines carry over)
#   TRIDENT_SRUN_FLAGS extra srun flags (usually set by the site file)
# Exit code of the job: the app's (0 done, 1 failed, 3 checkpointed for the time limit or a
# preemption, 4 stopped by a signal without checkpoint.save).

trident_setup() {
  # no pathname expansion from here on: globs in EXTRA (data.train_shards) reach the app as written
  set -f
  cd "${SLURM_SUBMIT_DIR:-.}"
  local site=${TRIDENT_SITE:-generic}
  [ -f "jobscripts/sites/$site.env" ] || { echo "trident: no site file jobscripts/sites/$site.env" >&2; exit 1; }
  # shellcheck disable=SC1090
  source "jobscripts/sites/$site.env"
  TRIDENT_BUILD=${TRIDENT_BUILD:-build}
  # Host threads per rank: the cores Slurm gave each task (the GEMM library's threads).
  export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-${OMP_NUM_THREADS:-1}}
  export OMP_PROC_BIND=${OMP_PROC_BIND:-close} OMP_PLACES=${OMP_PLACES:-cores}
}

trident_app() {  # the path of app $1, or exit with a message
  local app="$TRIDENT_BUILD/apps/$1"
  [ -x "$app" ] || { echo "trident: no $app: build Trident first (jobs never compile)" >&2; exit 1; }
  echo "$app"
}

# trident_run APP ARGS...: srun the app over every task of the allocation. Slurm's warning signal
# (--signal=B:USR1@N reaches this shell only) and SIGTERM are passed on to the ranks, which then
# checkpoint at the next iteration boundary and exit 3; with TRIDENT_RESUBMIT > 0 the job then
# submits itself again (also after exit 5, a run the watchdog ended) (--checkpoint.load auto in the deck or EXTRA makes the new job resume).
trident_run() {
  local app
  app=$(trident_app "$1")
  shift
  echo "trident: $(basename "$app") on ${SLURM_NTASKS:-1} ranks, ${SLURM_JOB_NUM_NODES:-1} node(s)," \
       "OMP_NUM_THREADS=$OMP_NUM_THREADS, job ${SLURM_JOB_ID:-none}"
  local pid=0 stop=""
  # a signal before srun has started is remembered and passed on as soon as it runs
  trap 'stop=USR1; [ "$pid" -gt 0 ] && kill -USR1 "$pid" 2>/dev/null; echo "trident: USR1 (time limit ahead): asking the ranks to checkpoint"' USR1
  trap 'stop=TERM; [ "$pid" -gt 0 ] && kill -TERM "$pid" 2>/dev/null; echo "trident: TERM: asking the ranks to checkpoint"' TERM
  # shellcheck disable=SC2086
  srun ${TRIDENT_SRUN_FLAGS:-} "$app" "$@" &
  pid=$!
  [ -n "$stop" ] && { sleep 2; kill -"$stop" "$pid" 2>/dev/null; }
  local rc=0
  while :; do  # wait returns early (> 128) when a trapped signal arrives: wait again
    wait "$pid" && rc=0 || rc=$?
    kill -0 "$pid" 2>/dev/null || break
  done
  trap - USR1 TERM
  echo "trident: $(basename "$app") exited with code $rc"
  # 3: checkpointed for the time limit or preemption; 5: the watchdog ended a stuck job (a node
  # that stopped answering): both continue from the last checkpoint in a new job
  if { [ "$rc" -eq 3 ] || [ "$rc" -eq 5 ]; } && [ "${TRIDENT_RESUBMIT:-0}" -gt 0 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    local script=${TRIDENT_SCRIPT:-$0}
    if [ "$rc" -eq 3 ]; then
      echo "trident: checkpointed for the time limit; resubmitting $script (${TRIDENT_RESUBMIT} left)"
    else
      echo "trident: the watchdog ended a stuck run; resubmitting $script (${TRIDENT_RESUBMIT} left)"
    fi
    # shellcheck disable=SC2086
    TRIDENT_RESUBMIT=$((TRIDENT_RESUBMIT - 1)) sbatch --export=ALL --dependency="afterany:$SLURM_JOB_ID" \
      ${TRIDENT_SBATCH_ARGS:-} "$script"
  fi
  return "$rc"
}
