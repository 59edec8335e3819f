#!/usr/bin/python3
"""Mixed-precision training throughput on the CPU: Trident bf16 next to Trident fp32 and to
PyTorch fp32 and bf16 (torch.autocast on the CPU, which runs oneDNN's bf16 GEMMs), in the same
run, same shapes and threads, with model FLOP/s against the measured bf16 GEMM roofline, and
where each precision's step goes.

For each shape (default GPT-2 124M = 12 x 768 x 12 heads and GPT-2 345M = 24 x 1024 x 16 heads),
micro batch B (4), sequence T (64), T threads (2), and each step size in --accum (micro-batches per
step, their gradients accumulated before one optimizer step; default 1 and 32: 256 and 8192
tokens per step):

  1. gemm_roofline --dtype bf16 and fp32: the FLOP-weighted GEMM rate of exactly one micro-batch's
     GEMMs (bf16 inputs with fp32 accumulation, and fp32), the rooflines; and the memory
     bandwidth the host kernels see (--stream-mib: the better of STREAM's triad and an in-place
     update a = a + s b, AdamW's access pattern);
  2. Trident: apps/pretrain_gpt with precision.dtype fp32 and bf16, global batch = accum x B,
     median ms/iter after warm-up;
  3. PyTorch: perf/torch_gpt.py --dtype fp32 and --dtype bf16 (autocast), same model and optimizer,
     accumulating the same micro-batches (--accum);
  4. the per-op breakdown of Trident's step in both precisions (a second run under the kernel
     timer, as perf/bench_gpt.py): the GEMM region against the same GEMMs alone, each kernel
     family (the fp32 <-> 16-bit casts among them), AdamW with the bytes it moves, host code;
     and the step's floor: its GEMMs at the roofline plus AdamW and the gradient norm at the
     measured memory bandwidth; and each GEMM shape of the step (TRIDENT_GEMM_REGION_SHAPES=1
     names it in the region) against the same shape alone, with the time per step it loses.

Prints and writes perf/results/mixed_cpu_<date>_<cpu key>[_<tag>].{md,json}: tokens/s of the four, the ratio
Trident bf16 / PyTorch bf16 (issue 44's target at >= 8k tokens: at least 3), Trident's bf16 speed-up over its
fp32, Trident bf16's model TFLOP/s as a fraction of the bf16 roofline (target >= 70% at >= 8k
tokens) and the step against its floor (target >= 80% at 256 tokens). Model FLOPs: Megatron's
72 B s l h^2 (1 + s/6h + V/12hl), V = 50304, on every side.

  /usr/bin/python3 perf/bench_mixed.py --build-dir build --shapes 124m   # ~25 minutes on 2 cores
  /usr/bin/python3 perf/bench_mixed.py --build-dir build --smoke         # every piece, tiny shape
"""
import argparse
import copy
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpt as bg  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="124m,345m", help="comma list of: " + ", ".join(bg.SHAPES))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--iters", type=int, default=5, help="training steps per run, warm-up included (accum 1)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--accum", default="1,32",
                   help="comma list: micro-batches per step (B x T tokens each), gradients accumulated")
    p.add_argument("--accum-iters", type=int, default=3, help="training steps per run where accum > 1")
    p.add_argument("--accum-warmup", type=int, default=1)
    p.add_argument("--stream-mib", type=int, default=512, help="memory bandwidth: the arrays' size (MiB each)")
    p.add_argument("--timer-lib", default="", help="kernel timer (default: <build-dir>/perf/libtrident_kernel_timer.so)")
    p.add_argument("--no-profile", action="store_true", help="no per-op breakdown (the kernel-timer runs)")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--roofline-min-time", type=float, default=0.25)
    p.add_argument("--build-dir", default=os.path.join(bg.REPO, "build-perf"))
    p.add_argument("--deck", default=os.path.join(bg.REPO, "perf", "decks", "gpt_bench.ini"))
    p.add_argument("--shards", default="")
    p.add_argument("--python", default="/usr/bin/python3")
    p.add_argument("--out-dir", default=os.path.join(bg.REPO, "perf", "results"))
    p.add_argument("--tag", default="", help="suffix of the result files: mixed_cpu_<date>_<cpu key>[_<tag>]")
    p.add_argument("--work-dir", default="")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny shape, 2 steps, results into --work-dir only")
    a = p.parse_args(argv)
    if a.smoke:
        a.shapes, a.iters, a.warmup, a.roofline_min_time = "smoke", 2, 1, 0.01
        a.accum, a.accum_iters, a.accum_warmup, a.stream_mib = "1,2", 2, 1, 16
    a.shape_list = [s for s in a.shapes.split(",") if s]
    a.accum_list = [int(x) for x in a.accum.split(",") if x]
    a.timer_lib = a.timer_lib or os.path.join(a.build_dir, "perf", "libtrident_kernel_timer.so")
    a.bin_dir = os.path.join(a.build_dir, "apps")
    a.roofline_bin = os.path.join(a.build_dir, "perf", "gemm_roofline")
    return a


def roofline(a, runner, work, dtype):
    hidden = sorted({bg.SHAPES[s][1] for s in a.shape_list})
    path = os.path.join(work, f"gemm_roofline_{dtype}.json")
    cmd = [a.roofline_bin, "--dtype", dtype, "--tokens", str(a.batch * a.seq), "--seq", str(a.seq), "--hidden",
           ",".join(map(str, hidden)), "--head-dim", "64", "--vocab", str(bg.padded_vocab(bg.VOCAB)),
           "--square", "0" if a.smoke else "2048", "--min-time", str(a.roofline_min_time), "--json", path]
    if dtype == "fp32" and a.stream_mib > 0:
        cmd += ["--stream-mib", str(a.stream_mib)]
    print(runner.run(cmd, {"OMP_NUM_THREADS": str(a.threads)}, f"GEMM roofline {dtype}"))
    with open(path) as f:
        return json.load(f)


def step_config(a, accum):
    """the arguments of one step size: accum micro-batches of B x T tokens per step"""
    c = copy.copy(a)
    c.accum = accum
    if accum > 1:
        c.iters, c.warmup = a.accum_iters, a.accum_warmup
    return c


def adamw_bytes(dtype):
    """bytes AdamW moves per parameter in training: reads the gradient, both moments and the fp32
    value (the master with 16-bit parameters), writes the moments, the value and the gradient
    (zeroed in the same sweep, GradsAfter::zero), and with 16-bit parameters the 16-bit copy"""
    return 32 + (2 if dtype == "bf16" else 0)


def floor_of(r, d, gemm_s, bw):
    """the step's floor (seconds): its GEMMs at the roofline, plus AdamW and the gradient norm
    (4 bytes per parameter read) at the measured memory bandwidth"""
    n = r[f"trident_{d}"].get("parameters") or 0
    return gemm_s + (adamw_bytes(d) + 4) * n / (bw * 1e9) if bw else None


def main(argv=None):
    a = parse_args(argv)
    started = datetime.datetime.now()
    work = a.work_dir or os.path.join(bg.REPO, "perf", "work")
    os.makedirs(work, exist_ok=True)
    for path in (os.path.join(a.bin_dir, "pretrain_gpt"), a.roofline_bin) + (() if a.no_profile else (a.timer_lib,)):
        if not os.path.exists(path):
            sys.exit(f"bench_mixed: {path} is missing; build it: cmake --build {a.build_dir} -j2 "
                     "--target pretrain_gpt gemm_roofline trident_kernel_timer")
    if len({bg.SHAPES[s][1] // bg.SHAPES[s][2] for s in a.shape_list}) != 1:
        sys.exit("bench_mixed: the shapes must share one head size (64)")
    runner = bg.Runner()
    facts = bg.machine_facts()
    facts["OPENBLAS_* in the environment (PyTorch runs with it)"] = " ".join(
        f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("OPENBLAS_")) or "none"
    threads_env = {"OMP_NUM_THREADS": str(a.threads), "OPENBLAS_NUM_THREADS": str(a.threads)}
    roof = {d: roofline(a, runner, work, d) for d in ("bf16", "fp32")}
    bw = roof["fp32"].get("stream", {}).get("gb_per_s")
    results = []
    for shape in a.shape_list:
        L, C, H = bg.SHAPES[shape]
        for accum in a.accum_list:
            c = step_config(a, accum)
            tokens = accum * a.batch * a.seq
            tag = f"{shape}_x{accum}"
            r = {"shape": shape, "title": bg.SHAPE_TITLES[shape], "layers": L, "hidden": C, "heads": H,
                 "accum": accum, "tokens_per_step": tokens, "iters": c.iters, "warmup": c.warmup}
            gemm = {}
            for d in ("bf16", "fp32"):
                rate, gflops, gtime = bg.roofline_for(roof[d], C, L)
                r[f"roofline_{d}_tflops"] = rate / 1e12
                gemm[d] = (accum * gflops, accum * gtime)  # the step's GEMMs: FLOPs, seconds at the roofline
            for d in ("fp32", "bf16"):
                metrics = os.path.join(work, f"mixed_trident_{tag}_{d}.csv")
                cmd = bg.trident_cmd(c, shape, metrics) + ["--precision.dtype", d]
                out = runner.run(cmd, threads_env, f"Trident {shape} {d} x{accum}",
                                 os.path.join(work, f"mixed_trident_{tag}_{d}.log"))
                t = bg.read_trident(metrics, out, c)
                if t["flops_per_iter"] is None:
                    t["flops_per_iter"] = accum * bg.megatron_flops(a.batch, a.seq, L, C, bg.padded_vocab(bg.VOCAB))
                    t["tflops"] = t["flops_per_iter"] / (t["ms_per_iter"] / 1e3) / 1e12
                r[f"trident_{d}"] = t
                print(f"  Trident {shape} {d} x{accum}: {t['ms_per_iter']:.1f} ms/it, {t['tokens_per_s']:.0f} tok/s")
                if not a.no_torch:
                    tj = os.path.join(work, f"mixed_torch_{tag}_{d}.json")
                    cmd = [a.python, os.path.join(bg.REPO, "perf", "torch_gpt.py"), "--layers", str(L), "--hidden",
                           str(C), "--heads", str(H), "--batch", str(a.batch), "--seq", str(a.seq), "--accum",
                           str(accum), "--steps", str(c.iters), "--warmup", str(c.warmup), "--threads",
                           str(a.threads), "--dropout", str(a.dropout), "--dtype", d, "--json", tj]
                    runner.run(cmd, {}, f"PyTorch {shape} {d} x{accum}")
                    with open(tj) as f:
                        r[f"torch_{d}"] = json.load(f)
                    print(f"  PyTorch {shape} {d} x{accum}: {r[f'torch_{d}']['tokens_per_s']:.1f} tok/s")
                if not a.no_profile:
                    kj = os.path.join(work, f"mixed_kernels_{tag}_{d}.json")
                    env = dict(threads_env, KOKKOS_PROFILE_LIBRARY=a.timer_lib, TRIDENT_KERNEL_TIMER_OUT=kj,
                               TRIDENT_KERNEL_TIMER_SKIP=f"optim::adamw_step:{c.warmup}",
                               TRIDENT_GEMM_REGION_SHAPES="1")  # each GEMM's region names its shape
                    runner.run(bg.trident_cmd(c, shape, os.path.join(work, f"mixed_trident_{tag}_{d}_profiled.csv"))
                               + ["--precision.dtype", d], env, f"Trident {shape} {d} x{accum} under the kernel timer",
                               os.path.join(work, f"mixed_trident_{tag}_{d}_profiled.log"))
                    with open(kj) as f:
                        timer = json.load(f)
                    b = bg.breakdown(timer, c.iters - c.warmup, gemm[d][1], gemm[d][0])
                    b["gemm_shapes"] = bg.gemm_shapes(timer, c.iters - c.warmup,
                                                      next(m for m in roof[d]["models"] if m["hidden"] == C))
                    fam = {x["family"]: x for x in b["families"]}
                    n = t.get("parameters") or 0
                    ad = fam.get("AdamW step")
                    if ad and ad["ms_per_iter"] > 0 and n:
                        b["adamw_gb_per_s"] = adamw_bytes(d) * n / (ad["ms_per_iter"] / 1e3) / 1e9
                    r[f"breakdown_{d}"] = b
                fl = floor_of(r, d, gemm[d][1], bw)
                if fl:
                    r[f"floor_{d}_ms"] = 1e3 * fl
                    r[f"floor_fraction_{d}"] = fl / (t["ms_per_iter"] / 1e3)
            tb = r["trident_bf16"]
            r["bf16_over_fp32"] = tb["tokens_per_s"] / r["trident_fp32"]["tokens_per_s"]
            r["fraction_of_bf16_roofline"] = tb["tflops"] / r["roofline_bf16_tflops"]
            r["fraction_of_fp32_roofline"] = r["trident_fp32"]["tflops"] / r["roofline_fp32_tflops"]
            if not a.no_torch:
                r["trident_bf16_over_torch_bf16"] = tb["tokens_per_s"] / r["torch_bf16"]["tokens_per_s"]
                r["trident_fp32_over_torch_fp32"] = r["trident_fp32"]["tokens_per_s"] / r["torch_fp32"]["tokens_per_s"]
            results.append(r)

    lines = [f"# Mixed-precision GPT training on the CPU, {started.date()}", "",
             f"Machine `{os.uname().nodename}` ({facts.get('Model name', '?')}, {facts['cpu_key']}); {a.threads} threads for every run (OMP_NUM_THREADS; torch threads); "
             f"micro batch {a.batch}, sequence {a.seq}, dropout {a.dropout}; a step of accum micro-batches (their "
             f"gradients accumulated, one optimizer step; PyTorch accumulates the same way); median ms/iter after "
             f"{a.warmup} warm-up steps ({a.accum_warmup} where accum > 1). Trident: precision.dtype fp32 / bf16 (16-bit "
             "parameters and GEMM inputs, fp32 masters, gradients, residual stream). PyTorch "
             f"{results[0].get('torch_bf16', {}).get('torch_version', '-')}: fp32, and bf16 = torch.autocast('cpu', "
             "bfloat16) over forward and loss.", "",
             "| shape | tokens/step | Trident fp32 tok/s | Trident bf16 tok/s | PyTorch fp32 tok/s | PyTorch bf16 tok/s | "
             "Trident bf16 / PyTorch bf16 | Trident fp32 / PyTorch fp32 | Trident bf16 / fp32 | Trident bf16 TFLOP/s | "
             "bf16 GEMM roofline TFLOP/s | bf16 fraction of roofline | fp32 fraction of roofline | bf16 step / floor | "
             "fp32 step / floor |",
             "|" + "---|" * 15]
    for r in results:
        tp = lambda k: f"{r[k]['tokens_per_s']:.1f}" if k in r else "-"  # noqa: E731
        ratio = lambda k: f"{r[k]:.2f}x" if k in r else "-"  # noqa: E731
        pct = lambda k: f"{100 * r[k]:.1f}%" if k in r else "-"  # noqa: E731
        lines.append(f"| {r['title']} | {r['tokens_per_step']} | {tp('trident_fp32')} | {tp('trident_bf16')} | "
                     f"{tp('torch_fp32')} | {tp('torch_bf16')} | {ratio('trident_bf16_over_torch_bf16')} | "
                     f"{ratio('trident_fp32_over_torch_fp32')} | {r['bf16_over_fp32']:.2f}x | "
                     f"{r['trident_bf16']['tflops']:.3f} | {r['roofline_bf16_tflops']:.3f} | "
                     f"{pct('fraction_of_bf16_roofline')} | {pct('fraction_of_fp32_roofline')} | "
                     f"{pct('floor_fraction_bf16')} | {pct('floor_fraction_fp32')} |")
    lines += ["", "fp32 GEMM roofline for comparison: " + ", ".join(
        f"{r['title']} {r['roofline_fp32_tflops']:.3f} TFLOP/s" for r in results if r["accum"] == a.accum_list[0])
        + ". Memory bandwidth (the host kernels' threads): "
        + (f"{bw:.1f} GB/s (triad {roof['fp32']['stream']['triad_gb_per_s']:.1f}, in-place update "
           f"{roof['fp32']['stream']['update_gb_per_s']:.1f})." if bw else "not measured."), "",
        "Floor: the step's GEMMs at the roofline of their precision plus AdamW "
        f"({adamw_bytes('bf16')} bytes per parameter in bf16, {adamw_bytes('fp32')} in fp32) and the gradient norm "
        "(4) at the measured bandwidth; `step / floor` is the floor over the measured step (1 = at the floor).", "",
        "Targets (issue 44): at >= 8k tokens per step, Trident bf16 >= 70% of the bf16 GEMM roofline and >= 3x "
        "PyTorch autocast; at 256 tokens, >= 80% of the floor; fp32 >= 3x PyTorch and >= 75% of its roofline.", ""]
    for r in results:
        for d in ("bf16", "fp32"):
            b = r.get(f"breakdown_{d}")
            if not b:
                continue
            lines += [f"## Where the step goes: {r['title']}, {d}, {r['tokens_per_step']} tokens per step", "",
                      f"{b['step_ms']:.1f} ms per step under the kernel timer (unprofiled median "
                      f"{r[f'trident_{d}']['ms_per_iter']:.1f} ms); floor {r.get(f'floor_{d}_ms', float('nan')):.1f} ms.", "",
                      "| op family | ms/step | % of step | calls/step |", "|---|---|---|---|"]
            for f in b["families"]:
                lines.append(f"| {f['family']} | {f['ms_per_iter']:.2f} | {f['percent']:.1f}% | {f['calls_per_iter'] or ''} |")
            lines += ["", f"GEMMs: {b['gemm_ms_per_iter']:.1f} ms/step in training = "
                      f"{bg.fmt(b['gemm_gflops_in_training'], '.0f')} GFLOP/s, against {b['gemm_ms_isolated']:.1f} ms "
                      f"({r[f'roofline_{d}_tflops'] * 1e3:.0f} GFLOP/s) for the same GEMMs alone; everything else "
                      f"{b['non_gemm_ms_per_iter']:.1f} ms/step."
                      + (f" AdamW moves {adamw_bytes(d) * (r[f'trident_{d}'].get('parameters') or 0) / 1e9:.2f} GB at "
                         f"{b['adamw_gb_per_s']:.1f} GB/s." if "adamw_gb_per_s" in b else ""), "",
                      "| kernel | type | ms/step | % of step | calls/step |", "|---|---|---|---|---|"]
            for k in b["top_kernels"]:
                lines.append(f"| {k['kernel']} | {k['type']} | {k['ms_per_iter']:.2f} | {k['percent']:.1f}% | "
                             f"{k['calls_per_iter']} |")
            if b.get("gemm_shapes"):
                lines += ["", "Each GEMM of the step in training against the same GEMM alone (gemm_roofline: "
                          "operands hot in cache, median call); `ms/step lost` = calls x (time per call in "
                          "training - alone), largest first:", ""]
                lines += bg.gemm_shapes_text(b["gemm_shapes"])
            lines.append("")
    # where it ran (issue 22: every result file says so): the CPU, its flags, PyTorch's OpenBLAS
    lines += ["## PyTorch", ""]
    for r in results:
        for d in ("fp32", "bf16"):
            p = r.get(f"torch_{d}")
            if p:
                ob = p.get("openblas", {})
                lines.append(f"- {r['title']} {d} x{r['accum']}: torch {p.get('torch_version', '?')}, "
                             f"{p.get('torch_num_threads', '?')} threads, OpenBLAS core `{ob.get('core', '?')}` "
                             f"({ob.get('config', '')})")
    lines += ["", "## Machine", ""]
    for k, v in facts.items():
        lines.append(f"- {k}: {v}" if k != "flags" else f"- all CPU flags: `{v}`")
    lines += ["", "Commands:", ""]
    lines += [f"    {c}" for c in runner.commands]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if a.smoke:  # every piece ran: four throughputs and two breakdowns per shape and step size
        for r in results:
            for k in ("trident_fp32", "trident_bf16") + (() if a.no_torch else ("torch_fp32", "torch_bf16")):
                assert r[k]["tokens_per_s"] > 0, k
            for d in () if a.no_profile else ("bf16", "fp32"):
                b = r[f"breakdown_{d}"]
                assert b["gemm_ms_per_iter"] > 0 and any(f["family"] == "AdamW step" for f in b["families"]), d
                # every GEMM region carried its shape, and each shape is one the roofline timed
                shaped = sum(g["ms_per_iter"] for g in b["gemm_shapes"])
                assert abs(shaped - b["gemm_ms_per_iter"]) <= 1e-6 * b["gemm_ms_per_iter"] + 1e-9, (d, shaped)
                assert all(g["gflops_alone"] for g in b["gemm_shapes"]), (d, b["gemm_shapes"])
        assert len(results) == len(a.shape_list) * len(a.accum_list)
        assert bw and bw > 0, "no memory bandwidth"
        print("bench_mixed smoke: every piece ran")
    else:
        os.makedirs(a.out_dir, exist_ok=True)
        base = os.path.join(a.out_dir, f"mixed_cpu_{started.date()}_{facts['cpu_key']}"  # one file per CPU seen
                            + (f"_{a.tag}" if a.tag else ""))
        with open(base + ".md", "w") as f:
            f.write(text)
        with open(base + ".json", "w") as f:
            json.dump({"args": {k: v for k, v in vars(a).items()}, "results": results}, f, indent=1)
        print(f"wrote {base}.md and .json")


if __name__ == "__main__":
    main()
