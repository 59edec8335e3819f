#!/usr/bin/python3
"""GPU training benchmark (issue 6): GPT-2 124M, 350M and 1.3B on one GPU in bf16, at the largest
micro-batch that fits, next to PyTorch on the same GPU, shapes and batch in the same run.

For each shape and attention path (--attention: "flash", Trident's fused kernel, which on the GPU
runs on CUDA cores; "unfused", QK^T and PV as cuBLAS strided-batched GEMMs on tensor cores with
the softmax kernel between them and selective recomputation): Trident's CUDA build
(apps/pretrain_gpt from --build-dir, precision.dtype bf16, sequence 1024) is started with
micro-batches from --micro-batches (largest first) until one runs; then PyTorch (perf/torch_gpt.py --device cuda --dtype bf16:
autocast, and scaled_dot_product_attention where that torch has it) at the same micro-batch.
Reports tokens/s, model TFLOP/s (Megatron's 72 B s l h^2 (1 + s/6h + V/12hl), V = 50304) and MFU
against --peak-tflops (default 989: H100/H200 SXM dense bf16), and writes
perf/results/gpu_<date>.{md,json}. Without a GPU it says so and exits 0 (nothing measured).

  /usr/bin/python3 perf/bench_gpu.py --build-dir build-cuda
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpt as bg  # noqa: E402

SHAPES = {"124m": (12, 768, 12), "350m": (24, 1024, 16), "1.3b": (24, 2048, 16)}


def gpu_present():
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT).returncode == 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(bg.REPO, "build-cuda"))
    p.add_argument("--shapes", default="124m,350m,1.3b")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--micro-batches", default="64,32,16,8,4,2,1")
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--peak-name", default="H100/H200 SXM dense bf16")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--out-dir", default=os.path.join(bg.REPO, "perf", "results"))
    p.add_argument("--work-dir", default=os.path.join(bg.REPO, "perf", "work"))
    p.add_argument("--attention", default="flash,unfused", help="Trident attention paths to measure")
    p.add_argument("--no-torch", action="store_true")
    a = p.parse_args(argv)
    if not gpu_present():
        print("bench_gpu: no NVIDIA GPU here (nvidia-smi -L fails): nothing measured")
        return 0
    app = os.path.join(a.build_dir, "apps", "pretrain_gpt")
    if not os.path.exists(app):
        sys.exit(f"bench_gpu: {app} is missing: build the CUDA backend first (README, 'GPU clusters')")
    os.makedirs(a.work_dir, exist_ok=True)
    runner, results, started, torch_runs = bg.Runner(), [], datetime.datetime.now(), {}
    a.iters, a.warmup, a.batch = a.iters, a.warmup, 0  # for bg.read_trident
    for shape, attention in [(s, at) for s in a.shapes.split(",") for at in a.attention.split(",")]:
        L, C, H = SHAPES[shape]
        flash = attention == "flash"
        r = {"shape": shape, "attention": attention, "layers": L, "hidden": C, "heads": H, "seq": a.seq}
        for mb in [int(x) for x in a.micro_batches.split(",")]:
            metrics = os.path.join(a.work_dir, f"gpu_{shape}_{attention}_mb{mb}.csv")
            cmd = [app, "--deck", os.path.join(bg.REPO, "perf", "decks", "gpt_bench.ini"),
                   "--model.num_layers", str(L), "--model.hidden_size", str(C), "--model.num_heads", str(H),
                   "--model.seq_length", str(a.seq), "--model.max_position_embeddings", str(a.seq),
                   "--model.hidden_dropout", str(a.dropout), "--model.attention_dropout", str(a.dropout),
                   "--model.flash_attention", "true" if flash else "false",
                   "--precision.recompute", "none" if flash else "selective", "--precision.dtype", "bf16",
                   "--train.micro_batch_size", str(mb), "--train.global_batch_size", str(mb),
                   "--train.iters", str(a.iters), "--eval.interval", "0", "--log.interval", "1",
                   "--perf.peak_tflops", str(a.peak_tflops), "--log.metrics_file", metrics]
            try:
                out = runner.run(cmd, {}, f"Trident {shape} {attention} attention, micro-batch {mb}")
            except RuntimeError as e:
                print(f"  micro-batch {mb} does not run ({e}); trying a smaller one")
                continue
            a.batch = mb
            t = bg.read_trident(metrics, out, a)
            t["micro_batch"] = mb
            t["tokens_per_s"] = mb * a.seq / (t["ms_per_iter"] / 1e3)
            t["mfu"] = t["tflops"] / a.peak_tflops if t["tflops"] else None
            r["trident"] = t
            break
        if "trident" in r and not a.no_torch:
            mb = r["trident"]["micro_batch"]
            tj = os.path.join(a.work_dir, f"gpu_torch_{shape}_mb{mb}.json")
            cmd = [a.python, os.path.join(bg.REPO, "perf", "torch_gpt.py"), "--device", "cuda", "--dtype", "bf16",
                   "--layers", str(L), "--hidden", str(C), "--heads", str(H), "--batch", str(mb), "--seq", str(a.seq),
                   "--steps", str(a.iters), "--warmup", str(a.warmup), "--dropout", str(a.dropout), "--json", tj]
            try:
                if (shape, mb) not in torch_runs:  # once per shape and micro-batch
                    runner.run(cmd, {}, f"PyTorch {shape}")
                    with open(tj) as f:
                        torch_runs[(shape, mb)] = json.load(f)
                r["torch"] = dict(torch_runs[(shape, mb)])
                r["torch"]["mfu"] = r["torch"]["tflops"] / a.peak_tflops
            except (RuntimeError, OSError) as e:
                r["torch_error"] = str(e)[-300:]
        results.append(r)
    lines = [f"# GPT training on one GPU, {started.date()}", "",
             f"bf16, sequence {a.seq}, largest micro-batch that runs; MFU against {a.peak_tflops} "
             f"TFLOP/s ({a.peak_name}); median of steps {a.warmup + 1}..{a.iters}. PyTorch at the same "
             "micro-batch (autocast bf16, scaled_dot_product_attention).", "",
             "| shape | attention | micro-batch | Trident tok/s | Trident TFLOP/s | Trident MFU | PyTorch tok/s "
             "| PyTorch MFU | Trident / PyTorch |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        t, q = r.get("trident"), r.get("torch")
        head = f"| {r['shape']} | {r['attention']} | "
        if not t:
            lines.append(head + "did not run | - | - | - | - | - | - |")
            continue
        mine = f"{t['micro_batch']} | {t['tokens_per_s']:.0f} | {t['tflops']:.1f} | {100 * t['mfu']:.1f}% | "
        lines.append(head + mine + (f"{q['tokens_per_s']:.0f} | {100 * q['mfu']:.1f}% | "
                                    f"{t['tokens_per_s'] / q['tokens_per_s']:.2f} |" if q else "- | - | - |"))
    lines += ["", "Commands:", ""] + [f"    {c}" for c in runner.commands]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(a.out_dir, exist_ok=True)
    base = os.path.join(a.out_dir, f"gpu_{started.date()}")
    with open(base + ".md", "w") as f:
        f.write(text)
    with open(base + ".json", "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
