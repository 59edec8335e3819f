#!/usr/bin/env bash
# Checks the C++ files (*.cpp *.hpp *.h *.cc) changed since the commit in .ci/format-base against
# .clang-format: files added or modified since that commit, committed or not, and untracked files
# that git does not ignore. Files nobody touched are not checked, so the existing code need not be
# reformatted all at once.
#
#   scripts/check_format.sh          list the changed files clang-format would change (CTest
#                                    format_changed_files, label "format")
#   scripts/check_format.sh --diff   the same, with clang-format's changes as a diff
#   scripts/check_format.sh --fix    reformat exactly those files in place (clang-format -i)
#
# Exit status: 0 all changed files formatted (or fixed), 1 some are not, 2 usage or clang-format
# error, 77 (CTest's skip) when it cannot check: no clang-format (Debian 12 package `clang-format`),
# one too old to read .clang-format, not a git checkout, or the base commit is not in the history.
# In a shallow clone (CI's usual checkout) the base commit alone is fetched from the remote first
# (`git fetch --depth=1 REMOTE BASE`: only its tree is compared with); 77 with the reason when that
# fails (no remote, no network).
# Environment: CLANG_FORMAT (the binary to use), FORMAT_BASE (a commit to use instead of
# .ci/format-base, e.g. the merge base of a pull request).
# Works from any directory: it runs in the repository holding this script.
set -euo pipefail

mode=check
for arg in "$@"; do
  case "$arg" in
    --fix) mode=fix ;;
    --diff) mode=diff ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "check_format: unknown argument '$arg' (usage: scripts/check_format.sh [--fix|--diff])" >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
skip() { echo "check_format: SKIPPED: $*"; exit 77; }

# clang-format: $CLANG_FORMAT, `clang-format`, clang-format-14 (.clang-format was tuned with Debian
# 12's clang-format 14; other versions may format some lines differently), another clang-format-1N
cf=${CLANG_FORMAT:-}
if [ -z "$cf" ]; then
  for c in clang-format clang-format-14 clang-format-1{9,8,7,6,5,3,2,1,0}; do
    if command -v "$c" >/dev/null 2>&1; then cf=$(command -v "$c"); break; fi
  done
fi
[ -n "$cf" ] && command -v "$cf" >/dev/null 2>&1 ||
  skip "clang-format is not installed (Debian 12: apt-get install clang-format; or set CLANG_FORMAT)"
[ -f .clang-format ] || { echo "check_format: $root/.clang-format is missing" >&2; exit 2; }
if ! err=$("$cf" --style=file --dump-config </dev/null 2>&1 >/dev/null); then
  skip "$("$cf" --version 2>/dev/null | head -n1) cannot read .clang-format (too old?): ${err%%$'\n'*}"
fi

# the git checkout and the base commit
if ! top=$(git rev-parse --show-toplevel 2>&1); then
  skip "$root is not a git checkout (${top%%$'\n'*})"
fi
[ "$(cd "$top" && pwd -P)" = "$(pwd -P)" ] || skip "$root is not the top of a git checkout (that is $top)"
if [ -n "${FORMAT_BASE:-}" ]; then
  base=$FORMAT_BASE
  from="FORMAT_BASE"
else
  [ -f .ci/format-base ] || skip "no .ci/format-base naming the base commit"
  base=$(grep -v '^[[:space:]]*\(#\|$\)' .ci/format-base | head -n1 | tr -d '[:space:]' || true)
  [ -n "$base" ] || skip ".ci/format-base names no commit"
  from=".ci/format-base"
fi
if ! git rev-parse -q --verify "$base^{commit}" >/dev/null 2>&1; then
  why="it is not in this checkout's history"
  if [ "$(git rev-parse --is-shallow-repository 2>/dev/null)" = true ]; then
    # a shallow clone (CI's usual checkout): fetch the base commit alone from the remote; the
    # comparison needs only its tree, not the history between it and HEAD
    branch=$(git symbolic-ref -q --short HEAD || true)
    remote=$( { [ -n "$branch" ] && git config --get "branch.$branch.remote"; } || git remote | head -n1 || true)
    if [ -z "$remote" ]; then
      why="$why, and this shallow clone has no remote to fetch it from (add one, or check in a full clone)"
    else
      echo "check_format: a shallow clone without the base commit: git fetch --depth=1 $remote $base"
      if ! out=$(timeout 120 git fetch -q --depth=1 --no-tags "$remote" "$base" 2>&1); then
        why="$why, and this shallow clone could not fetch it from '$remote': ${out%%$'\n'*}"
      fi
    fi
  fi
  git rev-parse -q --verify "$base^{commit}" >/dev/null 2>&1 || skip "base commit '$base' ($from): $why"
fi
base_id=$(git rev-parse --short "$base^{commit}")

# changed C++ files: added/modified since the base (tracked, staged or not) and untracked ones
# that are not ignored; deleted files and symbolic links are left out
patterns=('*.cpp' '*.hpp' '*.h' '*.cc')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! { git diff -z --name-only --no-renames --diff-filter=AM "$base" -- "${patterns[@]}" &&
       git ls-files -z --others --exclude-standard -- "${patterns[@]}"; } >"$tmp/list"; then
  echo "check_format: git could not list the files changed since $base_id" >&2
  exit 2
fi
files=()
while IFS= read -r -d '' f; do
  [ -f "$f" ] && [ ! -L "$f" ] && files+=("$f")
done <"$tmp/list"
version=$("$cf" --version | head -n1)
if ((${#files[@]} == 0)); then
  echo "check_format: no C++ file changed since $base_id ($from); nothing to check ($version)"
  exit 0
fi

# the files clang-format would change (its output compared byte for byte with the file)
echo "check_format: ${#files[@]} C++ file(s) changed since $base_id ($from), checked with $version"
bad=()
for f in "${files[@]}"; do
  if ! "$cf" --style=file "$f" >"$tmp/out" 2>"$tmp/err"; then
    echo "check_format: $cf failed on $f:" >&2
    cat "$tmp/err" >&2
    exit 2
  fi
  cmp -s "$tmp/out" "$f" && continue
  bad+=("$f")
  [ "$mode" = fix ] && continue
  n=$(diff "$f" "$tmp/out" | grep -c '^[<>]' || true)
  echo "check_format: not formatted: $f ($n line(s) differ)"
  if [ "$mode" = diff ]; then
    diff -u --label "a/$f" --label "b/$f" "$f" "$tmp/out" || true
  fi
done

if ((${#bad[@]} == 0)); then
  echo "check_format: all formatted"
  exit 0
fi
if [ "$mode" = fix ]; then
  "$cf" --style=file -i "${bad[@]}"
  printf 'check_format: reformatted %s\n' "${bad[@]}"
  exit 0
fi
echo "check_format: ${#bad[@]} of ${#files[@]} changed C++ file(s) need formatting: run scripts/check_format.sh --fix" \
     "(clang-format -i on exactly those files), or --diff to see the changes"
exit 1
