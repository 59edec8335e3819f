#!/usr/bin/env bash
# Rehearses scripts/gpu_check.sh on this machine, in an environment like the GPU machine's: a
# minimal Debian 12 chroot (debootstrap minbase) holding only what that image is known to have
# besides the GPU (a compiler, CMake, ninja, python3, xz), this machine's CUDA toolkit bind-mounted
# read-only at /usr/local/cuda, the working tree as the device tool sends it (tracked and
# untracked-not-ignored files, plus the kit .gpu_kit/), no network, and none of the Debian
# development packages Trident builds with here. gpu_check.sh runs there up to its first GPU call
# and must stop at that boundary with every earlier phase passed.
#
#   bash scripts/gpu_rehearsal.sh [--out DIR] [--rebuild no|configure|full] [--record]   (as root)
#     --rebuild  configure (default): also configure a rebuild from the kit, as the GPU machine
#                would when the prebuilt binaries cannot start; full: build it all (slow on 2 cores)
#     --record   write the phase table to perf/results/gpu_rehearsal_<date>.md
# Exit status: 0 when the rehearsal reached the GPU boundary with every phase passed, 1 when it did
# not, 77 (skipped) when it cannot run here: not root, no kit, no debootstrap, no CUDA toolkit.
# The chroot's base (about 600 MB) is cached in $TRIDENT_GPU_CACHE (default ~/.cache/trident-gpu).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$root/perf/work/gpu_rehearsal rebuild=configure record=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --rebuild) rebuild=$2; shift 2 ;;
    --record) record=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "gpu_rehearsal: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
skip() { echo "gpu_rehearsal: skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (chroot, mounts)"
[ -f "$root/.gpu_kit/MANIFEST" ] || skip "no GPU kit in $root/.gpu_kit (make it with scripts/gpu_kit.sh)"
command -v debootstrap >/dev/null || skip "debootstrap is not installed (apt-get install debootstrap)"
cuda=$(readlink -f /usr/local/cuda 2>/dev/null || true)
[ -n "$cuda" ] && [ -x "$cuda/bin/nvcc" ] || skip "no CUDA toolkit at /usr/local/cuda"
command -v unshare >/dev/null || skip "unshare (util-linux) is missing"
case $rebuild in no|configure|full) ;; *) echo "gpu_rehearsal: --rebuild no|configure|full" >&2; exit 2 ;; esac

# shellcheck source=scripts/gpu_common.sh
source "$root/scripts/gpu_common.sh"
cache=$GPU_CACHE/rehearsal
base=$cache/base.tar
chroot_dir=$cache/root
mkdir -p "$cache"
t0=$(date +%s)
log() { printf '[%s] gpu_rehearsal: %s\n' "$(date +%H:%M:%S)" "$*"; }

umount_all() {
  local m
  for m in usr/local/cuda proc sys dev; do
    if findmnt -rn "$chroot_dir/$m" >/dev/null 2>&1; then umount -R "$chroot_dir/$m" 2>/dev/null || umount -R -l "$chroot_dir/$m"; fi
  done
  return 0
}
trap umount_all EXIT
reset_root() {
  umount_all
  if findmnt -rn -o TARGET | grep -q "^$chroot_dir/"; then
    echo "gpu_rehearsal: mounts under $chroot_dir are still attached; not deleting" >&2
    exit 1
  fi
  rm -rf "$chroot_dir"
  mkdir -p "$chroot_dir"
}

# ---- the base: minbase plus what the GPU machine's image has besides the GPU ------------------------
# (the image: nvcc, CMake, ninja, a python3 with torch; a C++ compiler for nvcc's host side)
stand_ins="g++ make cmake ninja-build python3 xz-utils ca-certificates"
if [ ! -s "$base" ] || [ "$(cat "$cache/base.stamp" 2>/dev/null)" != "$stand_ins" ]; then
  mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
  [ -n "$mirror" ] || mirror=$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list 2>/dev/null)
  [ -n "$mirror" ] || skip "no Debian mirror found in /etc/apt"
  log "making the base (debootstrap minbase + $stand_ins) in $cache"
  reset_root
  debootstrap --variant=minbase bookworm "$chroot_dir" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
    { tail -n 20 "$cache/debootstrap.log"; exit 1; }
  cp /etc/resolv.conf "$chroot_dir/etc/resolv.conf"
  mount --rbind /proc "$chroot_dir/proc"; mount --make-rslave "$chroot_dir/proc"
  mount --rbind /dev "$chroot_dir/dev"; mount --make-rslave "$chroot_dir/dev"
  chroot "$chroot_dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    bash -c "apt-get update -qq && apt-get install -y -qq --no-install-recommends $stand_ins >/dev/null && apt-get clean" ||
    { echo "gpu_rehearsal: installing the stand-ins failed" >&2; exit 1; }
  umount_all
  tar -C "$chroot_dir" -cf "$base.part" . && mv "$base.part" "$base"
  echo "$stand_ins" >"$cache/base.stamp"
fi
log "resetting the chroot from the base"
reset_root
tar -C "$chroot_dir" -xf "$base"
rm -f "$chroot_dir/etc/resolv.conf"
# no Debian development package may have crept in
for p in libmpich-dev libhdf5-mpich-dev libboost1.74-dev libicu-dev libtrilinos-kokkos-dev libgtest-dev; do
  if chroot "$chroot_dir" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    echo "gpu_rehearsal: $p is installed in the base; it must not be" >&2
    exit 1
  fi
done

# ---- the working tree as the device tool sends it, and the kit ---------------------------------------
mkdir -p "$chroot_dir/work/repo" "$chroot_dir/usr/local/cuda"
(cd "$root" && { git ls-files -co --exclude-standard | while read -r f; do [ -e "$f" ] || [ -L "$f" ] || continue; echo "$f"; done; } |
  tar --no-recursion -cf - -T -) | tar -C "$chroot_dir/work/repo" -xf -
cp -r "$root/.gpu_kit" "$chroot_dir/work/repo/.gpu_kit"
tree_mib=$(du -sm "$chroot_dir/work/repo" | cut -f1)
mount --bind "$cuda" "$chroot_dir/usr/local/cuda"
mount -o remount,bind,ro "$chroot_dir/usr/local/cuda"
mount -t proc proc "$chroot_dir/proc"
mount --bind /dev "$chroot_dir/dev"
mkdir -p "$chroot_dir/sys" && mount --bind -o ro /sys "$chroot_dir/sys" && mount -o remount,bind,ro "$chroot_dir/sys"

# ---- gpu_check.sh there, without network ------------------------------------------------------------
rebuild_env=0
case $rebuild in configure) rebuild_env=configure ;; full) rebuild_env=1 ;; esac
log "running gpu_check.sh in the chroot (no network, tree $tree_mib MiB, rebuild: $rebuild)"
set +e
unshare --net chroot "$chroot_dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb \
  GPU_CHECK_REBUILD="$rebuild_env" GPU_CHECK_BUILD_LIMIT="${GPU_CHECK_BUILD_LIMIT:-7200}" GPU_CHECK_BUDGET="${GPU_CHECK_BUDGET:-9000}" \
  bash -c "cd /work/repo && bash scripts/gpu_check.sh /work/out"
rc=$?
set -e
mkdir -p "$out"
cp -r "$chroot_dir/work/out/." "$out/" 2>/dev/null || true
umount_all
report=$out/report.md
ok=1
[ $rc -eq 0 ] || { echo "gpu_rehearsal: gpu_check.sh exited $rc"; ok=0; }
grep -q "Stopped: at the GPU boundary" "$report" 2>/dev/null || { echo "gpu_rehearsal: the run did not stop at the GPU boundary"; ok=0; }
for ph in kit start gpu; do
  grep -q "^| $ph | ok |" "$report" 2>/dev/null || { echo "gpu_rehearsal: phase '$ph' did not pass"; ok=0; }
done
if [ "$rebuild" != no ]; then
  grep -q "^| rebuild | ok |" "$report" 2>/dev/null || { echo "gpu_rehearsal: phase 'rebuild' did not pass"; ok=0; }
fi
total=$(( $(date +%s) - t0 ))
if [ $record -eq 1 ] && [ -f "$report" ]; then
  # one file a day; each rehearsal adds its section
  rec=$root/perf/results/gpu_rehearsal_$(date +%Y-%m-%d).md
  [ -f "$rec" ] || printf '# GPU kit rehearsals, %s\n' "$(date +%Y-%m-%d)" >"$rec"
  {
    echo
    echo "## \`bash scripts/gpu_rehearsal.sh --rebuild $rebuild --record\`, $(date +%H:%M)"
    echo
    echo "On $(uname -n) ($(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')): a Debian 12 minbase chroot with only"
    echo "$stand_ins installed, this machine's CUDA toolkit ($(gpu_nvcc_version "$cuda/bin/nvcc"))"
    echo "bind-mounted read-only, no network (unshare --net), and the working tree as the device tool sends it"
    echo "($tree_mib MiB with the kit). Kit: $(du -sh "$root/.gpu_kit" | cut -f1) ($(sed -n 's/^part=//p' "$root/.gpu_kit/MANIFEST" | awk '{printf "%s%s %.1f MiB", (NR > 1 ? ", " : ""), $1, $3 / 1048576}'))."
    echo "Result: $([ $ok -eq 1 ] && echo "reached the GPU boundary with every phase passed" || echo "FAILED"); $total s in all, the chroot's reset and the copy included."
    echo
    sed -n '/^| phase/,/^$/p' "$report"
    grep -E '^\[[0-9:]+\] (== |gpu_check)' "$out/log.txt" | sed 's/^/    /'
  } >>"$rec"
  log "recorded $rec"
fi
log "$([ $ok -eq 1 ] && echo PASS || echo FAIL) in $total s; report $report"
[ $ok -eq 1 ]
