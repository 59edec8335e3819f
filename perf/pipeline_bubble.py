#!/usr/bin/env python3
"""Pipeline bubble: measured against theory for m micro-batches per iteration on 2 ranks.

Runs pretrain_gpt with pp=2 (1F1B) for m in {1, 2, 4, 8, 16} and with pp=2, vp=2 (interleaved)
for even m, reads the job's own measurement (idle over busy time of the forward-backward phase
on each rank, averaged over ranks and over the iterations after the first) and prints it next
to Megatron's (p-1)/m and (p-1)/(v m), as a table and a PNG plot. The model is sized so that
the two stages do similar work (the tied LM head is heavy: the 1F1B runs give the first stage
12 of the 16 layers via parallel.first_stage_layers); the interleaved runs use the even
virtual-stage split, so their last rank carries the head on top of half the layers, and the
imbalance shows up as extra idle time on the other rank.

usage: pipeline_bubble.py [--app build/apps/pretrain_gpt] [--iters 4] [--out perf/results/pipeline_bubble_<date>]
"""
import argparse
import datetime
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(app, m, vp, iters, timeline=None):
    cmd = ["mpiexec", "-n", "2", app, "--deck", os.path.join(ROOT, "inputs", "gpt_tiny_ci.ini"),
           "--data.train_shards", os.path.join(ROOT, "data", "sample", "kjv_gpt2_*.h5"),
           "--model.num_layers", "16", "--model.hidden_size", "512", "--model.num_heads", "8",
           "--model.seq_length", "64", "--model.max_position_embeddings", "64",
           "--model.hidden_dropout", "0", "--model.attention_dropout", "0",
           "--train.micro_batch_size", "1", "--train.global_batch_size", str(m), "--train.iters", str(iters),
           "--eval.interval", "0", "--log.interval", str(iters), "--parallel.pp", "2", "--parallel.vp", str(vp)]
    if vp == 1:
        cmd += ["--parallel.first_stage_layers", "12"]
    if timeline:
        cmd += ["--log.timeline_file", timeline]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env).stdout
    mm = re.search(r"pipeline bubble: measured ([0-9.]+).*theory \(p-1\)/m = ([0-9.]+)", out)
    ms = re.search(r"\| ([0-9.]+) ms/it", out)
    if not mm:
        sys.exit(out)
    return float(mm.group(1)), float(mm.group(2)), float(ms.group(1)) if ms else float("nan")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--app", default=os.path.join(ROOT, "build", "apps", "pretrain_gpt"))
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--out", default=os.path.join(ROOT, "perf", "results", f"pipeline_bubble_{datetime.date.today()}"))
    a = p.parse_args()
    rows = []
    for m in (1, 2, 4, 8, 16):
        b1, t1, ms1 = run(a.app, m, 1, a.iters, timeline=a.out + "_m4_timeline.json" if m == 4 else None)
        if m % 2 == 0:
            b2, t2, ms2 = run(a.app, m, 2, a.iters)
        else:
            b2 = t2 = ms2 = float("nan")
        rows.append((m, b1, t1, ms1, b2, t2, ms2))
        print(f"m={m:2d}  1F1B measured {b1:.3f} theory {t1:.3f} ({ms1:.0f} ms/it)   "
              f"interleaved measured {b2:.3f} theory {t2:.3f}", flush=True)
    lines = [f"# Pipeline bubble on 2 ranks, {datetime.date.today()}", "",
             "GPT 16 layers, hidden 512, 8 heads, seq 64, micro-batch 1, pp = 2, fp32, OMP_NUM_THREADS=1 per rank; "
             "1F1B with 12 + 4 layers (the last stage also runs the LM head), interleaved with vp = 2 (4 virtual "
             "stages of 4 layers). Bubble = idle / busy time of the forward-backward phase per rank, mean over both "
             f"ranks and iterations 2..{a.iters}.", "",
             "| m | 1F1B measured | (p-1)/m | ms/iter | interleaved measured | (p-1)/(v m) | ms/iter |",
             "|---|---|---|---|---|---|---|"]
    for m, b1, t1, ms1, b2, t2, ms2 in rows:
        f = lambda x, d=3: "-" if x != x else f"{x:.{d}f}"  # noqa: E731
        lines.append(f"| {m} | {f(b1)} | {f(t1)} | {f(ms1, 0)} | {f(b2)} | {f(t2)} | {f(ms2, 0)} |")
    lines += ["", f"Timeline of the 1F1B run with m = 4: `{os.path.basename(a.out)}_m4_timeline.json` "
              "(open in chrome://tracing or ui.perfetto.dev).", "",
              "Command: `/usr/bin/python3 perf/pipeline_bubble.py " + " ".join(sys.argv[1:]) + "`"]
    text = "\n".join(lines) + "\n"
    print(text)
    with open(a.out + ".md", "w") as fh:
        fh.write(text)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ms = [r[0] for r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot(ms, [r[1] for r in rows], "o-", label="1F1B measured")
    ax.plot(ms, [r[2] for r in rows], "--", label="(p-1)/m")
    even = [r for r in rows if r[4] == r[4]]
    ax.plot([r[0] for r in even], [r[4] for r in even], "s-", label="interleaved (v=2) measured")
    ax.plot([r[0] for r in even], [r[5] for r in even], ":", label="(p-1)/(v m)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batches per iteration m")
    ax.set_ylabel("bubble (idle / busy time)")
    ax.set_title("Pipeline bubble, pp = 2 on 2 ranks")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out + ".png", dpi=120)
    print("wrote", a.out + ".md", a.out + ".png")


if __name__ == "__main__":
    main()
