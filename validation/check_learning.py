#!/usr/bin/env python3
"""Learning check: the validation loss of a run against the corpus' unigram entropy.

usage: check_learning.py CASE_DIR --metrics RUN/metrics.csv --shards GLOB [--plot OUT.png]

Reads CASE_DIR/expected.json (min_gap_below_unigram_entropy_nats, split), computes the unigram
entropy of the training documents (unigram_entropy.py), prints both and the final validation
loss (from the sibling <metrics>.eval.csv), optionally plots the curve, and exits 1 unless the
final validation loss is at least the expected gap below the entropy.
"""
import argparse
import csv
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("case")
    p.add_argument("--metrics", required=True)
    p.add_argument("--shards", required=True)
    p.add_argument("--plot", default="")
    a = p.parse_args()
    exp = json.load(open(os.path.join(a.case, "expected.json")))
    out = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "unigram_entropy.py"), a.shards,
                          "--split-docs", exp["split"]], stdout=subprocess.PIPE, text=True, check=True).stdout
    print(out.strip())
    entropy = float([l for l in out.splitlines() if l.startswith("unigram entropy:")][0].split()[2])
    root, ext = os.path.splitext(a.metrics)
    eval_path = root + ".eval" + ext
    rows = list(csv.DictReader(open(eval_path)))
    train = list(csv.DictReader(open(a.metrics)))
    final = float(rows[-1]["loss"])
    print(f"training loss at iteration {train[-1]['iteration']}: {float(train[-1]['loss']):.4f}")
    for r in rows:
        print(f"validation loss at iteration {r['iteration']}: {float(r['loss']):.4f}")
    gap = entropy - final
    print(f"unigram entropy {entropy:.4f} nats; final validation loss {final:.4f} nats; gap {gap:.4f} nats "
          f"(required >= {exp['min_gap_below_unigram_entropy_nats']})")
    if a.plot:
        subprocess.run(["/usr/bin/python3", os.path.join(HERE, "plot_metrics.py"), a.metrics, "--eval", eval_path,
                        "--out", a.plot, "--hline", str(entropy), "--hline-label", "unigram entropy"], check=True)
        print("plot:", a.plot)
    if gap < exp["min_gap_below_unigram_entropy_nats"]:
        sys.exit("FAIL: the model did not learn beyond unigram statistics")
    print("PASS")


if __name__ == "__main__":
    main()
