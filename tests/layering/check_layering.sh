#!/usr/bin/env bash
# The folders of src/ build against views that hold only what each may use (src/CMakeLists.txt,
# docs/DESIGN.md "Dependency direction"). This check proves the views keep the direction: for
# every folder A, its view holds exactly A and the folders the build declares it may use; and
# for every folder F it may not use, an include of one of F's headers, preprocessed with A's view
# as the include path, fails with "No such file". And MPI is called only in src/comm (every
# other folder and apps/ go through comm/: checked return codes, watchdog marks); handles such as
# MPI_Comm and MPI_COMM_WORLD may appear anywhere.
#   check_layering.sh CXX VIEWS_DIR SRC_DIR AREA=USED,USED ...   (the declaration of src/CMakeLists.txt)
set -euo pipefail
cxx=$1 views=$2 src=$3
shift 3
declare -A uses
for d in "$@"; do uses[${d%%=*}]=" ${d%%=*} ${d#*=} "; done
uses_of() { echo "${uses[$1]//,/ }"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
areas=$(cd "$src" && ls -d */ | tr -d /)
checked=0 failed=0
for a in $areas; do
  [ -n "${uses[$a]:-}" ] || { echo "FAIL: src/$a has no declared uses (src/CMakeLists.txt)"; failed=$((failed + 1)); continue; }
  have=$(cd "$views/$a" && ls | sort | tr '\n' ' ')
  want=$(for x in $(uses_of "$a"); do echo "$x"; done | sort -u | tr '\n' ' ')
  [ "$have" = "$want" ] || { echo "FAIL: the view of $a holds [$have], the declaration [$want]"; failed=$((failed + 1)); }
  for f in $areas; do
    header=$(cd "$src" && ls "$f"/*.hpp 2>/dev/null | head -n 1)
    [ -n "$header" ] || continue
    printf '#include "%s"\n' "$header" > "$work/probe.cpp"
    if [[ " $(uses_of "$a") " == *" $f "* ]]; then
      [ -e "$views/$a/$header" ] || { echo "FAIL: $a may use $f but its view lacks $header"; failed=$((failed + 1)); }
      continue
    fi
    checked=$((checked + 1))
    if out=$("$cxx" -E -I "$views/$a" "$work/probe.cpp" -o /dev/null 2>&1); then
      echo "FAIL: $a may not use $f, yet \"$header\" resolves with its view"
      failed=$((failed + 1))
    elif ! grep -q "No such file" <<<"$out"; then
      echo "FAIL: $a including \"$header\" failed for another reason:"
      echo "$out" | head -n 5
      failed=$((failed + 1))
    fi
  done
done
# MPI calls outside src/comm: an identifier MPI_Xxx followed by "(" (comments excluded)
apps=$(cd "$src/.." && pwd)/apps
mpi_calls=$(grep -rnE '\bMPI_[A-Z][a-z_]+ *\(' "$src" "$apps" --include='*.cpp' --include='*.hpp' |
  grep -v "^$src/comm/" | grep -vE '^[^:]+:[0-9]+: *//' || true)
if [ -n "$mpi_calls" ]; then
  echo "FAIL: MPI called outside src/comm (use comm/communicator.hpp, comm/mpi_job.hpp, comm/agreement.hpp):"
  echo "$mpi_calls"
  failed=$((failed + 1))
fi
[ "$checked" -gt 0 ] || { echo "FAIL: no forbidden include was checked (views in $views?)"; exit 1; }
echo "layering: $checked forbidden folder includes fail as they should; $failed problems"
[ "$failed" -eq 0 ]
