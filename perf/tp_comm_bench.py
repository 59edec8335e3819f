#!/usr/bin/env python3
"""Tensor-parallel communication benchmark: time per step and bytes communicated per step for
tp=1 (dp=2), tp=2 and tp=2 with sequence parallelism, on 2 ranks, next to Megatron's analytic
volume.

Analytic tensor-parallel volume per micro-batch (Megatron-LM, Narayanan et al. 2021; Korthikanti
et al. 2022): each transformer layer does two all-reduces of b*s*h values in the forward pass
(after attention's proj and after fc2) and two in the backward pass (the copy_to backward of qkv
and fc1); sequence parallelism replaces each all-reduce by an all-gather plus a reduce-scatter
of the same total size, and the backward pass all-gathers the inputs of qkv and fc1 once more
(Megatron keeps only the row-split input and re-gathers it: 2 more all-gathers of b*s*h per
layer). GPT adds one b*s*h reduction for the vocabulary-parallel embedding and
one for the LM head's input gradient, and the vocabulary-parallel cross-entropy reduces 3*b*s
scalars (row max, sum of exponentials, target logit). Bytes are what each rank sends with ring
algorithms (all-reduce of n bytes: 2(p-1)/p n; all-gather and reduce-scatter: (p-1)/p n each),
fp32; with sequence parallelism the replicated parameters' gradients (LayerNorm, row-parallel
biases, position embeddings) add one all-reduce per step.

usage: tp_comm_bench.py [--app build/apps/pretrain_gpt] [--layers 4 --hidden 512 --heads 8
                         --seq 128 --micro 4 --iters 6] [--out perf/results/tp_comm_<date>.md]
"""
import argparse
import datetime
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, tp, sp):
    cmd = ["mpiexec", "-n", "2", args.app, "--deck", os.path.join(ROOT, "inputs", "gpt_tiny_ci.ini"),
           "--data.train_shards", os.path.join(ROOT, "data", "sample", "kjv_gpt2_*.h5"),
           "--model.num_layers", str(args.layers), "--model.hidden_size", str(args.hidden),
           "--model.num_heads", str(args.heads), "--model.seq_length", str(args.seq),
           "--model.max_position_embeddings", str(args.seq), "--model.hidden_dropout", "0",
           "--model.attention_dropout", "0", "--train.micro_batch_size", str(args.micro),
           "--train.global_batch_size", str(2 * args.micro), "--train.iters", str(args.iters),
           "--eval.interval", "0", "--log.interval", "1", "--parallel.tp", str(tp),
           "--parallel.sequence_parallel", "true" if sp else "false"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env).stdout
    ms = [float(m) for m in re.findall(r"\| ([0-9.]+) ms/it", out)]
    if not ms:
        sys.exit(out)
    steady = sorted(ms[1:]) if len(ms) > 2 else ms
    median = steady[len(steady) // 2]
    comm = out[out.index("communication per iteration"):].splitlines()[0]
    vol = {}
    for group in ("tp", "dp"):
        part = comm.split("| dp")[0] if group == "tp" else comm.split("| dp")[1]
        for kind, calls, mb in re.findall(r"(allreduce|allgather|reduce_scatter) ([0-9.]+) calls ([0-9.]+) MB", part):
            vol[(group, kind)] = (float(calls), float(mb))
    return median, vol


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--app", default=os.path.join(ROOT, "build", "apps", "pretrain_gpt"))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--out", default="")
    a = p.parse_args()
    b, s, h, L = a.micro, a.seq, a.hidden, a.layers
    # per iteration: tp=2 runs one micro-batch of b per iteration (global 2b over dp=1 -> 2 micro-batches)
    rows = []
    for name, tp, sp in (("tp=1 (dp=2)", 1, False), ("tp=2", 2, False), ("tp=2 + SP", 2, True)):
        micro_batches = 1 if tp == 1 else 2
        ms, vol = run(a, tp, sp)
        tp_mb = sum(v[1] for (g, k), v in vol.items() if g == "tp")
        dp_mb = sum(v[1] for (g, k), v in vol.items() if g == "dp")
        bsh = 4.0 * b * s * h / 1e6  # MB of one b*s*h fp32 buffer
        ring = 2.0 * (tp - 1) / tp  # all-reduce bytes sent per byte reduced (ring)
        analytic = micro_batches * ((4 * L + 2) * bsh + 3 * 4.0 * b * s / 1e6) * ring
        if sp:  # backward re-gather of the qkv and fc1 inputs: 2 all-gathers of b s h per layer
            analytic += micro_batches * 2 * L * bsh * (tp - 1) / tp
        if sp:  # replicated parameters' gradients: 2 LayerNorms + 2 row biases per layer, final LN, positions
            analytic += ring * 4.0 * ((4 * h + 2 * h) * L + 2 * h + a.seq * h) / 1e6
        kinds = ", ".join(f"{k} {v[0]:.0f}x {v[1]:.2f} MB" for (g, k), v in sorted(vol.items()) if g == "tp") or "-"
        rows.append((name, ms, tp_mb, analytic, dp_mb, kinds))
    lines = [f"# Tensor-parallel communication, {datetime.date.today()}",
             "",
             f"GPT {L} layers, hidden {h}, {a.heads} heads, seq {s}, micro-batch {b}, global batch {2 * b}, "
             f"fp32, 2 MPI ranks on this machine (`{os.uname().nodename}`), OMP_NUM_THREADS=1 per rank, median of "
             f"{a.iters - 1} steps.",
             "",
             "| layout | ms/step | TP MB/step measured | TP MB/step analytic | DP MB/step | TP collectives per step |",
             "|---|---|---|---|---|---|"]
    for name, ms, tp_mb, an, dp_mb, kinds in rows:
        lines.append(f"| {name} | {ms:.1f} | {tp_mb:.3f} | {an:.3f} | {dp_mb:.3f} | {kinds} |")
    lines += ["",
              "Analytic TP volume per micro-batch: (4 l + 2) b s h values (2 all-reduces per layer forward, 2 "
              "backward; embedding and LM-head input) + 3 b s cross-entropy scalars; with sequence parallelism the "
              "same total moves as all-gathers plus reduce-scatters, plus the backward re-gather of the qkv and fc1 inputs "
              "(2 l all-gathers of b s h). tp=1 has no TP traffic; its DP all-reduce "
              "carries the whole gradient instead.",
              "",
              "Command: `/usr/bin/python3 perf/tp_comm_bench.py " + " ".join(sys.argv[1:]) + "`"]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
