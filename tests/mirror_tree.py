#!/usr/bin/env python3
"""Makes DST a mirror of the files git lists in ROOT (tracked and untracked, not ignored): a file
is written only when its bytes differ (so that a build tool's timestamps see only real changes),
files git no longer lists are removed. Used by the build checks that keep one build directory
between runs of the suite (tests/cuda/cuda_build.sh, tests/fuzz/build_fuzzers.sh).

usage: mirror_tree.py ROOT DST LABEL [PATHSPEC ...]   (PATHSPEC: git pathspecs, default all)"""
import os
import shutil
import subprocess
import sys


def main():
    root, dst, label = sys.argv[1], sys.argv[2], sys.argv[3]
    out = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard", "-z", "--", *sys.argv[4:]],
                         check=True, capture_output=True).stdout.decode()
    want = set()
    changed = 0
    for f in (f for f in out.split("\0") if f):
        src = os.path.join(root, f)
        if not os.path.isfile(src) or os.path.islink(src):  # deleted in the work tree, or a link
            continue
        want.add(f)
        out_path = os.path.join(dst, f)
        with open(src, "rb") as fh:
            data = fh.read()
        try:
            with open(out_path, "rb") as fh:
                same = fh.read() == data
        except OSError:
            same = False
        if not same:
            os.makedirs(os.path.dirname(out_path), exist_ok=True)
            tmp = out_path + ".mirror-tmp"
            with open(tmp, "wb") as fh:
                fh.write(data)
            shutil.copymode(src, tmp)
            os.replace(tmp, out_path)
            changed += 1
    removed = 0
    for d, _, names in os.walk(dst, topdown=False):
        for n in names:
            rel = os.path.relpath(os.path.join(d, n), dst)
            if rel not in want:
                os.remove(os.path.join(d, n))
                removed += 1
        if d != dst and not os.listdir(d):
            os.rmdir(d)
    print(f"{label}: mirror {dst}: {len(want)} files, {changed} written, {removed} removed")


if __name__ == "__main__":
    main()
