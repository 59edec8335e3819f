#!/usr/bin/env python3
"""Every app's --help (docs/DESIGN.md "Apps"): exit 0; the first line names the app
("<app>: what it does"); its own options come before anything of Kokkos's (Kokkos's option
banner is behind --kokkos-help, which prints it and exits 0 running nothing); the exit codes are
listed; defaults print as the deck tables write them (0.1, 1e-05: no 17-digit expansions).

usage: help_checks.py --build BUILD
"""
import argparse
import os
import re
import subprocess
import sys

APPS = ["pretrain_gpt", "pretrain_bert", "pretrain_t5", "preprocess_data", "generate_gpt", "convert_dataset",
        "convert_checkpoint", "serve_gpt"]
KOKKOS_BANNER = "Kokkos command line arguments"
# a default printed with more digits than the number it stands for (0.10000000000000001)
LONG_DEFAULT = re.compile(r"\(=-?\d*\.\d*(0000000|9999999)\d*(e[-+]\d+)?\)")


def run(cmd):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60, env=env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    a = ap.parse_args()
    failures = []
    for app in APPS:
        exe = os.path.join(a.build, "apps", app)
        problems = []
        r = run([exe, "--help"])
        first = r.stdout.splitlines()[0] if r.stdout.strip() else ""
        if r.returncode != 0:
            problems.append(f"exit {r.returncode}")
        if not first.startswith(app + ":"):
            problems.append(f"first line {first!r} does not start with '{app}:'")
        if KOKKOS_BANNER in r.stdout:
            problems.append("Kokkos's option banner printed with --help")
        if "Exit codes:" not in r.stdout or not all(f"\n  {c}  " in r.stdout for c in (0, 1, 3, 4, 5)):
            problems.append("the exit codes 0, 1, 3, 4, 5 are not listed")
        bad = [m.group(0) for m in LONG_DEFAULT.finditer(r.stdout)]
        if bad:
            problems.append(f"defaults printed with spurious digits: {bad[:3]}")
        k = run([exe, "--kokkos-help"])
        if k.returncode != 0 or KOKKOS_BANNER not in k.stdout:
            problems.append(f"--kokkos-help: exit {k.returncode}, Kokkos's banner "
                            f"{'printed' if KOKKOS_BANNER in k.stdout else 'missing'}")
        if "Exit codes:" in k.stdout:
            problems.append("--kokkos-help ran the app's own help too")
        print(f"{'ok  ' if not problems else 'FAIL'} {app:20s} {first[:90]}" +
              ("" if not problems else "\n       " + "\n       ".join(problems)))
        if problems:
            failures.append(app)
    if failures:
        sys.exit("FAILED: " + ", ".join(failures))
    print(f"all {len(APPS)} apps: help first, exit codes listed, Kokkos behind --kokkos-help")


if __name__ == "__main__":
    main()
