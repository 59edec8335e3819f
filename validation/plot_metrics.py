#!/usr/bin/python3
"""Plot a Trident training curve.

    plot_metrics.py METRICS.csv --out curve.png [--eval EVAL.csv]
                    [--hline VALUE --hline-label TEXT] [--title TEXT] [--logx]

Training loss vs iteration from Trident's metrics CSV (columns iteration, loss, ...; rows with a
non-finite loss or skipped=1 are left out), the validation loss if an eval CSV with columns
iteration,loss is given, and a horizontal reference line (typically the corpus unigram entropy
from unigram_entropy.py: a model that learnt no context sits on it).
"""

import argparse
import csv
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def read_xy(path, need_skip_check=False):
    xs, ys = [], []
    with open(path, newline="") as fh:
        rd = csv.DictReader(fh)
        cols = [c.strip() for c in (rd.fieldnames or [])]
        if "iteration" not in cols or "loss" not in cols:
            raise ValueError("%s: needs columns iteration and loss (has %s)" % (path, ",".join(cols)))
        for r in rd:
            r = {k.strip(): v for k, v in r.items() if k}
            try:
                it, loss = int(float(r["iteration"])), float(r["loss"])
            except (TypeError, ValueError):
                continue
            if need_skip_check and r.get("skipped", "0").strip() not in ("", "0", "0.0"):
                continue
            if math.isfinite(loss):
                xs.append(it)
                ys.append(loss)
    return xs, ys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("metrics", help="Trident metrics CSV")
    ap.add_argument("--out", required=True, help="output image (png, pdf, svg)")
    ap.add_argument("--eval", help="CSV with columns iteration,loss (validation loss)")
    ap.add_argument("--hline", type=float, help="horizontal reference line, e.g. unigram entropy")
    ap.add_argument("--hline-label", default="unigram entropy")
    ap.add_argument("--title", default=None)
    ap.add_argument("--logx", action="store_true")
    a = ap.parse_args(argv)

    try:
        x, y = read_xy(a.metrics, need_skip_check=True)
        ev = read_xy(a.eval) if a.eval else None
    except (OSError, ValueError) as e:
        print("error: %s" % e, file=sys.stderr)
        return 2
    if not x:
        print("error: %s has no finite losses" % a.metrics, file=sys.stderr)
        return 2

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.plot(x, y, lw=1.0, color="tab:blue", label="train loss")
    if ev and ev[0]:
        ax.plot(ev[0], ev[1], "o-", ms=3, lw=1.2, color="tab:orange", label="validation loss")
    if a.hline is not None:
        ax.axhline(a.hline, color="gray", ls="--", lw=1.0,
                   label="%s (%.3f)" % (a.hline_label, a.hline))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss (nats/token)")
    if a.logx:
        ax.set_xscale("log")
    ax.set_title(a.title or a.metrics)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out)
    print("wrote %s (%d training points%s)" % (a.out, len(x),
                                               ", %d validation points" % len(ev[0]) if ev else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
