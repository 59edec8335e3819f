#!/bin/bash
# A single-node Slurm for the job-script tests, started by hand (no systemd, nothing in /etc):
#   slurm_cluster.sh start DIR   munged, slurmctld and slurmd with their state, logs and
#                                configuration under DIR; prints `export SLURM_CONF=...` and
#                                returns once the node is idle
#   slurm_cluster.sh stop DIR    stops them
# Needs root and Debian's slurmctld, slurmd, slurm-client and munge. Exit code 77 (CTest's skip)
# when they are missing, with the reason on stderr; exit 1 when they are there but do not come up
# (a broken Slurm set-up is a failure, not a reason to skip).
set -euo pipefail
cmd=${1:?start|stop} dir=$(mkdir -p "${2:?state directory}" && cd "$2" && pwd)
skip() { echo "slurm_cluster: $*" >&2; exit 77; }
fail() { echo "slurm_cluster: $*" >&2; for f in "$dir"/log/*.log; do [ -f "$f" ] && tail -n 15 "$f" >&2; done; exit 1; }
stop() {
  for p in slurmd slurmctld munged; do
    [ -f "$dir/$p.pid" ] && kill "$(cat "$dir/$p.pid")" 2>/dev/null || true
  done
  sleep 1
}
if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$(id -u)" -eq 0 ] || skip "needs root (slurmd runs the jobs as their user)"
for b in slurmctld slurmd munged sbatch sinfo; do
  command -v "$b" >/dev/null || skip "$b is not installed (apt-get install slurmctld slurmd slurm-client munge)"
done
[ -r /etc/munge/munge.key ] || skip "no /etc/munge/munge.key (the munge package makes it)"
stop
mkdir -p "$dir/ctld" "$dir/d" "$dir/log"
host=$(hostname -s)
cpus=$(getconf _NPROCESSORS_ONLN)  # not nproc: it follows OMP_NUM_THREADS
mem=$(awk '/MemTotal/{print int($2 / 1024 * 0.8)}' /proc/meminfo)
# slurmctld's and slurmd's ports: two the kernel reports free now (fixed ones collide with any other
# Slurm on the host, or a second cluster of this script); the clients read them from slurm.conf
py=/usr/bin/python3
[ -x "$py" ] || py=python3
ports=$("$py" -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("", 0))
print(*[x.getsockname()[1] for x in s])') || fail "could not pick two free TCP ports"
read -r ctld_port d_port <<<"$ports"
# our own munged and socket: works whether or not the system's munge runs
munged --force --socket="$dir/munge.sock" --key-file=/etc/munge/munge.key --pid-file="$dir/munged.pid" \
  --log-file="$dir/log/munged.log" --seed-file="$dir/munge.seed" || fail "munged did not start (see $dir/log/munged.log)"
cat > "$dir/slurm.conf" <<CONF
ClusterName=trident-test
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/d
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=pmi2
ReturnToService=2
SchedulerType=sched/builtin
MinJobAge=600
KillWait=30
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -c -f "$SLURM_CONF" || fail "slurmctld did not start (see $dir/log/slurmctld.log)"
slurmd -f "$SLURM_CONF" || fail "slurmd did not start (see $dir/log/slurmd.log)"
for _ in $(seq 1 60); do
  if sinfo -h -o %T 2>/dev/null | grep -q idle; then
    echo "slurm_cluster: slurmctld on port $ctld_port, slurmd on port $d_port" >&2
    echo "export SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  sleep 0.5
done
stop
fail "the node did not become idle within 30 s (see $dir/log/)"
