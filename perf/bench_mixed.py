#!/usr/bin/python3
"""Mixed-precision training throughput on the CPU: Trident bf16 next to Trident fp32 and to
PyTorch fp32 and bf16 (torch.autocast on the CPU, which runs oneDNN's bf16 GEMMs), in the same
run, same shapes and threads, with model FLOP/s against the measured bf16 GEMM roofline.

For each shape (default GPT-2 124M = 12 x 768 x 12 heads and GPT-2 345M = 24 x 1024 x 16 heads) at
micro batch = global batch = B (4), sequence T (64), T threads (2):

  1. gemm_roofline --dtype bf16 and fp32: the FLOP-weighted GEMM rate of exactly one step's GEMMs
     (bf16 inputs with fp32 accumulation, and fp32), the rooflines;
  2. Trident: apps/pretrain_gpt with precision.dtype fp32 and bf16, median ms/iter after warm-up;
  3. PyTorch: perf/torch_gpt.py --dtype fp32 and --dtype bf16 (autocast), same model and optimizer.

Prints and writes perf/results/mixed_cpu_<date>_<cpu key>[_<tag>].{md,json}: tokens/s of the four, the ratio
Trident bf16 / PyTorch bf16 (the issue's target: at least 1.5), Trident's bf16 speed-up over its
fp32, and Trident bf16's model TFLOP/s as a fraction of the bf16 roofline. Model FLOPs: Megatron's
72 B s l h^2 (1 + s/6h + V/12hl), V = 50304, on every side.

  /usr/bin/python3 perf/bench_mixed.py --build-dir build            # ~10 minutes on 2 cores
  /usr/bin/python3 perf/bench_mixed.py --build-dir build --smoke    # every piece, tiny shape
"""
import argparse
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
    p.add_argument("--iters", type=int, default=5, help="training steps per run, warm-up included")
    p.add_argument("--warmup", type=int, default=2)
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
    a.shape_list = [s for s in a.shapes.split(",") if s]
    a.bin_dir = os.path.join(a.build_dir, "apps")
    a.roofline_bin = os.path.join(a.build_dir, "perf", "gemm_roofline")
    return a


def roofline(a, runner, work, dtype):
    hidden = sorted({bg.SHAPES[s][1] for s in a.shape_list})
    path = os.path.join(work, f"gemm_roofline_{dtype}.json")
    cmd = [a.roofline_bin, "--dtype", dtype, "--tokens", str(a.batch * a.seq), "--seq", str(a.seq), "--hidden",
           ",".join(map(str, hidden)), "--head-dim", "64", "--vocab", str(bg.padded_vocab(bg.VOCAB)),
           "--square", "0" if a.smoke else "2048", "--min-time", str(a.roofline_min_time), "--json", path]
    print(runner.run(cmd, {"OMP_NUM_THREADS": str(a.threads)}, f"GEMM roofline {dtype}"))
    with open(path) as f:
        return json.load(f)


def main(argv=None):
    a = parse_args(argv)
    started = datetime.datetime.now()
    work = a.work_dir or os.path.join(bg.REPO, "perf", "work")
    os.makedirs(work, exist_ok=True)
    for path in (os.path.join(a.bin_dir, "pretrain_gpt"), a.roofline_bin):
        if not os.path.exists(path):
            sys.exit(f"bench_mixed: {path} is missing; build it: cmake --build {a.build_dir} -j2 "
                     "--target pretrain_gpt gemm_roofline")
    if len({bg.SHAPES[s][1] // bg.SHAPES[s][2] for s in a.shape_list}) != 1:
        sys.exit("bench_mixed: the shapes must share one head size (64)")
    runner = bg.Runner()
    facts = bg.machine_facts()
    facts["OPENBLAS_* in the environment (PyTorch runs with it)"] = " ".join(
        f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("OPENBLAS_")) or "none"
    threads_env = {"OMP_NUM_THREADS": str(a.threads), "OPENBLAS_NUM_THREADS": str(a.threads)}
    roof = {d: roofline(a, runner, work, d) for d in ("bf16", "fp32")}
    results = []
    for shape in a.shape_list:
        L, C, H = bg.SHAPES[shape]
        r = {"shape": shape, "title": bg.SHAPE_TITLES[shape], "layers": L, "hidden": C, "heads": H}
        for d in ("bf16", "fp32"):
            rate, _, _ = bg.roofline_for(roof[d], C, L)
            r[f"roofline_{d}_tflops"] = rate / 1e12
        for d in ("fp32", "bf16"):
            metrics = os.path.join(work, f"mixed_trident_{shape}_{d}.csv")
            cmd = bg.trident_cmd(a, shape, metrics) + ["--precision.dtype", d]
            out = runner.run(cmd, threads_env, f"Trident {shape} {d}", os.path.join(work, f"mixed_trident_{shape}_{d}.log"))
            t = bg.read_trident(metrics, out, a)
            if t["flops_per_iter"] is None:
                t["flops_per_iter"] = bg.megatron_flops(a.batch, a.seq, L, C, bg.padded_vocab(bg.VOCAB))
                t["tflops"] = t["flops_per_iter"] / (t["ms_per_iter"] / 1e3) / 1e12
            r[f"trident_{d}"] = t
            print(f"  Trident {shape} {d}: {t['ms_per_iter']:.1f} ms/it, {t['tokens_per_s']:.0f} tok/s")
            if not a.no_torch:
                tj = os.path.join(work, f"mixed_torch_{shape}_{d}.json")
                cmd = [a.python, os.path.join(bg.REPO, "perf", "torch_gpt.py"), "--layers", str(L), "--hidden", str(C),
                       "--heads", str(H), "--batch", str(a.batch), "--seq", str(a.seq), "--steps", str(a.iters),
                       "--warmup", str(a.warmup), "--threads", str(a.threads), "--dropout", str(a.dropout),
                       "--dtype", d, "--json", tj]
                runner.run(cmd, {}, f"PyTorch {shape} {d}")
                with open(tj) as f:
                    r[f"torch_{d}"] = json.load(f)
                print(f"  PyTorch {shape} {d}: {r[f'torch_{d}']['tokens_per_s']:.1f} tok/s")
        tb = r["trident_bf16"]
        r["bf16_over_fp32"] = tb["tokens_per_s"] / r["trident_fp32"]["tokens_per_s"]
        r["fraction_of_bf16_roofline"] = tb["tflops"] / r["roofline_bf16_tflops"]
        if not a.no_torch:
            r["trident_bf16_over_torch_bf16"] = tb["tokens_per_s"] / r["torch_bf16"]["tokens_per_s"]
        results.append(r)

    lines = [f"# Mixed-precision GPT training on the CPU, {started.date()}", "",
             f"Machine `{os.uname().nodename}` ({facts.get('Model name', '?')}, {facts['cpu_key']}); {a.threads} threads for every run (OMP_NUM_THREADS; torch threads); "
             f"micro batch = global batch = {a.batch}, sequence {a.seq}, dropout {a.dropout}; median ms/iter of steps "
             f"{a.warmup + 1}..{a.iters}. Trident: precision.dtype fp32 / bf16 (16-bit parameters and GEMM inputs, "
             "fp32 masters, gradients, residual stream). PyTorch "
             f"{results[0].get('torch_bf16', {}).get('torch_version', '-')}: fp32, and bf16 = torch.autocast('cpu', "
             "bfloat16) over forward and loss.", "",
             "| shape | Trident fp32 tok/s | Trident bf16 tok/s | PyTorch fp32 tok/s | PyTorch bf16 tok/s | "
             "Trident bf16 / PyTorch bf16 | Trident bf16 / fp32 | Trident bf16 TFLOP/s | bf16 GEMM roofline TFLOP/s | "
             "fraction of roofline |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        tp = lambda k: f"{r[k]['tokens_per_s']:.1f}" if k in r else "-"  # noqa: E731
        ratio = f"{r['trident_bf16_over_torch_bf16']:.2f}x" if "trident_bf16_over_torch_bf16" in r else "-"
        lines.append(f"| {r['title']} | {tp('trident_fp32')} | {tp('trident_bf16')} | {tp('torch_fp32')} | "
                     f"{tp('torch_bf16')} | {ratio} | {r['bf16_over_fp32']:.2f}x | {r['trident_bf16']['tflops']:.3f} | "
                     f"{r['roofline_bf16_tflops']:.3f} | {100 * r['fraction_of_bf16_roofline']:.1f}% |")
    lines += ["", "fp32 GEMM roofline for comparison: " + ", ".join(
        f"{r['title']} {r['roofline_fp32_tflops']:.3f} TFLOP/s" for r in results) + ".", "",
        "Target (issues 5 and 22): Trident bf16 at least 1.5x PyTorch bf16.", ""]
    # where it ran (issue 22: every result file says so): the CPU, its flags, PyTorch's OpenBLAS
    lines += ["## PyTorch", ""]
    for r in results:
        for d in ("fp32", "bf16"):
            p = r.get(f"torch_{d}")
            if p:
                ob = p.get("openblas", {})
                lines.append(f"- {r['title']} {d}: torch {p.get('torch_version', '?')}, {p.get('torch_num_threads', '?')} "
                             f"threads, OpenBLAS core `{ob.get('core', '?')}` ({ob.get('config', '')})")
    lines += ["", "## Machine", ""]
    for k, v in facts.items():
        lines.append(f"- {k}: {v}" if k != "flags" else f"- all CPU flags: `{v}`")
    lines += ["", "Commands:", ""]
    lines += [f"    {c}" for c in runner.commands]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if a.smoke:  # every piece ran: four throughputs per shape
        for r in results:
            for k in ("trident_fp32", "trident_bf16") + (() if a.no_torch else ("torch_fp32", "torch_bf16")):
                assert r[k]["tokens_per_s"] > 0, k
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
