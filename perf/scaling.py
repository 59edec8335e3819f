#!/usr/bin/python3
"""Tabulates and plots a weak- or strong-scaling series written by jobscripts/submit_scaling.sh
(one metrics CSV per rank count, `ranks_<N>.csv`, and `series.txt`): per rank count the mean
tokens/s and TFLOP/s per rank over the iterations after the first (which also allocates and
warms up), and the parallel efficiency against the smallest run,

    efficiency(N) = (tokens/s at N / tokens/s at N0) / (N / N0)

(strong scaling: the same global batch, so ideal throughput grows with N; weak scaling: the
global batch grows with N, and the same ratio is the weak-scaling efficiency). Writes
scaling.csv and scaling.png next to the series.

  /usr/bin/python3 perf/scaling.py --dir runs/scaling_strong
"""
import argparse
import csv
import glob
import os
import re
import statistics
import sys


def read_series(d):
    runs = {}
    for path in glob.glob(os.path.join(d, "ranks_*.csv")):
        n = int(re.search(r"ranks_(\d+)\.csv$", path).group(1))
        with open(path) as f:
            rows = list(csv.DictReader(f))
        if len(rows) < 2:
            raise SystemExit(f"{path}: {len(rows)} iterations; the rates need at least 2 (the first is left out)")
        steady = rows[1:]
        runs[n] = {
            "tokens_per_s": statistics.mean(float(r["tokens_per_s"]) for r in steady),
            "tflops_per_rank": statistics.mean(float(r["tflops_per_rank"]) for r in steady),
            "ms_per_iter": statistics.median(float(r["ms_per_iter"]) for r in steady),
            "iterations": len(rows),
        }
    if not runs:
        raise SystemExit(f"{d}: no ranks_<N>.csv (run jobscripts/submit_scaling.sh first)")
    mode = "strong"
    info = os.path.join(d, "series.txt")
    if os.path.exists(info):
        m = re.search(r"mode (\w+)", open(info).read())
        mode = m.group(1) if m else mode
    return mode, runs


def table(runs):
    n0 = min(runs)
    out = []
    for n in sorted(runs):
        r = runs[n]
        eff = (r["tokens_per_s"] / runs[n0]["tokens_per_s"]) / (n / n0)
        out.append(dict(ranks=n, tokens_per_s=r["tokens_per_s"], tflops_per_rank=r["tflops_per_rank"],
                        ms_per_iter=r["ms_per_iter"], efficiency=eff))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--expect-sizes", type=int, default=0, help="exit 1 unless the series has this many rank counts")
    a = ap.parse_args()
    mode, runs = read_series(a.dir)
    rows = table(runs)
    if a.expect_sizes and len(rows) != a.expect_sizes:
        print(f"FAIL: {len(rows)} rank counts in {a.dir}, expected {a.expect_sizes}")
        return 1
    with open(os.path.join(a.dir, "scaling.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"{mode} scaling, {len(rows)} sizes ({a.dir}):")
    print(f"{'ranks':>6} {'tokens/s':>12} {'TFLOP/s/rank':>13} {'ms/iter':>9} {'efficiency':>11}")
    for r in rows:
        print(f"{r['ranks']:>6} {r['tokens_per_s']:>12.1f} {r['tflops_per_rank']:>13.4f} {r['ms_per_iter']:>9.1f} "
              f"{r['efficiency']:>11.3f}")
    if a.no_plot:
        return 0
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = [r["ranks"] for r in rows]
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.8))
    ax[0].plot(n, [r["tokens_per_s"] for r in rows], "o-", label="measured")
    ax[0].plot(n, [rows[0]["tokens_per_s"] * k / n[0] for k in n], "--", color="gray", label="ideal")
    ax[0].set(title="throughput", xlabel="ranks", ylabel="tokens/s")
    ax[0].legend()
    ax[1].plot(n, [r["efficiency"] for r in rows], "o-")
    ax[1].axhline(1.0, color="gray", ls="--")
    ax[1].set(title=f"{mode}-scaling efficiency", xlabel="ranks", ylim=(0, 1.15))
    ax[2].plot(n, [r["tflops_per_rank"] for r in rows], "o-")
    ax[2].set(title="model TFLOP/s per rank", xlabel="ranks")
    for x in ax:
        x.set_xscale("log", base=2)
        x.set_xticks(n)
        x.set_xticklabels([str(k) for k in n])
        x.grid(alpha=0.3)
    fig.tight_layout()
    png = os.path.join(a.dir, "scaling.png")
    fig.savefig(png, dpi=110)
    print("wrote", os.path.join(a.dir, "scaling.csv"), "and", png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
