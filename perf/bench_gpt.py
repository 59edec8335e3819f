#!/usr/bin/python3
"""GPT and Llama training throughput on the CPU: Trident next to PyTorch, against the GEMM roofline.

(About 600 lines: the benchmark, its per-op breakdown and its report are one procedure whose
steps share the run's measurements.)

For each shape (default: GPT-2 124M = 12 layers x 768 x 12 heads, and "small" = 6 x 384 x 6 heads)
at micro batch = global batch = B (4), sequence T (64), with the same number of threads (2):

  1. gemm_roofline   the machine's fp32 GEMM rate through Trident's ops/gemm (oneDNN) for exactly
                     the GEMMs of one step of that shape; their FLOP-weighted rate is the roofline
                     (what a step would reach if everything but the GEMMs were free);
  2. Trident         apps/pretrain_gpt for --iters steps; median ms/iter of the steps after the
                     first --warmup, from its metrics CSV;
  3. PyTorch         perf/torch_gpt.py, the same model, optimizer and shapes, same threads;
  4. Trident again   under perf's Kokkos Tools kernel timer (libtrident_kernel_timer.so), warm-up
                     steps skipped, for the per-op time breakdown (GEMM region vs kernel families).

Prints a table (shape | Trident tok/s | PyTorch tok/s | ratio | Trident TFLOP/s | roofline TFLOP/s |
fraction of roofline) and the breakdown, and writes perf/results/gpt_cpu_<date>_<cpu key>.{md,json}.
Model FLOPs: Megatron's 72 B s l h^2 (1 + s/6h + V/12hl), V = padded vocabulary (50304), on both sides.

--arch llama runs the Llama family's layer instead (perf/decks/llama_bench.ini: rotary positions,
RMSNorm, SwiGLU, grouped-query attention, untied output layer, no linear biases) at the shapes
124m = 12 x 768, 12 heads in 4 key/value groups, F = 2048 (GPT-2 124M's depth and width with
Llama's 8h/3 MLP), small = 6 x 384, 6 heads in 2 groups, F = 1024; the PyTorch peer is
torch_gpt.py --arch llama, the roofline the GEMMs of that layer (gemm_roofline --ffn --groups
--swiglu), and the FLOPs Megatron's general form 12 B s l h^2 ((1 + ng/nh + s/h) + 3F/2h + V/2lh),
which must equal the number Trident prints (the run stops otherwise). Results:
perf/results/llama_cpu_<date>_<cpu key>.{md,json}.

Run from anywhere (paths default to the repository this script is in and its build-perf/):
  /usr/bin/python3 perf/bench_gpt.py                     # the benchmark (a few minutes on 2 cores)
  /usr/bin/python3 perf/bench_gpt.py --smoke             # every piece on a tiny shape, 2 steps
  /usr/bin/python3 perf/bench_gpt.py --arch llama        # the Llama-family layer
"""
import argparse
import csv
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (layers, hidden, heads)
SHAPES = {
    "124m": (12, 768, 12),
    "small": (6, 384, 6),
    "smoke": (2, 128, 2),
    "345m": (24, 1024, 16),
}
SHAPE_TITLES = {"124m": "GPT-2 124M (12 x 768)", "small": "6 x 384", "smoke": "smoke 2 x 128",
                "345m": "GPT-2 345M (24 x 1024)"}
VOCAB = 50257

# --arch llama: name: (layers, hidden, heads, key/value groups, SwiGLU width F)
LLAMA_SHAPES = {
    "124m": (12, 768, 12, 4, 2048),
    "small": (6, 384, 6, 2, 1024),
    "smoke": (2, 128, 2, 1, 352),
}
LLAMA_TITLES = {"124m": "Llama 124M-class (12 x 768, 12 heads / 4 groups, F 2048)",
                "small": "Llama 6 x 384 (6 heads / 2 groups, F 1024)", "smoke": "Llama smoke 2 x 128"}


def arch_of(a):
    """The run's architecture; drivers that reuse these helpers (bench_mixed.py, bench_gpu.py) have
    no --arch and run GPT-2's layer."""
    return getattr(a, "arch", "gpt")


def shape_of(a, name):
    """(layers, hidden, heads, groups, ffn) of a shape name for the run's architecture."""
    if arch_of(a) == "llama":
        return LLAMA_SHAPES[name]
    L, C, H = SHAPES[name]
    return L, C, H, H, 4 * C


def title_of(a, name):
    return (LLAMA_TITLES if arch_of(a) == "llama" else SHAPE_TITLES)[name]


def padded_vocab(v, multiple=128):
    return (v + multiple - 1) // multiple * multiple


def megatron_flops(batch, seq, layers, hidden, vocab):
    s, h, l, V = float(seq), float(hidden), float(layers), float(vocab)
    return 72.0 * batch * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * h * l))


def llama_flops(batch, seq, layers, hidden, heads, groups, ffn, vocab):
    """Megatron's num_floating_point_operations (megatron/training/training.py) for a SwiGLU,
    grouped-query layer with kv_channels = h / nh: 12 B s l h^2 ((1 + ng/nh + s/h) + 3F/2h + V/2lh)."""
    s, h, l, V, F = float(seq), float(hidden), float(layers), float(vocab), float(ffn)
    return 12.0 * batch * s * l * h * h * ((1.0 + groups / heads + s / h) + 1.5 * F / h + V / (2.0 * l * h))


def model_flops(a, shape):
    L, C, H, G, F = shape_of(a, shape)
    if arch_of(a) == "llama":
        return llama_flops(a.batch, a.seq, L, C, H, G, F, padded_vocab(VOCAB))
    return megatron_flops(a.batch, a.seq, L, C, padded_vocab(VOCAB))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=["gpt", "llama"], default="gpt",
                   help="gpt: GPT-2's layer (perf/decks/gpt_bench.ini); llama: the Llama family's (llama_bench.ini)")
    p.add_argument("--shapes", default="124m,small", help="comma list of: " + ", ".join(SHAPES)
                   + " (--arch llama: " + ", ".join(LLAMA_SHAPES) + ")")
    p.add_argument("--batch", type=int, default=4, help="micro batch = global batch")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--threads", type=int, default=2, help="threads for both (oneDNN's OpenMP; torch + OpenBLAS)")
    p.add_argument("--iters", type=int, default=6, help="training steps per run, warm-up included")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the timing")
    p.add_argument("--dropout", type=float, default=0.1,
                   help="hidden and attention dropout on both sides (Trident's default and GPT-2's: 0.1)")
    p.add_argument("--roofline-min-time", type=float, default=0.25, help="seconds of repetitions per GEMM shape")
    p.add_argument("--square", type=int, default=2048, help="square GEMM size for the peak (0: skip)")
    p.add_argument("--build-dir", default=os.path.join(REPO, "build-perf"))
    p.add_argument("--bin-dir", default="", help="where pretrain_gpt is (default: <build-dir>/apps)")
    p.add_argument("--roofline-bin", default="", help="gemm_roofline (default: <build-dir>/perf/gemm_roofline)")
    p.add_argument("--timer-lib", default="",
                   help="kernel timer library (default: <build-dir>/perf/libtrident_kernel_timer.so)")
    p.add_argument("--deck", default="", help="default: perf/decks/gpt_bench.ini (--arch llama: llama_bench.ini)")
    p.add_argument("--shards", default="", help="override data.train_shards (default: the deck's, from the repo root)")
    p.add_argument("--python", default="/usr/bin/python3", help="interpreter with torch (Debian's)")
    p.add_argument("--openblas-coretype", default="auto",
                   help="OpenBLAS kernel set for PyTorch's GEMMs: auto (unset OPENBLAS_CORETYPE: OpenBLAS picks "
                        "for this CPU), inherit (keep the environment's), or a name (Haswell, SkylakeX, Cooperlake, Zen)")
    p.add_argument("--out-dir", default=os.path.join(REPO, "perf", "results"))
    p.add_argument("--work-dir", default="",
                   help="raw outputs of the runs: logs, metrics CSVs, timer JSON (default: perf/work, git-ignored; "
                        "with --smoke: --out-dir)")
    p.add_argument("--tag", default="", help="suffix of the result files: gpt_cpu_<date>_<cpu key>[_<tag>]")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    p.add_argument("--no-profile", action="store_true", help="skip the kernel-timer run")
    p.add_argument("--smoke", action="store_true",
                   help="tiny shape, 2 steps, short GEMM timing; results under --out-dir (the test passes the build dir)")
    a = p.parse_args(argv)
    if a.smoke:
        if "--shapes" not in " ".join(argv or sys.argv):
            a.shapes = "smoke"
        a.iters, a.warmup = 2, 1
        a.roofline_min_time = 0.01
        a.square = 256
        a.tag = a.tag or "smoke"
    a.bin_dir = a.bin_dir or os.path.join(a.build_dir, "apps")
    a.roofline_bin = a.roofline_bin or os.path.join(a.build_dir, "perf", "gemm_roofline")
    a.timer_lib = a.timer_lib or os.path.join(a.build_dir, "perf", "libtrident_kernel_timer.so")
    a.deck = a.deck or os.path.join(REPO, "perf", "decks", f"{a.arch}_bench.ini")
    a.shape_list = [s.strip() for s in a.shapes.split(",") if s.strip()]
    known = LLAMA_SHAPES if a.arch == "llama" else SHAPES
    for s in a.shape_list:
        if s not in known:
            p.error(f"unknown shape {s!r} for --arch {a.arch} (known: {', '.join(known)})")
    if a.iters <= a.warmup:
        p.error("--iters must exceed --warmup")
    return a


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def env_prefix(env):
    """Shell form of an environment change: `env -u X` for removed variables, X=v for set ones."""
    unset = [k for k, v in env.items() if v is None]
    sets = [f"{k}={shlex.quote(v)}" for k, v in env.items() if v is not None]
    return " ".join((["env"] + [f"-u {k}" for k in unset] if unset else []) + sets)


class Runner:
    """Runs commands from the repo root, echoes them, and keeps them for the report."""

    def __init__(self):
        self.commands = []

    def run(self, cmd, env_extra, what, log_path=None, timeout=None):
        env = dict(os.environ)
        for k, v in env_extra.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        shown = (env_prefix(env_extra) + " " if env_extra else "") + " ".join(shlex.quote(c) for c in cmd)
        self.commands.append(shown)
        print(f"\n[{what}] load {loadavg()}\n$ {shown}", flush=True)
        t0 = time.time()
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as e:
            tail = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode(errors="replace")
            sys.stdout.write(tail[-4000:])
            raise RuntimeError(f"{what} did not finish within {timeout:.0f} s: {shown}")
        if log_path:
            with open(log_path, "w") as f:
                f.write(proc.stdout)
        if proc.returncode != 0:
            sys.stdout.write(proc.stdout[-4000:])
            raise RuntimeError(f"{what} failed (exit {proc.returncode}): {shown}")
        print(f"  ok in {time.time() - t0:.1f} s, load {loadavg()}", flush=True)
        return proc.stdout


def cpu_key(facts):
    """<vendor>-f<family>-m<model> (e.g. amd-f26-m2): result files are kept per CPU under this key."""
    vendor = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}.get(facts.get("Vendor ID", ""),
                                                                  re.sub(r"\W+", "", facts.get("Vendor ID", "cpu")).lower() or "cpu")
    return f"{vendor}-f{facts.get('CPU family', 'x')}-m{facts.get('Model', 'x')}"


def machine_facts():
    facts = {"hostname": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count()}
    try:
        out = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            k, v = k.strip(), v.strip()
            if k in ("Model name", "Vendor ID", "CPU family", "Model", "Core(s) per socket", "Socket(s)",
                     "Thread(s) per core", "L2 cache", "L3 cache"):
                facts[k] = v
            if k == "Flags":
                flags = v.split()
                facts["simd"] = " ".join(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c", "sse4", "sve",
                                                                          "asimd", "vnni")))
                facts["flags"] = v
    except OSError:
        pass
    facts["cpu_key"] = cpu_key(facts)
    try:
        with open("/proc/meminfo") as f:
            facts["memory_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    try:
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               stdout=subprocess.PIPE, text=True).stdout.strip()
        facts["trident_commit"] = head + (" (+ uncommitted changes)" if dirty else "")
    except OSError:
        pass
    return facts


def roofline_for(roof, hidden, layers):
    """FLOP-weighted GEMM rate of one step of `layers` layers at `hidden` (FLOP/s) and its GEMM time."""
    for m in roof["models"]:
        if m["hidden"] == hidden:
            flops = layers * m["layer_flops"] + m["head_flops"]
            t = layers * m["layer_time_s"] + m["head_time_s"]
            return flops / t, flops, t
    raise KeyError(hidden)


def fresh_metrics(path):
    """A benchmark's own scratch metrics file (and its .eval sibling), removed before a run: a run
    from scratch refuses to replace a metrics file with rows (train/output_checks.hpp)."""
    stem, ext = os.path.splitext(path)
    for p in (path, stem + ".eval" + ext):
        if os.path.exists(p):
            os.remove(p)
    return path


def trident_cmd(a, shape, metrics_file):
    fresh_metrics(metrics_file)
    L, C, H, G, F = shape_of(a, shape)
    cmd = [os.path.join(a.bin_dir, "pretrain_gpt"), "--deck", a.deck,
           "--model.num_layers", str(L), "--model.hidden_size", str(C), "--model.num_heads", str(H),
           "--model.seq_length", str(a.seq), "--model.max_position_embeddings", str(a.seq),
           "--train.micro_batch_size", str(a.batch),
           "--train.global_batch_size", str(a.batch * getattr(a, "accum", 1)),  # accum micro-batches a step
           "--model.hidden_dropout", str(a.dropout), "--model.attention_dropout", str(a.dropout),
           "--train.iters", str(a.iters), "--eval.interval", "0", "--log.interval", "1",
           "--log.metrics_file", metrics_file]
    if arch_of(a) == "llama":  # the rest of the layer (RMSNorm, RoPE, SwiGLU, untied, no biases) is the deck's
        cmd += ["--model.num_query_groups", str(G), "--model.ffn_hidden_size", str(F)]
    if a.shards:
        cmd += ["--data.train_shards", a.shards]
    return cmd


def read_trident(metrics_file, stdout, a):
    with open(metrics_file) as f:
        rows = list(csv.DictReader(f))
    if len(rows) < a.iters:
        raise RuntimeError(f"{metrics_file}: {len(rows)} rows, expected {a.iters}")
    ms = [float(r["ms_per_iter"]) for r in rows]
    timed = ms[a.warmup:]
    m = re.search(r"model FLOPs per iteration: (\S+)(?: \((.*)\))?$", stdout, re.M)
    flops = float(m.group(1)) if m else None
    formula = m.group(2) if m and m.group(2) else ""
    done = re.search(r"^done: .*$", stdout, re.M)
    npar = re.search(r"(\d+) parameters", stdout)
    per_iter = statistics.median(timed) / 1e3
    tokens = a.batch * getattr(a, "accum", 1) * a.seq
    return {"step_ms": ms, "ms_per_iter": per_iter * 1e3, "tokens_per_s": tokens / per_iter,
            "flops_per_iter": flops, "tflops": flops / per_iter / 1e12 if flops else None,
            "losses": [float(r["loss"]) for r in rows], "phases": done.group(0) if done else "",
            "flops_formula": formula,
            "parameters": int(npar.group(1)) if npar else None}


# ---- per-op breakdown ----------------------------------------------------------------------------
# the host GEMMs' regions (fp32, 16-bit; grouped, batched, with epilogues), their names alone or, under
# TRIDENT_GEMM_REGION_SHAPES=1, followed by the call's shape (ops/gemm_region.hpp)
GEMM_REGION = r"^ops::gemm(_lt)?(_bf16|_fp16)?(_grouped|_batched)?( |$)"
GEMM_SHAPE = re.compile(r"^ops::gemm(?:_lt)?(?:_bf16|_fp16)?(?:_batched)? (?P<op>[NT]{2}) M=(?P<M>\d+) N=(?P<N>\d+) K=(?P<K>\d+) "
                        r"batch=(?P<batch>\d+) beta=(?P<beta>\S+)$")
FAMILIES = [
    (GEMM_REGION, "GEMM (oneDNN, ops::gemm regions)"),
    (r"^ops::(pack_half|unpack_half)$", "casts fp32 <-> 16-bit"),
    (r"layernorm", "LayerNorm fwd/bwd"),
    (r"rmsnorm", "RMSNorm fwd/bwd"),
    (r"gelu", "GELU fwd/bwd"),
    (r"swiglu", "SwiGLU fwd/bwd"),
    (r"ops::rope", "rotary positions fwd/bwd"),
    (r"causal_softmax|masked_softmax", "attention softmax fwd/bwd"),
    (r"attention_(split|merge|permute)", "attention head split/merge/permute"),
    (r"cross_entropy|sum_losses|vocab_parallel_ce", "cross-entropy (fused fwd+bwd)"),
    (r"embedding|add_positions", "embedding fwd/bwd"),
    (r"dropout", "dropout fwd/bwd"),
    (r"add_bias|bias_backward", "bias add / bias grad"),
    (r"^ops::(add|accumulate|scale)$", "residual add / accumulate / scale"),
    (r"sum_squares|has_nonfinite", "grad norm (sum of squares)"),
    (r"adamw", "AdamW step"),
    (r"deep_copy fill params::grads", "zero grads (fill)"),
    (r"deep_copy", "other deep_copy / fills"),
]


def family_of(name):
    for pat, fam in FAMILIES:
        if re.search(pat, name):
            return fam
    return name


def breakdown(timer, timed_iters, gemm_time_isolated, gemm_flops):
    """Rows (family, seconds per iteration, % of step) from the kernel timer's JSON."""
    total = timer["total_s"]
    fam = {}
    for e in timer["regions"]:
        if re.match(GEMM_REGION, e["name"]):
            f = family_of(e["name"])
            fam.setdefault(f, [0.0, 0])
            fam[f][0] += e["seconds"]
            fam[f][1] += e["calls"]
    for e in timer["kernels"]:
        # Kernels inside a region (none in Trident today) are already in the region's time.
        s = e["seconds"] - e.get("seconds_in_region", 0.0)
        f = family_of(e["name"])
        fam.setdefault(f, [0.0, 0])
        fam[f][0] += s
        fam[f][1] += e["calls"]
    rows = [(f, v[0] / timed_iters, 100.0 * v[0] / total if total else 0.0, v[1] // max(1, timed_iters))
            for f, v in fam.items()]
    other = timer["summary"]["other_s"]
    rows.sort(key=lambda r: -r[1])
    rows.append(("other host code (data, launches, logging)", other / timed_iters, 100.0 * other / total, 0))
    gemm_s = sum(e["seconds"] for e in timer["regions"] if re.match(GEMM_REGION, e["name"])) / timed_iters
    top_kernels = [(e["name"], e["type"], e["seconds"] / timed_iters, 100.0 * e["seconds"] / total,
                    e["calls"] // max(1, timed_iters)) for e in timer["kernels"]][:12]
    return {
        "step_ms": 1e3 * total / timed_iters,
        "families": [{"family": r[0], "ms_per_iter": 1e3 * r[1], "percent": r[2], "calls_per_iter": r[3]} for r in rows],
        "top_kernels": [{"kernel": k[0], "type": k[1], "ms_per_iter": 1e3 * k[2], "percent": k[3],
                         "calls_per_iter": k[4]} for k in top_kernels],
        "gemm_ms_per_iter": 1e3 * gemm_s,
        "gemm_ms_isolated": 1e3 * gemm_time_isolated,
        "gemm_gflops_in_training": gemm_flops / gemm_s / 1e9 if gemm_s > 0 else None,
        "non_gemm_ms_per_iter": 1e3 * (total / timed_iters - gemm_s),
    }


def gemm_shapes(timer, timed_iters, roof_model):
    """Per GEMM shape of the step (the kernel timer's regions under TRIDENT_GEMM_REGION_SHAPES=1):
    its time per step in training against the same shape alone in gemm_roofline (roof_model: the
    roofline JSON's entry for this hidden size), largest loss first. Rows: name, op, M, N, K,
    batch, calls and ms per step, GFLOP/s in training and alone, ms per step lost to the isolated
    rate."""
    alone = {(s["op"], s["M"], s["N"], s["K"], s["batch"]): s for s in (roof_model or {}).get("shapes", [])}
    seen = {}
    for e in timer["regions"]:
        m = GEMM_SHAPE.match(e["name"])
        if not m:
            continue
        key = (m["op"], int(m["M"]), int(m["N"]), int(m["K"]), int(m["batch"]))
        acc = seen.setdefault(key, [0.0, 0])
        acc[0] += e["seconds"]
        acc[1] += e["calls"]
    rows = []
    for key, (sec, calls) in seen.items():
        op, M, N, K, batch = key
        flops = 2.0 * M * N * K * batch
        per_call = sec / calls
        s = alone.get(key)
        rows.append({"name": s["name"].strip() if s else "", "op": op, "M": M, "N": N, "K": K, "batch": batch,
                     "calls_per_iter": calls / timed_iters, "ms_per_iter": 1e3 * sec / timed_iters,
                     "gflops_training": flops / per_call / 1e9,
                     "gflops_alone": flops / s["median_s"] / 1e9 if s else None,
                     "lost_ms_per_iter": 1e3 * (per_call - s["median_s"]) * calls / timed_iters if s else None})
    rows.sort(key=lambda r: -(r["lost_ms_per_iter"] if r["lost_ms_per_iter"] is not None else r["ms_per_iter"]))
    return rows


def gemm_shapes_text(rows):
    """The per-shape table (gemm_shapes) as Markdown lines."""
    out = ["| GEMM | op | M | N | K | batch | calls/step | ms/step | GFLOP/s in training | GFLOP/s alone | "
           "ms/step lost |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['name'] or '(not in the roofline)'} | {r['op']} | {r['M']} | {r['N']} | {r['K']} | "
                   f"{r['batch']} | {r['calls_per_iter']:.0f} | {r['ms_per_iter']:.2f} | {r['gflops_training']:.0f} | "
                   f"{fmt(r['gflops_alone'], '.0f')} | {fmt(r['lost_ms_per_iter'], '.2f')} |")
    return out


# ---- report -----------------------------------------------------------------------------------------
def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def summary_table(results):
    head = ("| shape | Trident tok/s | PyTorch tok/s | ratio | Trident model TFLOP/s | PyTorch TFLOP/s "
            "| roofline TFLOP/s | fraction of roofline |")
    lines = [head, "|" + "---|" * 8]
    for r in results:
        t, p = r["trident"], r.get("torch")
        ratio = t["tokens_per_s"] / p["tokens_per_s"] if p else None
        lines.append(f"| {r['title']} | {t['tokens_per_s']:.0f} | {fmt(p and p['tokens_per_s'], '.0f')} "
                     f"| {fmt(ratio, '.2f')}x | {t['tflops']:.4f} | {fmt(p and p['tflops'], '.4f')} "
                     f"| {r['roofline_tflops']:.4f} | {100 * r['fraction_of_roofline']:.1f}% |")
    return "\n".join(lines)


def breakdown_text(r):
    b = r.get("breakdown")
    if not b:
        return "(no kernel-timer run)"
    out = [f"Per-op time, {r['title']}: {b['step_ms']:.1f} ms per step under the timer "
           f"(steps after warm-up; unprofiled median {r['trident']['ms_per_iter']:.1f} ms)",
           "| op family | ms/step | % of step | calls/step |", "|---|---|---|---|"]
    for f in b["families"]:
        out.append(f"| {f['family']} | {f['ms_per_iter']:.2f} | {f['percent']:.1f}% | {f['calls_per_iter'] or ''} |")
    out.append("")
    out.append(f"GEMMs: {b['gemm_ms_per_iter']:.1f} ms/step in training = "
               f"{fmt(b['gemm_gflops_in_training'], '.0f')} GFLOP/s, vs {b['gemm_ms_isolated']:.1f} ms "
               f"({r['roofline_tflops'] * 1e3:.0f} GFLOP/s) for the same GEMMs in gemm_roofline; "
               f"everything else: {b['non_gemm_ms_per_iter']:.1f} ms/step.")
    out.append("")
    out.append("Top kernels (host kernels: the rank's threads share them unless TRIDENT_HOST_OPENMP=0):")
    out.append("| kernel | type | ms/step | % of step | calls/step |")
    out.append("|---|---|---|---|---|")
    for k in b["top_kernels"]:
        out.append(f"| {k['kernel']} | {k['type']} | {k['ms_per_iter']:.2f} | {k['percent']:.1f}% | {k['calls_per_iter']} |")
    return "\n".join(out)


def limits_text(r):
    """What limits the step, in numbers from the breakdown."""
    b = r.get("breakdown")
    if not b:
        return ""
    step = b["step_ms"]
    fam = {f["family"]: f for f in b["families"]}
    gemm = b["gemm_ms_per_iter"]
    lines = [f"- {r['title']}: GEMMs take {gemm:.0f} of {step:.0f} ms ({100 * gemm / step:.0f}%), running at "
             f"{fmt(b['gemm_gflops_in_training'], '.0f')} GFLOP/s in training vs {r['roofline_tflops'] * 1e3:.0f} "
             f"alone; the rest, {b['non_gemm_ms_per_iter']:.0f} ms, is host kernels and host code."]
    others = [f for f in b["families"] if not f["family"].startswith("GEMM")][:4]
    if others:
        lines.append("  Largest non-GEMM parts: " + "; ".join(
            f"{f['family']} {f['ms_per_iter']:.0f} ms ({f['percent']:.0f}%)" for f in others) + ".")
    n = r["trident"].get("parameters")
    if n:
        parts = []
        ad = fam.get("AdamW step")
        if ad and ad["ms_per_iter"] > 0:
            # reads p, g, m, v; writes p, m, v and g (zeroed in the same sweep since the fused
            # zeroing of 2026-12-03; results files before it counted 28 bytes)
            parts.append(f"AdamW moves {32 * n / 1e9:.2f} GB per step at {32 * n / (ad['ms_per_iter'] / 1e3) / 1e9:.1f} GB/s")
        gn = fam.get("grad norm (sum of squares)")
        if gn and gn["ms_per_iter"] > 0:
            parts.append(f"the grad norm reads {4 * n / 1e9:.2f} GB at {4 * n / (gn['ms_per_iter'] / 1e3) / 1e9:.1f} GB/s")
        if parts:
            lines.append(f"  Over all {n / 1e6:.1f}M parameters, " + "; ".join(parts) + ".")
    if gemm > 0:
        lines.append(f"  With every non-GEMM part free, this step would reach "
                     f"{100 * min(1.0, b['gemm_ms_isolated'] / gemm):.0f}% of the roofline "
                     f"(in-training GEMM rate / isolated rate).")
    return "\n".join(lines)


def quality_warnings(results, load_start):
    """Signs that something else was running: the numbers then say little (rerun on a quiet machine)."""
    w = []
    try:
        if float(load_start.split()[0]) > 0.7:
            w.append(f"load average {load_start} before the start: other work was running")
    except (ValueError, IndexError):
        pass
    for r in results:
        for side in ("trident", "torch"):
            d = r.get(side)
            if not d:
                continue
            timed = d["step_ms"][d.get("warmup", 0) if side == "torch" else r.get("warmup", 0):]
            if len(timed) >= 2 and max(timed) > 1.3 * min(timed):
                w.append(f"{r['title']}: {side} step times vary by more than 30% ({', '.join(f'{t:.0f}' for t in timed)} ms)")
        b = r.get("breakdown")
        if b:
            if b["gemm_gflops_in_training"] and b["gemm_gflops_in_training"] > 1.1 * r["roofline_tflops"] * 1e3:
                w.append(f"{r['title']}: GEMMs ran faster in training ({b['gemm_gflops_in_training']:.0f} GFLOP/s) than "
                         f"in gemm_roofline ({r['roofline_tflops'] * 1e3:.0f}): the roofline run was disturbed")
            t = r["trident"]["ms_per_iter"]
            if abs(b["step_ms"] - t) > 0.2 * t:
                w.append(f"{r['title']}: the profiled run ({b['step_ms']:.0f} ms/step) and the timed run ({t:.0f}) "
                         "disagree by more than 20%")
    return w


def verdict(results):
    lines = []
    for r in results:
        p = r.get("torch")
        if p:
            ratio = r["trident"]["tokens_per_s"] / p["tokens_per_s"]
            lines.append(f"- {r['title']}: {ratio:.2f}x PyTorch's tokens/s (target >= 3x: "
                         f"{'met' if ratio >= 3 else 'NOT met'})")
        if r["shape"] == "124m":
            fr = r["fraction_of_roofline"]
            lines.append(f"- {r['title']}: {100 * fr:.1f}% of the GEMM roofline (target >= 75%: "
                         f"{'met' if fr >= 0.75 else 'NOT met'})")
    return "\n".join(lines)


def write_report(a, facts, roof, results, runner, started, path_md, path_json):
    md = []
    arch = "Llama-family" if a.arch == "llama" else "GPT"
    md.append(f"# {arch} training throughput on the CPU: Trident vs PyTorch ({started:%Y-%m-%d %H:%M})\n")
    flops_text = (f"Megatron's 72 B s l h^2 (1 + s/6h + V/12hl), V = {padded_vocab(VOCAB)} "
                  f"(GPT-2's {VOCAB} padded to a multiple of 128, as Trident runs it) for both.\n"
                  if a.arch == "gpt" else
                  "Megatron's num_floating_point_operations for a SwiGLU, grouped-query layer, "
                  "12 B s l h^2 ((1 + ng/nh + s/h) + 3F/2h + V/2lh), V = "
                  f"{padded_vocab(VOCAB)}, for both; Trident printed the same number for every shape "
                  "(checked by the driver). Layer: rotary positions (base 10000), RMSNorm, SwiGLU, grouped-query "
                  "attention, untied output layer, no linear biases (perf/decks/llama_bench.ini; PyTorch: "
                  "torch_gpt.py --arch llama).\n")
    md.append(f"B = {a.batch} (micro = global), T = {a.seq}, {a.threads} threads each, fp32, dropout {a.dropout}, "
              "AdamW + grad clipping; "
              f"{a.iters} steps per run, the first {a.warmup} left out, median of the rest. "
              "Model FLOPs: " + flops_text)
    md.append(summary_table(results) + "\n")
    md.append("Targets (issues 2 and 22; the roofline target was 50% in issue 2):\n\n" + verdict(results) + "\n")
    warn = quality_warnings(results, results[0].get("load_start", "") if results else "")
    md.append("Measurement quality: " + ("no sign of interference (steady step times, roofline and profiled run "
                                         "consistent)." if not warn else "DISTURBED, rerun on a quiet machine:\n\n"
                                         + "\n".join("- " + x for x in warn)) + "\n")
    lim = "\n".join(t for t in (limits_text(r) for r in results) if t)
    if lim:
        md.append("What limits it:\n\n" + lim + "\n")
    md.append("## Roofline: fp32 GEMM through Trident's ops/gemm\n")
    md.append(f"Backend: {roof['backend']}, {roof['threads']} threads. The roofline of a shape is the FLOP-weighted "
              "rate of exactly the GEMMs of one training step (per layer: 4 linears x fwd, dgrad, wgrad"
              + (", and 6 batched attention products; the tied LM head" if a.arch == "gpt" else
                 " -- qkv of the heads and 2 x groups, fc1 of gate and up --, and 6 batched attention products; "
                 "the untied output layer") + " fwd, dgrad, wgrad), each timed alone in cache "
              "(median of repetitions): the step's speed if everything but the GEMMs were free.\n")
    md.append("| shape | step GEMM GFLOP | GEMM time (isolated) ms | roofline GFLOP/s |")
    md.append("|---|---|---|---|")
    for r in results:
        md.append(f"| {r['title']} | {r['gemm_flops'] / 1e9:.1f} | {1e3 * r['gemm_time_s']:.1f} "
                  f"| {r['roofline_tflops'] * 1e3:.0f} |")
    if "square" in roof:
        sq = roof["square"]
        md.append(f"\nPeak (square {sq['n']}^3 NN): {sq['flops'] / sq['median_s'] / 1e9:.0f} GFLOP/s "
                  f"(best repetition {sq['flops'] / sq['best_s'] / 1e9:.0f}).")
    md.append("\nEach GEMM of the step (GFLOP/s, median; M x N x K, x batch for the per-head attention products):\n")
    models = roof["models"]
    md.append("| GEMM | op | " + " | ".join(f"C = {m['hidden']}: shape | GFLOP/s" for m in models) + " |")
    md.append("|---|---|" + "---|---|" * len(models))
    for i, s0 in enumerate(models[0]["shapes"]):
        cells = []
        for m in models:
            s = m["shapes"][i]
            cells.append(f"{s['M']}x{s['N']}x{s['K']}" + (f" x{s['batch']}" if s["batch"] > 1 else ""))
            cells.append(f"{s['flops'] / s['median_s'] / 1e9:.0f}")
        md.append(f"| {s0['name']} | {s0['op']} | " + " | ".join(cells) + " |")
    md.append("")
    md.append("## Where the time goes (Trident, kernel timer)\n")
    for r in results:
        md.append(breakdown_text(r) + "\n")
        md.append(f"Trident phases: `{r['trident']['phases']}`\n")
    md.append("## PyTorch\n")
    for r in results:
        p = r.get("torch")
        if p:
            md.append(f"- {r['title']}: torch {p['torch_version']}, {p['torch_num_threads']} threads, "
                      f"OpenBLAS core `{p.get('openblas', {}).get('core', '?')}` "
                      f"({p.get('openblas', {}).get('config', '')}); steps ms {p['step_ms']}")
    md.append("\n## Machine\n")
    for k, v in facts.items():
        md.append(f"- {k}: {v}" if k != "flags" else f"- all CPU flags: `{v}`")
    md.append(f"- load average at start / end: {results[0].get('load_start', '?') if results else '?'} / {loadavg()}")
    md.append("\n## Commands (run from the repository root)\n")
    md.append("```\n" + "\n".join(runner.commands) + "\n```\n")
    md.append("Driver: `/usr/bin/python3 " + " ".join(shlex.quote(x) for x in sys.argv) + "`\n")
    os.makedirs(os.path.dirname(path_md), exist_ok=True)
    with open(path_md, "w") as f:
        f.write("\n".join(md) + "\n")
    with open(path_json, "w") as f:
        json.dump({"date": started.isoformat(timespec="seconds"), "settings": {
            "batch": a.batch, "seq": a.seq, "threads": a.threads, "iters": a.iters, "warmup": a.warmup,
            "flops_vocab": padded_vocab(VOCAB)}, "machine": facts, "roofline": roof, "results": results,
            "commands": runner.commands}, f, indent=1)


def main(argv=None):
    a = parse_args(argv)
    started = datetime.datetime.now()
    os.makedirs(a.out_dir, exist_ok=True)
    work = a.work_dir or (a.out_dir if a.smoke else os.path.join(REPO, "perf", "work"))
    os.makedirs(work, exist_ok=True)
    for path in (os.path.join(a.bin_dir, "pretrain_gpt"), a.roofline_bin) + (() if a.no_profile else (a.timer_lib,)):
        if not os.path.exists(path):
            sys.exit(f"bench_gpt: {path} is missing; build it: cmake --build {a.build_dir} -j2 "
                     "--target pretrain_gpt gemm_roofline trident_kernel_timer")
    runner = Runner()
    facts = machine_facts()
    threads_env = {"OMP_NUM_THREADS": str(a.threads), "OPENBLAS_NUM_THREADS": str(a.threads)}
    load_start = loadavg()
    # PyTorch's GEMMs are OpenBLAS's: which kernels it runs is part of the peer's configuration.
    if a.openblas_coretype == "auto":
        torch_env = {"OPENBLAS_CORETYPE": None} if "OPENBLAS_CORETYPE" in os.environ else {}
    elif a.openblas_coretype == "inherit":
        torch_env = {}
    else:
        torch_env = {"OPENBLAS_CORETYPE": a.openblas_coretype}
    facts["TRIDENT_HOST_OPENMP"] = os.environ.get("TRIDENT_HOST_OPENMP", "unset (host threads on)")
    facts["OPENBLAS_* in the environment"] = " ".join(
        f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("OPENBLAS_")) or "none"
    facts["OpenBLAS kernel choice for PyTorch (--openblas-coretype)"] = a.openblas_coretype

    dims = {shape_of(a, s)[1]: shape_of(a, s) for s in a.shape_list}
    hidden = sorted(dims)
    head_dims = {C // dims[C][2] for C in hidden}
    if len(head_dims) != 1:
        sys.exit("bench_gpt: the shapes must share one head size (gemm_roofline takes one --head-dim)")
    roof_json = os.path.join(work, "gemm_roofline.json")
    roof_cmd = [a.roofline_bin, "--tokens", str(a.batch * a.seq), "--seq", str(a.seq), "--hidden",
                ",".join(map(str, hidden)), "--head-dim", str(head_dims.pop()), "--vocab", str(padded_vocab(VOCAB)),
                "--square", str(a.square), "--min-time", str(a.roofline_min_time), "--json", roof_json]
    if a.arch == "llama":
        roof_cmd += ["--ffn", ",".join(str(dims[C][4]) for C in hidden),
                     "--groups", ",".join(str(dims[C][3]) for C in hidden), "--swiglu"]
    out = runner.run(roof_cmd, threads_env, "GEMM roofline", os.path.join(work, "gemm_roofline.txt"))
    print(out)
    with open(roof_json) as f:
        roof = json.load(f)

    results = []
    for shape in a.shape_list:
        L, C, H, G, F = shape_of(a, shape)
        r = {"shape": shape, "title": title_of(a, shape), "arch": a.arch, "layers": L, "hidden": C, "heads": H,
             "groups": G, "ffn": F,
             "load_start": load_start, "warmup": a.warmup}
        rate, gflops, gtime = roofline_for(roof, C, L)
        r.update(roofline_tflops=rate / 1e12, gemm_flops=gflops, gemm_time_s=gtime)
        # the roofline's GEMMs are the step's: their FLOPs are the model FLOPs, term by term
        if abs(gflops - model_flops(a, shape)) > 1e-6 * gflops:
            raise RuntimeError(f"gemm_roofline's GEMMs of {shape} add up to {gflops:.6g} FLOPs, the model FLOPs "
                               f"are {model_flops(a, shape):.6g}")

        metrics = os.path.join(work, f"trident_{shape}.csv")
        out = runner.run(trident_cmd(a, shape, metrics), threads_env, f"Trident {shape}",
                         os.path.join(work, f"trident_{shape}.log"))
        r["trident"] = read_trident(metrics, out, a)
        if r["trident"]["flops_per_iter"] is None:
            r["trident"]["flops_per_iter"] = model_flops(a, shape)
            r["trident"]["tflops"] = r["trident"]["flops_per_iter"] / (r["trident"]["ms_per_iter"] / 1e3) / 1e12
        # Trident's printed FLOPs and the formula both sides are measured by must be one number.
        ours = model_flops(a, shape)
        if abs(r["trident"]["flops_per_iter"] - ours) > 1e-5 * ours:  # printed to 6 digits
            raise RuntimeError(f"Trident printed {r['trident']['flops_per_iter']:.6g} model FLOPs per iteration for "
                               f"{shape}, the formula gives {ours:.6g} ({r['trident']['flops_formula']})")
        r["fraction_of_roofline"] = r["trident"]["tflops"] / r["roofline_tflops"]
        print(f"  Trident {shape}: {r['trident']['ms_per_iter']:.1f} ms/it, {r['trident']['tokens_per_s']:.0f} tok/s, "
              f"{r['trident']['tflops']:.4f} TFLOP/s ({100 * r['fraction_of_roofline']:.1f}% of roofline)")

        if not a.no_torch:
            tj = os.path.join(work, f"torch_{shape}.json")
            cmd = [a.python, os.path.join(REPO, "perf", "torch_gpt.py"), "--layers", str(L), "--hidden", str(C),
                   "--heads", str(H), "--batch", str(a.batch), "--seq", str(a.seq), "--steps", str(a.iters),
                   "--warmup", str(a.warmup), "--threads", str(a.threads), "--dropout", str(a.dropout), "--flops-vocab", str(padded_vocab(VOCAB)),
                   "--json", tj]
            if a.arch == "llama":
                cmd += ["--arch", "llama", "--groups", str(G), "--ffn", str(F)]
            runner.run(cmd, torch_env, f"PyTorch {shape}", os.path.join(work, f"torch_{shape}.log"))
            with open(tj) as f:
                r["torch"] = json.load(f)
            if abs(r["torch"]["flops_per_iter"] - ours) > 1e-6 * ours:
                raise RuntimeError(f"torch_gpt.py counted {r['torch']['flops_per_iter']:.6g} FLOPs for {shape}, "
                                   f"the driver {ours:.6g}")
            print(f"  PyTorch {shape}: {r['torch']['ms_per_iter']:.1f} ms/it, {r['torch']['tokens_per_s']:.0f} tok/s")

        if not a.no_profile:
            kj = os.path.join(work, f"kernels_{shape}.json")
            env = dict(threads_env, KOKKOS_PROFILE_LIBRARY=a.timer_lib, TRIDENT_KERNEL_TIMER_OUT=kj,
                       TRIDENT_KERNEL_TIMER_SKIP=f"optim::adamw_step:{a.warmup}")
            runner.run(trident_cmd(a, shape, os.path.join(work, f"trident_{shape}_profiled.csv")), env,
                       f"Trident {shape} under the kernel timer", os.path.join(work, f"trident_{shape}_profiled.log"))
            with open(kj) as f:
                timer = json.load(f)
            r["breakdown"] = breakdown(timer, a.iters - a.warmup, gtime, gflops)
        results.append(r)

    print("\n" + summary_table(results))
    print("\n" + verdict(results))
    for x in quality_warnings(results, load_start):
        print("WARNING (measurement disturbed): " + x)
    for r in results:
        t = limits_text(r)
        if t:
            print(t)
    for r in results:
        print("\n" + breakdown_text(r))
    # one file per CPU seen (cpu_key) and day; earlier CPUs' results stay beside it
    stem = f"{a.arch}_cpu_{started:%Y-%m-%d}_{facts['cpu_key']}" + (f"_{a.tag}" if a.tag else "")
    md, js = os.path.join(a.out_dir, stem + ".md"), os.path.join(a.out_dir, stem + ".json")
    write_report(a, facts, roof, results, runner, started, md, js)
    print(f"\nwrote {md} and {js}")
    if a.smoke:  # the smoke test checks that every piece ran and the table has its rows
        ok = all("trident" in r and (a.no_torch or "torch" in r) and (a.no_profile or "breakdown" in r)
                 for r in results) and len(results) == len(a.shape_list)
        if not ok:
            sys.exit("bench_gpt --smoke: missing results")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:
        sys.exit(f"bench_gpt: {e}")
