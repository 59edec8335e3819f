#!/usr/bin/python3
"""Analytic model of a Trident / Megatron-style GPT training step: time and memory per GPU for any
model, tensor (tp), pipeline (pp, vp), data (dp) parallel layout, micro-batch, recomputation and
precision on a named GPU and network; an advisor that ranks the layouts that fit by predicted
throughput; and checks of the model against measured runs (Megatron's published tables, and
Trident runs on this machine).

  perf_model.py predict --gpu a100-80gb --layers 96 --hidden 12288 --heads 96 --seq 2048 \\
                        --vocab 51200 --tp 8 --pp 12 --dp 8 --micro 1 --global 1536 --recompute full
  perf_model.py advise  --gpu h100-sxm --gpus 1024 --layers 80 --hidden 8192 --heads 64 --seq 4096 \\
                        --vocab 131072 --global 1024
  perf_model.py published            # Narayanan et al. 2021 Table 1 and the 2024 H100 row: error per row
  perf_model.py local --build build  # Trident runs here (1 and 2 ranks): measured vs predicted
  perf_model.py published --max-mean-error 0.10 --max-error 0.20   # the regression check CTest runs

The model (per iteration, per GPU; b micro-batch, m = global / (b dp) micro-batches, v chunks):
  compute    hardware FLOPs / (N peak eff(h/tp)) with 72 B s l h^2 (1 + s/6h + V/12hl) model
             FLOPs, +24 B s l h^2 (1 + s/6h) for full recomputation (one more forward of every
             layer) or +4 B s^2 h l for selective (the attention core); eff(x) = eff_max x/(x+x0),
             the GEMM efficiency at per-GPU shard width x = h/tp
  memory ops bytes moved by the element-wise kernels (LayerNorm, dropout, GELU, residual adds, softmax
             without a fused kernel), forward and backward, at HBM bandwidth
  bubble     (p - 1) / (v m) of the pipeline's compute (1F1B, interleaved with v > 1)
  tp comm    4 all-reduces (or all-gather + reduce-scatter with SP) of b s h activations per layer and
             micro-batch (6 with full recomputation), ring cost 2 (t-1)/t bytes / bandwidth, over NVLink
             when tp fits in a node; a fraction `--tp-overlap` hidden behind GEMMs
  pp comm    2 (v m + p - 1) point-to-point messages of b s h activations on the critical path
  dp comm    the gradient all-reduce (fp32) or reduce-scatter + all-gather (distributed optimizer) of
             this GPU's parameters, ring cost; with `--dp-overlap` hidden behind the backward pass of
             the last micro-batch
  optimizer  the AdamW update at HBM bandwidth (~34 bytes per local parameter, / dp when sharded)
  memory     parameters + gradients + optimizer state at Megatron's bytes per parameter, activations by
             Korthikanti et al. 2022 on the first stage (p micro-batches in flight of l/p layers, x(1 +
             (p-1)/(p v)) when interleaved), the last stage's logits, and the framework's reserve
"""
import argparse
import csv
import datetime
import json
import math
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Vendor figures (dense, no sparsity): peak TFLOP/s by precision, HBM, NVLink bandwidth per GPU and
# direction, network bandwidth per GPU and direction (one NIC per GPU), GPUs per node. eff_max and x0
# describe the GEMM efficiency curve (typical cuBLAS bf16 rates at large shapes; an assumption, the
# same for every row of a table).
GPUS = {
    "a100-80gb": dict(peak={"bf16": 312.0, "fp16": 312.0, "fp32": 19.5, "tf32": 156.0}, hbm_gb=80, hbm_tbps=2.039,
                      nvlink_gbps=300.0, net_gbps=25.0, per_node=8, eff_max=0.72, x0=320.0, latency_us=8.0),
    "h100-sxm": dict(peak={"bf16": 989.0, "fp16": 989.0, "fp32": 67.0, "tf32": 494.0}, hbm_gb=80, hbm_tbps=3.35,
                     nvlink_gbps=450.0, net_gbps=50.0, per_node=8, eff_max=0.66, x0=320.0, latency_us=8.0),
    "h200": dict(peak={"bf16": 989.0, "fp16": 989.0, "fp32": 67.0, "tf32": 494.0}, hbm_gb=141, hbm_tbps=4.8,
                 nvlink_gbps=450.0, net_gbps=50.0, per_node=8, eff_max=0.66, x0=320.0, latency_us=8.0),
}


class Model:
    def __init__(self, layers, hidden, heads, seq, vocab, ffn=None):
        self.l, self.h, self.a, self.s, self.V = layers, hidden, heads, seq, vocab
        self.F = ffn or 4 * hidden

    def params(self):
        h, l = self.h, self.l
        per_layer = 4 * h * h + 2 * h * self.F + 9 * h + self.F  # qkv, proj, fc1, fc2, biases, 2 LayerNorms
        return l * per_layer + self.V * h + self.s * h + 2 * h

    def model_flops(self, B):  # Megatron's count for one iteration of B sequences (no recomputation)
        s, h, l, V = self.s, self.h, self.l, self.V
        return 72.0 * B * s * l * h * h * (1 + s / (6.0 * h) + V / (12.0 * h * l))


class Layout:
    def __init__(self, tp=1, pp=1, vp=1, dp=1, micro=1, global_batch=1, recompute="none", dtype="bf16",
                 sp=None, distributed=True, flash=False, tp_overlap=0.0, dp_overlap=True):
        self.tp, self.pp, self.vp, self.dp, self.b, self.B = tp, pp, vp, dp, micro, global_batch
        self.recompute, self.dtype, self.distributed, self.flash = recompute, dtype, distributed, flash
        self.sp = (tp > 1) if sp is None else sp
        self.tp_overlap, self.dp_overlap = tp_overlap, dp_overlap

    @property
    def gpus(self):
        return self.tp * self.pp * self.dp

    @property
    def m(self):
        return self.B / (self.b * self.dp)

    def describe(self):
        return (f"tp {self.tp} pp {self.pp} vp {self.vp} dp {self.dp} b {self.b} m {self.m:g} recompute "
                f"{self.recompute}{' sp' if self.sp else ''}{' zero1' if self.distributed else ''}")


def bytes_per_param(dtype, distributed, d):  # Megatron's table (the same as Trident's memory report)
    if dtype == "bf16":
        return 6 + 12 / d if distributed else 18
    if dtype == "fp16":
        return 4 + 16 / d if distributed else 20
    return 8 + 8 / d if distributed else 16


def activation_layer_bytes(M, L, e):
    """Korthikanti et al. 2022 per layer and micro-batch, e bytes per stored value, 1-byte masks."""
    s, b, h, a, t = M.s, L.b, M.h, M.a, L.tp
    sbh, as2b = s * b * h, a * s * s * b
    if L.recompute == "full":
        return e * sbh / (t if L.sp else 1)
    values = sbh * (16 * e + 2) / t if L.sp else sbh * (4 * e + 2 + 12 * e / t)
    attention = 0 if (L.recompute == "selective" or L.flash) else as2b * (2 * e + 1) / t
    return values + attention


def predict(M, L, gpu):
    """Time (s) and memory (bytes) per iteration and GPU, with their parts."""
    g = GPUS[gpu] if isinstance(gpu, str) else gpu
    e = 2 if L.dtype in ("bf16", "fp16") else 4
    peak = g["peak"][L.dtype] * 1e12
    t, p, v, d, b, m = L.tp, L.pp, L.vp, L.dp, L.b, L.m
    s, h, l, a = M.s, M.h, M.l, M.a
    N = L.gpus
    # compute: GEMMs at the efficiency of this shard width
    flops = M.model_flops(L.B)
    if L.recompute == "full":
        flops += 24.0 * L.B * s * l * h * h * (1 + s / (6.0 * h))
    elif L.recompute == "selective" and not L.flash:
        flops += 4.0 * L.B * s * s * h * l
    x = h / t
    eff = g["eff_max"] * x / (x + g["x0"])
    t_gemm = flops / (N * peak * eff)
    # element-wise kernels: ~24 reads/writes of b s h values per layer forward and backward (LayerNorms,
    # dropouts, bias + GELU, residual adds), x1.5 with full recomputation, plus the softmax traffic
    per_layer = 24 * s * b * h * e / (t if L.sp else 1) + (0 if L.flash else 6 * a * s * s * b * e / t)
    if L.recompute == "full":
        per_layer *= 1.5
    t_mem = per_layer * (l / p) * m / (g["hbm_tbps"] * 1e12)
    t_stage = t_gemm + t_mem
    t_bubble = (p - 1) / (v * m) * t_stage
    # communication
    node = g["per_node"]
    bw_tp = (g["nvlink_gbps"] if t <= node else g["net_gbps"]) * 1e9
    lat = g["latency_us"] * 1e-6
    act = b * s * h * e
    ring = lambda n, nbytes, bw: 0.0 if n <= 1 else 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * lat  # noqa: E731
    n_tp = 6 if L.recompute == "full" else 4
    t_tp = (1 - L.tp_overlap) * n_tp * (l / p) * m * ring(t, act, bw_tp)
    bw_pp = (g["nvlink_gbps"] if t * p <= node else g["net_gbps"]) * 1e9
    t_pp = 0.0 if p == 1 else 2 * (v * m + p - 1) * (act / (t if L.sp else 1) / bw_pp + lat)
    local_params = (l / p) * (12 * h * h + 13 * h) / t + (M.V * h / t + s * h if p == 1 else M.V * h / t)
    bw_dp = (g["nvlink_gbps"] if N <= node else g["net_gbps"]) * 1e9
    grad_bytes = local_params * 4
    t_dp_raw = ring(d, grad_bytes, bw_dp) if not L.distributed else \
        0.5 * ring(d, grad_bytes, bw_dp) + 0.5 * ring(d, local_params * e, bw_dp)
    t_dp = max(0.0, t_dp_raw - (t_stage / max(m, 1) * 2 / 3 if L.dp_overlap else 0.0))
    t_opt = local_params * 34 / (d if L.distributed else 1) / (g["hbm_tbps"] * 1e12)
    total = t_stage + t_bubble + t_tp + t_pp + t_dp + t_opt
    # memory: the first stage (its p micro-batches in flight) or the last (logits), whichever is larger
    states = local_params * bytes_per_param(L.dtype, L.distributed, d)
    in_flight = l * (1 + ((p - 1) / (p * v) if v > 1 else 0))  # layers' activations held on stage 0
    acts = activation_layer_bytes(M, L, e) * in_flight
    logits = 4 * s * b * M.V / t * 2  # fp32 logits and their gradient on the last stage
    memory = states + max(acts, activation_layer_bytes(M, L, e) * l / p + logits) + 2.0 * 2**30
    return dict(time=total, tflops=M.model_flops(L.B) / total / N / 1e12, hw_tflops=flops / total / N / 1e12,
                tokens_per_s=L.B * s / total, memory=memory, fits=memory <= g["hbm_gb"] * 1e9 * 0.95,
                parts=dict(gemm=t_gemm, elementwise=t_mem, bubble=t_bubble, tp=t_tp, pp=t_pp, dp=t_dp,
                           optimizer=t_opt), eff=eff, states=states, activations=acts, params=local_params)


def print_prediction(M, L, gpu, r):
    print(f"{gpu}: {M.params() / 1e9:.2f}B parameters on {L.gpus} GPUs ({L.describe()})")
    print(f"  step {r['time']:.3f} s | {r['tokens_per_s']:.0f} tokens/s | model {r['tflops']:.1f} TFLOP/s per GPU "
          f"(hardware {r['hw_tflops']:.1f}) | GEMM efficiency {r['eff']:.2f}")
    print("  parts (s): " + ", ".join(f"{k} {v:.4f}" for k, v in r["parts"].items()))
    print(f"  memory per GPU {r['memory'] / 2**30:.1f} GiB (states {r['states'] / 2**30:.1f}, activations "
          f"{r['activations'] / 2**30:.1f}); fits: {r['fits']}")


def divisors(n):
    return [k for k in range(1, n + 1) if n % k == 0]


def advise(M, gpu, gpus, B, dtype="bf16", top=10, flash=False):
    g = GPUS[gpu]
    rows = []
    for t in [k for k in (1, 2, 4, 8) if k <= g["per_node"] and M.a % k == 0 and gpus % k == 0]:
        for p in [k for k in divisors(M.l) if gpus % (t * k) == 0]:
            d = gpus // (t * p)
            for v in [k for k in (1, 2, 4) if (k == 1 or (p > 1 and M.l % (p * k) == 0))]:
                for b in (1, 2, 4, 8):
                    if B % (b * d):
                        continue
                    if v > 1 and (B // (b * d)) % p:
                        continue
                    for rc in ("none", "selective", "full"):
                        L = Layout(t, p, v, d, b, B, rc, dtype, flash=flash)
                        r = predict(M, L, g)
                        if r["fits"]:
                            rows.append((r["tokens_per_s"], L, r))
    rows.sort(key=lambda x: -x[0])
    print(f"advisor: {M.params() / 1e9:.2f}B parameters, {gpus} x {gpu}, global batch {B}, {dtype}: "
          f"{len(rows)} layouts fit in {g['hbm_gb']} GB; the best by predicted throughput:")
    print(f"  {'rank':>4}  {'layout':<58} {'tokens/s':>11} {'TFLOP/s/GPU':>12} {'GiB/GPU':>8}")
    for i, (tps, L, r) in enumerate(rows[:top]):
        print(f"  {i + 1:>4}  {L.describe():<58} {tps:>11.0f} {r['tflops']:>12.1f} {r['memory'] / 2**30:>8.1f}")
    return rows


def published(out_md=None):
    """Narayanan et al. 2021 (SC21), Table 1: GPT models on A100-80GB (Selene), sequence 2048, vocabulary
    51200, full activation recomputation, mixed precision; the paper counts hardware FLOPs (with the
    recomputation). The 2024 H100 row (Megatron-LM README, GPT-3 shape with vocabulary 131072 and
    sequence 4096, TP 8 x PP 6 on 2304 GPUs, about 433 TFLOP/s per GPU, model FLOPs).
    Published: the shape, tp, pp, GPUs, global batch and the throughput; ASSUMED (not in the tables):
    micro-batch 1, no interleaving for the 2021 rows, interleaving (vp 2) and selective recomputation
    with TP communication overlap for the 2024 row, whose global batch (1152, the README's strong-scaling
    batch for this model) is also assumed."""
    path = os.path.join(HERE, "model", "published.csv")
    rows = list(csv.DictReader(open(path)))
    lines = [f"| source | params | layout | GPUs | batch | published TFLOP/s/GPU | predicted | error |",
             "|---|---|---|---|---|---|---|---|"]
    errs = []
    for row in rows:
        M = Model(int(row["layers"]), int(row["hidden"]), int(row["heads"]), int(row["seq"]), int(row["vocab"]))
        t, p, n, B = int(row["tp"]), int(row["pp"]), int(row["gpus"]), int(row["global_batch"])
        L = Layout(t, p, int(row["vp"]), n // (t * p), int(row["micro"]), B, row["recompute"], "bf16",
                   sp=row["sp"] == "1", distributed=row["distributed"] == "1", tp_overlap=float(row["tp_overlap"]))
        r = predict(M, L, row["gpu"])
        pred = r["hw_tflops"] if row["flops"] == "hardware" else r["tflops"]
        pub = float(row["tflops"])
        err = (pred - pub) / pub
        errs.append(abs(err))
        lines.append(f"| {row['source']} | {M.params() / 1e9:.1f}B | tp {t} pp {p} vp {row['vp']} b {row['micro']} "
                     f"{row['recompute']} | {n} | {B} | {pub:.0f} | {pred:.0f} | {100 * err:+.1f}% |")
    lines.append(f"\nmean |error| {100 * sum(errs) / len(errs):.1f}%, worst {100 * max(errs):.1f}% over {len(errs)} rows")
    text = "\n".join(lines)
    print(text)
    if out_md:
        with open(out_md, "w") as f:
            f.write("# Performance model against published Megatron-LM throughputs\n\n" + published.__doc__.strip()
                    + "\n\n" + text + "\n")
    return errs


def host_device(build, threads, layers=4, hidden=128, seq=128, tokens=512):
    """One rank's share of this machine as a 'GPU' for the model: the fp32 GEMM rate of exactly this
    model's GEMMs measured by gemm_roofline through Trident's ops/gemm with the rank's threads (peak:
    a 1024^3 GEMM; efficiency: the model's GEMMs over the peak), memory bandwidth from a large copy
    measured with numpy, and MPICH's shared-memory transport for the messages (~5 GB/s per direction)."""
    exe = os.path.join(build, "perf", "gemm_roofline")
    tmp = os.path.join(build, "perf", "roofline_host.json")
    subprocess.run([exe, "--square", "1024", "--hidden", str(hidden), "--seq", str(seq), "--tokens", str(tokens),
                    "--vocab", "50304", "--json", tmp], check=True, capture_output=True,
                   env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    info = json.load(open(tmp))
    peak = info["square"]["flops"] / info["square"]["median_s"]
    shape = next(v for k, v in info.items() if isinstance(v, list) and v and "layer_flops" in v[0])[0]
    rate = (layers * shape["layer_flops"] + shape["head_flops"]) / (layers * shape["layer_time_s"] + shape["head_time_s"])
    import time
    import numpy as np
    a = np.ones(2 ** 25, dtype=np.float32)
    t0 = time.perf_counter()
    for _ in range(5):
        a.copy()
    bw = 5 * 2 * a.nbytes / (time.perf_counter() - t0)
    return dict(peak={"fp32": peak / 1e12}, hbm_gb=24, hbm_tbps=bw / 1e12, nvlink_gbps=5.0, net_gbps=5.0, per_node=2,
                eff_max=rate / peak, x0=0.0, latency_us=5.0)


def local(build, out_md=None, iters=8):
    """Trident's GPT runs here against the model with the host as the device: step time and the
    memory Trident reports (parameters + gradients + optimizer, activations)."""
    cores = os.cpu_count() or 1
    devices = {}
    deck = os.path.join(ROOT, "inputs", "gpt_small.ini")
    shards = os.path.join(ROOT, "data", "sample", "kjv_gpt2_*.h5")
    M = Model(4, 128, 4, 128, 50257)
    cases = [("np1", 1, dict()), ("dp2", 2, dict(dp=2)), ("tp2", 2, dict(tp=2)), ("pp2", 2, dict(pp=2)),
             ("np1 full recompute", 1, dict(recompute="full"))]
    lines = ["| run | measured ms/iter | predicted | error | measured states+activations MiB | predicted | error |",
             "|---|---|---|---|---|---|---|"]
    work = os.path.join(build, "perf", "model_local")
    os.makedirs(work, exist_ok=True)
    for name, n, kw in cases:
        mcsv = os.path.join(work, name.replace(" ", "_") + ".csv")
        if os.path.exists(mcsv):
            os.remove(mcsv)  # its own scratch file: a run from scratch would refuse to replace it
        cmd = ["mpiexec", "-n", str(n), os.path.join(build, "apps", "pretrain_gpt"), "--deck", deck,
               "--data.train_shards", shards, "--train.iters", str(iters), "--eval.interval", "0",
               "--checkpoint.save=", "--log.metrics_file", mcsv, "--train.global_batch_size", "8"]
        tp, pp, dp = kw.get("tp", 1), kw.get("pp", 1), kw.get("dp", 1)
        threads = max(1, cores // n)  # what the app gives each rank (app_driver: the node's cores / ranks)
        if threads not in devices:
            devices[threads] = host_device(build, threads)
        dev = devices[threads]
        cmd += ["--parallel.tp", str(tp), "--parallel.pp", str(pp), "--precision.recompute", kw.get("recompute", "none")]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        rows = list(csv.DictReader(open(mcsv)))[2:]
        ms = sorted(float(r["ms_per_iter"]) for r in rows)[len(rows) // 2]
        figs = [float(x) for x in re.search(r"memory figures: (.*)", out).group(1).split()]
        measured_mem = (figs[0] + figs[1] + figs[2] + figs[5]) / 2**20  # rank 0: params, grads, optimizer, activations
        L = Layout(tp, pp, 1, dp, 4, 8, kw.get("recompute", "none"), "fp32", sp=False, distributed=False,
                   dp_overlap=False)
        r = predict(M, L, dev)
        pred_ms = r["time"] * 1e3
        pred_mem = (r["states"] + r["activations"]) / 2**20
        lines.append(f"| {name} | {ms:.1f} | {pred_ms:.1f} | {100 * (pred_ms - ms) / ms:+.0f}% | {measured_mem:.1f} | "
                     f"{pred_mem:.1f} | {100 * (pred_mem - measured_mem) / measured_mem:+.0f}% |")
    text = "\n".join(lines)
    for threads, dev in sorted(devices.items()):
        print(f"host, {threads} thread(s) per rank: fp32 GEMM peak {dev['peak']['fp32'] * 1e3:.1f} GFLOP/s, this model's GEMMs at "
              f"{dev['eff_max']:.2f} of it, copy bandwidth {dev['hbm_tbps'] * 1e3:.1f} GB/s")
    print(text)
    if out_md:
        with open(out_md, "w") as f:
            f.write("# Performance model against Trident runs on this machine\n\n" + local.__doc__.strip() + "\n\n"
                    + "GPT small (4 layers, hidden 128, seq 128, GPT-2 vocabulary), micro-batch 4, global batch 8, "
                      "fp32, on " + str(cores) + " cores; per rank: " + "; ".join(
                          f"{t} thread(s): fp32 GEMM peak {d['peak']['fp32'] * 1e3:.1f} GFLOP/s, the model's GEMMs "
                          f"at {d['eff_max']:.2f} of it" for t, d in sorted(devices.items())) + "\n\n" + text + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("predict", "advise"):
        q = sub.add_parser(name)
        q.add_argument("--gpu", default="h100-sxm", choices=sorted(GPUS))
        q.add_argument("--layers", type=int, required=True)
        q.add_argument("--hidden", type=int, required=True)
        q.add_argument("--heads", type=int, required=True)
        q.add_argument("--seq", type=int, default=2048)
        q.add_argument("--vocab", type=int, default=51200)
        q.add_argument("--ffn", type=int, default=0)
        q.add_argument("--global", dest="global_batch", type=int, required=True)
        q.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
        q.add_argument("--flash", action="store_true")
        if name == "predict":
            for k, dflt in (("tp", 1), ("pp", 1), ("vp", 1), ("dp", 1), ("micro", 1)):
                q.add_argument("--" + k, type=int, default=dflt)
            q.add_argument("--recompute", default="none", choices=["none", "selective", "full"])
            q.add_argument("--no-sp", action="store_true")
            q.add_argument("--no-distributed", action="store_true")
            q.add_argument("--tp-overlap", type=float, default=0.0)
        else:
            q.add_argument("--gpus", type=int, required=True)
            q.add_argument("--top", type=int, default=10)
            q.add_argument("--expect", metavar="TP,PP",
                           help="exit 1 unless a layout with this tensor- and pipeline-parallel size is among the best --top")
    q = sub.add_parser("published")
    q.add_argument("--out")
    q.add_argument("--max-mean-error", type=float, default=0.0,
                   help="exit 1 when the mean |relative error| over the rows exceeds this (0: report only)")
    q.add_argument("--max-error", type=float, default=0.0, help="the same for the worst row")
    q = sub.add_parser("local")
    q.add_argument("--build", default=os.path.join(ROOT, "build"))
    q.add_argument("--out")
    a = ap.parse_args()
    if a.cmd == "published":
        errs = published(a.out)
        mean, worst = sum(errs) / len(errs), max(errs)
        if (a.max_mean_error and mean > a.max_mean_error) or (a.max_error and worst > a.max_error):
            print(f"FAIL: mean |error| {mean:.3f} (limit {a.max_mean_error}), worst {worst:.3f} (limit {a.max_error})")
            return 1
        return 0
    if a.cmd == "local":
        local(a.build, a.out)
        return 0
    M = Model(a.layers, a.hidden, a.heads, a.seq, a.vocab, a.ffn or None)
    if a.cmd == "advise":
        rows = advise(M, a.gpu, a.gpus, a.global_batch, a.dtype, a.top, a.flash)
        if not rows:
            print("FAIL: no layout fits")
            return 1
        if a.expect:
            tp, pp = (int(x) for x in a.expect.split(","))
            ranks = [i + 1 for i, (_, L, _) in enumerate(rows[:a.top]) if (L.tp, L.pp) == (tp, pp)]
            if not ranks:
                print(f"FAIL: no layout with tp {tp} pp {pp} among the best {a.top}")
                return 1
            print(f"expected layout tp {tp} pp {pp}: rank {ranks[0]} of the best {a.top}")
        return 0
    L = Layout(a.tp, a.pp, a.vp, a.dp, a.micro, a.global_batch, a.recompute, a.dtype, sp=not a.no_sp and a.tp > 1,
               distributed=not a.no_distributed, flash=a.flash, tp_overlap=a.tp_overlap)
    print_prediction(M, L, a.gpu, predict(M, L, a.gpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
