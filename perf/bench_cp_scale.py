#!/usr/bin/python3
"""Context parallelism at growing sequence lengths (docs/DESIGN.md "Context parallelism"): per-rank
activation memory and tokens/s of inputs/llama_long_ci.ini (the Llama-family layer at CI width) from 1k
to 32k tokens at cp 1, 2 and 4, against cp = 1 in the same run.

  perf/bench_cp_scale.py --build build [--seqs 1024,2048,...] [--cps 1,2,4] [--iters 2] \\
                         [--skip 32768:1] [--out perf/results/cp_scale.md] [--plot perf/results/cp_scale.png]

Each (sequence, cp) trains `iters` iterations of one sample (micro-batch 1, global batch 1, so every
rank of the context-parallel group holds seq / cp tokens of the one sequence) on the sample shards and
reads:
  - the memory report (log.memory_file) of rank 0: the activations kept for the micro-batch in flight
    and the workspace (the logits and the per-layer scratch, the ring's blocks among them), in MiB; their
    sum is the per-rank activation memory the ratios compare;
  - tokens/s of the last iteration (the metrics file).
It prints a table with the ratios to cp = 1 at the same length and, with --check, exits 1 unless the
activation memory at 8k and 16k tokens is at most 0.55 x cp = 1's at cp = 2 and 0.3 x at cp = 4, and
the longest sequence trains at the largest cp. --skip seq:cp leaves a pair out (cp = 1 at 32k tokens
holds about 6.6 GiB of activations and workspace, mostly the fp32 logits over the 50257-word
vocabulary, and takes minutes per iteration on 2 cores; the memory scales linearly, so its figure
is twice the 16k run's).

Ranks beyond the machine's cores are oversubscribed (cp 4 on 2 cores): memory is exact, the times
are not speeds (4 ranks share 2 cores; the all-to-alls and ring steps wait on descheduled peers).
"""
import argparse
import csv
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DECK = os.path.join(ROOT, "inputs", "llama_long_ci.ini")
MiB = 1024.0 * 1024.0


def run_one(a, seq, cp, work):
    w = os.path.join(work, f"s{seq}_cp{cp}")
    if a.reuse and os.path.exists(os.path.join(w, "memory.json")):
        return read_one(w, seq, cp)
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(w)
    cmd = [a.mpiexec, "-n", str(cp), os.path.join(a.build, "apps", "pretrain_gpt"), "--deck", DECK,
           "--data.train_shards", os.path.join(a.sample, "kjv_gpt2_*.h5"), "--model.seq_length", str(seq),
           "--model.max_position_embeddings", str(seq), "--parallel.cp", str(cp), "--parallel.cp_comm_type",
           a.comm, "--train.micro_batch_size", "1", "--train.global_batch_size", "1", "--train.iters",
           str(a.iters), "--optim.warmup_iters", "0", "--eval.interval", "0", "--checkpoint.save", "",
           "--log.interval", "1", "--log.metrics_file", os.path.join(w, "metrics.csv"), "--log.memory_file",
           os.path.join(w, "memory.json"), "--data.split", "100,0,0"]  # (no validation windows: 32k > the split's)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print(p.stdout[-3000:])
        raise SystemExit(f"FAILED ({p.returncode}): {' '.join(cmd)}")
    return read_one(w, seq, cp)


def read_one(w, seq, cp):
    with open(os.path.join(w, "memory.json")) as f:
        rank0 = json.load(f)["ranks"][0]
    with open(os.path.join(w, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    return dict(seq=seq, cp=cp, activations=rank0["activation_bytes"] / MiB, workspace=rank0["workspace_bytes"] / MiB,
                layer=rank0["layer_activation_bytes"] / MiB, tokens_per_s=float(rows[-1]["tokens_per_s"]),
                ms=float(rows[-1]["ms_per_iter"]))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--sample", default=os.path.join(ROOT, "data", "sample"))
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--seqs", default="1024,2048,4096,8192,16384,32768")
    p.add_argument("--cps", default="1,2,4")
    p.add_argument("--comm", default="p2p", choices=["p2p", "a2a"])
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--skip", action="append", default=[], metavar="SEQ:CP")
    p.add_argument("--work", default="/tmp/trident_cp_scale")
    p.add_argument("--out")
    p.add_argument("--plot")
    p.add_argument("--check", action="store_true")
    p.add_argument("--reuse", action="store_true", help="read the runs already in --work instead of training again")
    a = p.parse_args()
    seqs = [int(x) for x in a.seqs.split(",")]
    cps = [int(x) for x in a.cps.split(",")]
    skip = {tuple(int(v) for v in s.split(":")) for s in a.skip}
    res = {}
    for seq in seqs:
        for cp in cps:
            if (seq, cp) in skip:
                continue
            r = run_one(a, seq, cp, a.work)
            res[(seq, cp)] = r
            print(f"seq {seq:6d} cp {cp}: activations {r['activations']:9.1f} MiB + workspace {r['workspace']:9.1f} "
                  f"MiB per rank, {r['tokens_per_s']:8.0f} tokens/s ({r['ms']:.0f} ms/iteration)", flush=True)
    lines = ["| tokens | cp | activations MiB | workspace MiB | total MiB | x cp=1 | tokens/s | x cp=1 |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    failures = []
    for seq in seqs:
        base = res.get((seq, 1))
        for cp in cps:
            r = res.get((seq, cp))
            if not r:
                lines.append(f"| {seq} | {cp} | not run | | | | | |")
                continue
            tot = r["activations"] + r["workspace"]
            mem_ratio = tot / (base["activations"] + base["workspace"]) if base else float("nan")
            tps_ratio = r["tokens_per_s"] / base["tokens_per_s"] if base else float("nan")
            lines.append(f"| {seq} | {cp} | {r['activations']:.1f} | {r['workspace']:.1f} | {tot:.1f} | {mem_ratio:.3f} | "
                         f"{r['tokens_per_s']:.0f} | {tps_ratio:.2f} |")
            if base and seq in (8192, 16384) and cp in (2, 4):
                limit = 0.55 if cp == 2 else 0.3
                if not mem_ratio <= limit:
                    failures.append(f"{seq} tokens at cp {cp}: {mem_ratio:.3f} x cp=1 (limit {limit})")
    longest = max(seqs)
    if (longest, max(cps)) not in res:
        failures.append(f"{longest} tokens did not train at cp {max(cps)}")
    table = "\n".join(lines)
    print(table)
    if a.out:
        with open(a.out, "w") as f:
            f.write(table + "\n")
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(1, 2, figsize=(11, 4))
        for cp in cps:
            xs = [s for s in seqs if (s, cp) in res]
            ax[0].plot(xs, [res[(s, cp)]["activations"] + res[(s, cp)]["workspace"] for s in xs], "o-", label=f"cp {cp}")
            ax[1].plot(xs, [res[(s, cp)]["tokens_per_s"] for s in xs], "o-", label=f"cp {cp}")
        for x, t in zip(ax, ("activations + workspace per rank (MiB)", "tokens/s (whole job; cp 4 oversubscribed)")):
            x.set_xscale("log", base=2)
            x.set_xlabel("sequence length (tokens)")
            x.set_title(t)
            x.legend()
        ax[0].set_yscale("log")
        fig.tight_layout()
        fig.savefig(a.plot, dpi=100)
    if a.check and failures:
        raise SystemExit("FAILED: " + "; ".join(failures))


if __name__ == "__main__":
    sys.exit(main())
