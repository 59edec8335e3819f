#!/usr/bin/python3
"""GPU training benchmark: GPT-2 124M, 350M and 1.3B on one GPU in bf16, next to PyTorch on the
same GPU, shapes and micro-batch in the same run.

For each attention path (--attention: "cudnn", cuDNN's fused attention on tensor cores,
model.attention_backend cudnn; "flash", Trident's fused kernel, attention_backend local;
"unfused", QK^T and PV as batched cuBLAS GEMMs on tensor cores with the softmax kernel between
them and selective recomputation), the paths in the order given, and each shape: the micro-batch is chosen from the memory model (perf/perf_model.py:
parameters, gradients and optimizer state at Megatron's bytes per parameter, Korthikanti et al.'s
activations, the logits), the largest power of two up to --max-micro-batch whose predicted memory
stays under --memory-fraction of the GPU's memory; should that run fail anyway, the next smaller
one is tried (at most twice, and the report says so). Trident's CUDA build (apps/pretrain_gpt from
--build-dir, precision.dtype bf16, sequence 1024) runs --iters steps; then PyTorch (perf/
torch_gpt.py --device cuda --dtype bf16: autocast, scaled_dot_product_attention) at the same
micro-batch, in eager mode and, with --peers eager,compile (the default), through torch.compile
where the GPU machine's PyTorch has it (PyTorch 2; --compile-shapes limits it to some shapes).
The shape "llama8b4" is a Llama-3-8B-shaped
stack of 4 layers (hidden 4096, 32 query heads in 8 groups, SwiGLU 14336, RoPE base 500000) at
sequence 4096 and micro-batch --llama-micro-batch (1), on the sample shards' GPT-2 vocabulary
(the only tokenised data on the GPU machine; Llama 3's 128256 would make its LM head 2.5 times
as large), run from perf/decks/llama_bench.ini and torch_gpt.py --arch llama. Reports tokens/s,
model TFLOP/s (Megatron's 72 B s l h^2 (1 + s/6h + V/12hl), V = 50304, and its general form for
the Llama stack), MFU against --peak-tflops (default 989: H100/H200 SXM dense bf16), and the fraction of
the GPU's bf16 GEMM rate measured in the same run through PyTorch (8192^3, the ceiling a training
step can approach). Runs are not started after --deadline (seconds since the epoch); each run is
limited to the time left. Writes <out-dir>/gpu_<date>.{md,json}. Without a GPU it says so and
exits 0 (nothing measured).

  python3 perf/bench_gpu.py --build-dir build-cuda
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpt as bg  # noqa: E402
import perf_model as pm  # noqa: E402

# "smoke" (2 x 128) is not a benchmark: tests/gpu_kit/gpu_check_logic.sh rehearses the script with it
SHAPES = {"124m": (12, 768, 12), "350m": (24, 1024, 16), "1.3b": (24, 2048, 16), "smoke": (2, 128, 4)}
VOCAB = 50304
# Llama-family stacks: layers, hidden, heads, key/value groups, SwiGLU width, sequence, RoPE base
# ("llama-smoke", like "smoke", is for the rehearsal only)
LLAMA_SHAPES = {"llama8b4": (4, 4096, 32, 8, 14336, 4096, 500000.0), "llama-smoke": (2, 128, 4, 2, 352, 64, 10000.0)}
PEERS = ("eager", "compile")


def gpu_facts():
    """(name, memory in bytes) of GPU 0, or None without a GPU."""
    if shutil.which("nvidia-smi") is None:
        return None
    p = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0 or not p.stdout.strip():
        return None
    name, mib = [x.strip() for x in p.stdout.strip().splitlines()[0].split(",")]
    return name, float(mib) * 2**20


def model_gpu(name, memory):
    """The perf model's figures for this GPU, with its measured memory."""
    key = "h200" if "H200" in name else "h100-sxm" if "H100" in name else "a100-80gb" if "A100" in name else "h100-sxm"
    g = dict(pm.GPUS[key])
    g["hbm_gb"] = memory / 1e9
    return key, g


def choose_micro_batch(shape, flash, seq, gpu, fraction, largest):
    """Largest power-of-two micro-batch whose predicted memory fits; with the prediction."""
    L, C, H = SHAPES[shape]
    M = pm.Model(L, C, H, seq, VOCAB)
    best, mb = None, 1
    while mb <= largest:
        lay = pm.Layout(micro=mb, global_batch=mb, dtype="bf16", distributed=False, flash=flash,
                        recompute="none" if flash else "selective")
        r = pm.predict(M, lay, gpu)
        if r["memory"] <= fraction * gpu["hbm_gb"] * 1e9:
            best = (mb, r["memory"])
        mb *= 2
    return best or (1, None)


def gemm_ceiling(python, timeout):
    """The GPU's bf16 GEMM rate through PyTorch (TFLOP/s), 8192^3, mean of 10 after 3 warm-ups."""
    code = ("import torch,time\n"
            "a=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16);b=torch.randn_like(a)\n"
            "for _ in range(3): a@b\n"
            "torch.cuda.synchronize();t=time.perf_counter()\n"
            "for _ in range(10): a@b\n"
            "torch.cuda.synchronize();print(2*8192**3*10/(time.perf_counter()-t)/1e12)\n")
    try:
        p = subprocess.run([python, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
        return float(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(bg.REPO, "build-cuda"))
    p.add_argument("--shapes", default="124m,350m,1.3b")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--micro-batches", default="auto",
                   help="'auto' (the memory model) or a list to try, largest first (e.g. 16,8,4)")
    p.add_argument("--max-micro-batch", type=int, default=64)
    p.add_argument("--memory-fraction", type=float, default=0.8)
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--peak-name", default="H100/H200 SXM dense bf16")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--out-dir", default=os.path.join(bg.REPO, "perf", "results"))
    p.add_argument("--work-dir", default=os.path.join(bg.REPO, "perf", "work"))
    p.add_argument("--attention", default="cudnn,unfused", help="Trident attention paths to measure: cudnn, flash, unfused")
    p.add_argument("--deadline", type=float, default=0.0, help="start no run after this time (epoch s)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--peers", default="eager,compile",
                   help="PyTorch peers: eager, and compile (torch.compile, where PyTorch 2 is there)")
    p.add_argument("--compile-shapes", default="all",
                   help="the shapes the torch.compile peer runs ('all', or a list: compiling costs about a minute)")
    p.add_argument("--llama-micro-batch", type=int, default=1, help="micro-batch of the Llama stacks")
    a = p.parse_args(argv)
    for peer in a.peers.split(","):
        if peer not in PEERS:
            p.error(f"--peers: unknown peer {peer!r} (eager, compile)")
    for shape in a.shapes.split(","):
        if shape not in SHAPES and shape not in LLAMA_SHAPES:
            p.error(f"--shapes: unknown shape {shape!r} ({', '.join(list(SHAPES) + list(LLAMA_SHAPES))})")
    facts = gpu_facts()
    if facts is None:
        print("bench_gpu: no NVIDIA GPU here (nvidia-smi fails): nothing measured")
        return 0
    gpu_name, gpu_mem = facts
    gpu_key, gpu = model_gpu(gpu_name, gpu_mem)
    app = os.path.join(a.build_dir, "apps", "pretrain_gpt")
    if not os.path.exists(app):
        sys.exit(f"bench_gpu: {app} is missing: build the CUDA backend first (README, 'GPU clusters')")
    os.makedirs(a.work_dir, exist_ok=True)
    deadline = a.deadline or float("inf")

    def time_left(what):
        left = deadline - time.time()
        if left < 15:
            print(f"  {what}: not started, the time budget is spent")
            return None
        return left

    runner, results, started, torch_runs = bg.Runner(), [], datetime.datetime.now(), {}
    ceiling = None
    if not a.no_torch and time_left("GEMM ceiling"):
        ceiling = gemm_ceiling(a.python, min(60, deadline - time.time()))
        print(f"bf16 GEMM 8192^3 through PyTorch: {ceiling and f'{ceiling:.0f} TFLOP/s'}")
    for shape, attention in [(s, at) for at in a.attention.split(",") for s in a.shapes.split(",")]:
        flash = attention in ("flash", "cudnn")
        llama = shape in LLAMA_SHAPES
        if llama:
            L, C, H, G, Fw, seq, theta = LLAMA_SHAPES[shape]
        else:
            (L, C, H), G, Fw, seq, theta = SHAPES[shape], 0, 0, a.seq, 0.0
        r = {"shape": shape, "attention": attention, "layers": L, "hidden": C, "heads": H, "seq": seq}
        if llama:
            r.update({"arch": "llama", "groups": G, "ffn": Fw, "rotary_base": theta})
            tries = [a.llama_micro_batch]
        elif a.micro_batches == "auto":
            mb0, mem = choose_micro_batch(shape, flash, seq, gpu, a.memory_fraction, a.max_micro_batch)
            r["model_micro_batch"], r["model_memory_gib"] = mb0, mem / 2**30 if mem else None
            tries = [m for m in (mb0, mb0 // 2, mb0 // 4) if m >= 1]
        else:
            tries = [int(x) for x in a.micro_batches.split(",")]
        for mb in tries:
            left = time_left(f"Trident {shape} {attention} mb {mb}")
            if left is None:
                r["skipped"] = "time budget"
                break
            metrics = bg.fresh_metrics(os.path.join(a.work_dir, f"gpu_{shape}_{attention}_mb{mb}.csv"))
            if llama:
                shape_args = ["--deck", os.path.join(bg.REPO, "perf", "decks", "llama_bench.ini"),
                              "--model.num_query_groups", str(G), "--model.ffn_hidden_size", str(Fw),
                              "--model.rotary_base", str(theta)]
            else:
                shape_args = ["--deck", os.path.join(bg.REPO, "perf", "decks", "gpt_bench.ini")]
            cmd = [app] + shape_args + [
                "--model.num_layers", str(L), "--model.hidden_size", str(C), "--model.num_heads", str(H),
                "--model.seq_length", str(seq), "--model.max_position_embeddings", str(seq),
                "--model.hidden_dropout", str(a.dropout), "--model.attention_dropout", str(a.dropout),
                "--model.flash_attention", "true" if flash else "false",
                "--model.attention_backend", "cudnn" if attention == "cudnn" else "local" if flash else "auto",
                "--precision.recompute", "none" if flash else "selective", "--precision.dtype", "bf16",
                "--train.micro_batch_size", str(mb), "--train.global_batch_size", str(mb),
                "--train.iters", str(a.iters), "--eval.interval", "0", "--log.interval", "1",
                "--perf.peak_tflops", str(a.peak_tflops), "--log.metrics_file", metrics]
            try:
                out = runner.run(cmd, {}, f"Trident {shape} {attention} attention, micro-batch {mb}", timeout=left)
            except RuntimeError as e:
                print(f"  micro-batch {mb} does not run ({e})")
                r.setdefault("failed_micro_batches", []).append(mb)
                continue
            t = bg.read_trident(metrics, out, argparse.Namespace(iters=a.iters, warmup=a.warmup, batch=mb, seq=seq))
            t["micro_batch"] = mb
            t["tokens_per_s"] = mb * seq / (t["ms_per_iter"] / 1e3)
            t["mfu"] = t["tflops"] / a.peak_tflops if t["tflops"] else None
            r["trident"] = t
            break
        if "trident" in r and not a.no_torch:
            mb = r["trident"]["micro_batch"]
            for peer in a.peers.split(","):
                if peer == "compile" and a.compile_shapes != "all" and shape not in a.compile_shapes.split(","):
                    continue
                tj = os.path.join(a.work_dir, f"gpu_torch_{peer}_{shape}_mb{mb}.json")
                cmd = [a.python, os.path.join(bg.REPO, "perf", "torch_gpt.py"), "--device", "cuda", "--dtype", "bf16",
                       "--layers", str(L), "--hidden", str(C), "--heads", str(H), "--batch", str(mb), "--seq",
                       str(seq), "--steps", str(a.iters), "--warmup", str(a.warmup), "--dropout", str(a.dropout),
                       "--json", tj]
                if llama:
                    cmd += ["--arch", "llama", "--groups", str(G), "--ffn", str(Fw), "--rotary-base", str(theta)]
                if peer == "compile":
                    cmd.append("--compile")
                try:
                    if (peer, shape, mb) not in torch_runs:  # once per peer, shape and micro-batch
                        left = time_left(f"PyTorch {peer} {shape}")
                        if left is None:
                            raise RuntimeError("not run: time budget")
                        runner.run(cmd, {}, f"PyTorch {peer} {shape}", timeout=left)
                        with open(tj) as f:
                            torch_runs[(peer, shape, mb)] = json.load(f)
                    q = dict(torch_runs[(peer, shape, mb)])
                    q["mfu"] = q["tflops"] / a.peak_tflops
                    r["torch" if peer == "eager" else "torch_compile"] = q
                except (RuntimeError, OSError) as e:
                    r[("torch" if peer == "eager" else "torch_compile") + "_error"] = str(e)[-300:]
        results.append(r)
    lines = [f"# GPT and Llama training on one GPU, {started.date()}", "",
             f"{gpu_name} ({gpu_mem / 2**30:.0f} GiB); bf16; GPT shapes at sequence {a.seq}, the Llama stacks at their "
             f"own; MFU against {a.peak_tflops} TFLOP/s "
             f"({a.peak_name}); bf16 GEMM 8192^3 through PyTorch in this run: "
             f"{f'{ceiling:.0f} TFLOP/s' if ceiling else 'not measured'}. Median of steps {a.warmup + 1}..{a.iters}. "
             f"Micro-batch: {'the largest predicted by perf_model.py (' + gpu_key + ') to fit in ' + str(a.memory_fraction) + ' of the memory' if a.micro_batches == 'auto' else a.micro_batches}"
             f" (Llama stacks: {a.llama_micro_batch}). "
             "PyTorch at the same micro-batch (autocast bf16, scaled_dot_product_attention), eager and through "
             "torch.compile.", "",
             "| shape | attention | micro-batch (model: predicted GiB) | Trident tok/s | Trident TFLOP/s | Trident MFU "
             "| of GEMM ceiling | PyTorch eager tok/s | eager MFU | Trident / eager | compile tok/s | Trident / compile |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        t, q, qc = r.get("trident"), r.get("torch"), r.get("torch_compile")
        head = f"| {r['shape']} | {r['attention']} | "
        model = (f" ({r['model_micro_batch']}: {r['model_memory_gib']:.1f})" if r.get("model_memory_gib") else "")
        if not t:
            why = r.get("skipped") or f"failed at {r.get('failed_micro_batches')}"
            lines.append(head + f"{why}{model} | - | - | - | - | - | - | - | - | - |")
            continue
        ceil = f"{100 * t['tflops'] / ceiling:.1f}%" if ceiling and t["tflops"] else "-"
        mine = f"{t['micro_batch']}{model} | {t['tokens_per_s']:.0f} | {t['tflops']:.1f} | {100 * t['mfu']:.1f}% | {ceil} | "
        eager = (f"{q['tokens_per_s']:.0f} | {100 * q['mfu']:.1f}% | {t['tokens_per_s'] / q['tokens_per_s']:.2f} | "
                 if q else f"{r.get('torch_error', '-')[:60]} | - | - | ")
        comp = (f"{qc['tokens_per_s']:.0f} | {t['tokens_per_s'] / qc['tokens_per_s']:.2f} |"
                if qc else f"{r.get('torch_compile_error', '-')[:60]} | - |")
        lines.append(head + mine + eager + comp)
    lines += ["", "Commands:", ""] + [f"    {c}" for c in runner.commands]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(a.out_dir, exist_ok=True)
    base = os.path.join(a.out_dir, f"gpu_{started.date()}")
    with open(base + ".md", "w") as f:
        f.write(text)
    with open(base + ".json", "w") as f:
        json.dump({"gpu": gpu_name, "memory_bytes": gpu_mem, "gemm_ceiling_tflops": ceiling, "results": results},
                  f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
