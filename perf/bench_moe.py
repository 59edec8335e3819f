#!/usr/bin/python3
"""Mixture-of-experts training throughput on the CPU: Trident next to PyTorch running the same MoE
on one rank as the reference implementations do (a Python loop over the experts).

The model: the Llama family's layer of perf/decks/llama_bench.ini (rotary positions, RMSNorm,
SwiGLU, grouped-query attention, untied output layer, no biases) with every MLP a mixture of E
SwiGLU experts of width Fe, top-k routing (softmax over the k top logits: Mixtral's renormalised
top-k), the load-balancing loss at 0.01; default shape 6 layers x 384, 6 heads in 2 groups,
E = 8, k = 2, Fe = 512, batch 4 x 64 tokens, dropout 0, fp32, the same threads on both sides.

  1. Trident   apps/pretrain_gpt for --iters steps (1 rank); median ms/iter after --warmup from its
               metrics CSV, and its end-of-run breakdown of the MoE layers' time (router, dispatch,
               experts, combine: forward and backward, summed over the run);
  2. PyTorch   perf/torch_gpt.py --arch llama --experts E --topk k --expert-ffn Fe, same shapes.

Prints tokens/s of both, their ratio and Trident's MoE breakdown (shares of the step), and with
--out writes the figures as JSON. --ranks R runs Trident on R MPI ranks (data parallel, the batch
split over them, --threads / R threads each) and --ep E spreads the experts over E of them (expert
parallelism); PyTorch keeps one rank with --threads threads (--skip-torch leaves it out).

  /usr/bin/python3 perf/bench_moe.py [--build-dir build] [--threads 2] [--iters 8] [--out FILE]
  /usr/bin/python3 perf/bench_moe.py --smoke        # a tiny shape, 3 steps (a check that it runs)
"""
import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    p.add_argument("--work", default=os.path.join(REPO, "perf", "work", "bench_moe"))
    p.add_argument("--shards", default=os.path.join(REPO, "data", "sample", "kjv_gpt2_*.h5"))
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--expert-ffn", type=int, default=512)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ranks", type=int, default=1, help="Trident's MPI ranks (data parallel)")
    p.add_argument("--ep", type=int, default=1, help="Trident's expert-parallel size (divides --ranks)")
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--skip-torch", action="store_true")
    p.add_argument("--smoke", action="store_true", help="2 layers x 64, 4 experts of 48, 3 steps")
    p.add_argument("--out", default="", help="write the figures as JSON here")
    a = p.parse_args(argv)
    if a.smoke:
        a.layers, a.hidden, a.heads, a.groups, a.experts, a.expert_ffn, a.iters, a.warmup = 2, 64, 4, 2, 4, 48, 3, 1
    return a


def run(cmd, env):
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit("FAILED (%d): %s\n%s" % (r.returncode, " ".join(cmd), r.stdout[-3000:]))
    return r.stdout


def main(argv=None):
    a = parse_args(argv)
    os.makedirs(a.work, exist_ok=True)
    per_rank = max(1, a.threads // a.ranks)
    env = dict(os.environ, OMP_NUM_THREADS=str(per_rank), OPENBLAS_NUM_THREADS=str(per_rank))
    metrics = os.path.join(a.work, "metrics.csv")
    for f in (metrics, os.path.join(a.work, "metrics.moe.csv")):
        if os.path.exists(f):
            os.remove(f)
    ffn = a.topk * a.expert_ffn  # the dense twin's width (not run: the MoE's active MLP)
    launch = [a.mpiexec, "-n", str(a.ranks)] if a.ranks > 1 else []
    cmd = launch + [os.path.join(a.build_dir, "apps", "pretrain_gpt"), "--deck", os.path.join(REPO, "perf", "decks", "llama_bench.ini"),
           "--model.num_layers", str(a.layers), "--model.hidden_size", str(a.hidden), "--model.num_heads", str(a.heads),
           "--model.num_query_groups", str(a.groups), "--model.ffn_hidden_size", str(ffn),
           "--model.seq_length", str(a.seq), "--model.max_position_embeddings", str(a.seq),
           "--model.hidden_dropout", "0", "--model.attention_dropout", "0",
           "--moe.num_experts", str(a.experts), "--moe.router_topk", str(a.topk),
           "--moe.ffn_hidden_size", str(a.expert_ffn), "--moe.aux_loss_coeff", "0.01",
           "--train.micro_batch_size", str(a.batch // a.ranks), "--train.global_batch_size", str(a.batch),
           "--parallel.ep", str(a.ep),
           "--train.iters", str(a.iters), "--log.metrics_file", metrics, "--data.train_shards", a.shards]
    out = run(cmd, env)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))
    rows = list(csv.DictReader(open(metrics)))
    ms = statistics.median(float(r["ms_per_iter"]) for r in rows[a.warmup:])
    m = re.search(r"MoE layers \(rank 0, forward \+ backward\): router (\S+) s; dispatch (\S+) s; experts (\S+) s; "
                  r"combine (\S+) s", out)
    total = re.search(r"^done: (\d+) iterations, \d+ samples consumed, (\S+) s\.", out, re.M)
    parts = dict(zip(("router", "dispatch", "experts", "combine"), (float(x) for x in m.groups()))) if m else {}
    trident = {"ms_per_iter": ms, "tokens_per_s": a.batch * a.seq / (ms / 1e3), "moe_seconds": parts,
               "run_seconds": float(total.group(2)) if total else None, "iterations": a.iters}
    print("Trident on %d rank(s), ep %d, %d thread(s) each: %.0f tok/s (%.1f ms/it)"
          % (a.ranks, a.ep, per_rank, trident["tokens_per_s"], ms))
    if parts and trident["run_seconds"]:
        moe = sum(parts.values())
        print("Trident's MoE layers on rank 0, forward + backward over the run (%.2f s of %.2f s): "
              % (moe, trident["run_seconds"])
              + "; ".join("%s %.2f s (%.0f%%)" % (k, v, 100 * v / moe if moe else 0) for k, v in parts.items()))
    if a.skip_torch:
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"shape": vars(a), "trident": trident}, f, indent=1)
        return 0
    torch_out = run(["/usr/bin/python3", os.path.join(REPO, "perf", "torch_gpt.py"), "--arch", "llama",
                     "--layers", str(a.layers), "--hidden", str(a.hidden), "--heads", str(a.heads),
                     "--groups", str(a.groups), "--ffn", str(ffn), "--experts", str(a.experts), "--topk", str(a.topk),
                     "--expert-ffn", str(a.expert_ffn), "--batch", str(a.batch), "--seq", str(a.seq),
                     "--steps", str(a.iters), "--warmup", str(a.warmup), "--threads", str(a.threads),
                     "--dropout", "0"], env)
    torch = json.loads(torch_out.strip().splitlines()[-1])
    ratio = trident["tokens_per_s"] / torch["tokens_per_s"]
    print("shape: %d layers x %d, %d heads in %d groups, %d experts of %d, top-%d, batch %d x %d tokens, %d threads"
          % (a.layers, a.hidden, a.heads, a.groups, a.experts, a.expert_ffn, a.topk, a.batch, a.seq, a.threads))
    print("Trident %.0f tok/s (%.1f ms/it) | PyTorch loop over experts %.0f tok/s (%.1f ms/it) | ratio %.2fx"
          % (trident["tokens_per_s"], ms, torch["tokens_per_s"], torch["ms_per_iter"], ratio))
    res = {"shape": vars(a), "trident": trident, "pytorch": {k: torch[k] for k in ("ms_per_iter", "tokens_per_s", "torch_version")},
           "ratio": ratio}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
