#!/usr/bin/env python3
"""Trains the same decks with two builds of pretrain_gpt, the host build and a build with
TRIDENT_DEVICE_KERNELS_ON_HOST (the kernels' device layouts on the host back-end), and compares
the loss and gradient norm of every iteration (tests/device_on_host/device_on_host.sh).

The two builds run the same arithmetic in other orders of addition (a row's sums, the column sums
of bias and norm-weight gradients, the attention kernels' loops), so their results agree to
rounding: measured over 8 iterations, fp32 within 1e-7 relative (loss and gradient norm), bf16 within
1.4e-5 (loss) and 3e-4 (gradient norm), the device path's 16-bit logits included; the tolerances are
about seven times that. Each case prints its largest differences and fails above its tolerance.

  compare_training.py --root ROOT --host-app HOST/pretrain_gpt --device-app DEV/pretrain_gpt --work DIR
"""
import argparse
import csv
import os
import shutil
import subprocess
import sys

# name, deck, extra deck settings, relative tolerance of the loss, of the gradient norm
CASES = [
    ("gpt_fp32_fused", "inputs/gpt_tiny_ci.ini", ["--model.flash_attention", "true"], 1e-6, 2e-6),
    ("gpt_fp32_unfused", "inputs/gpt_tiny_ci.ini", [], 1e-6, 2e-6),
    ("gpt_bf16_fused", "inputs/gpt_tiny_ci.ini", ["--model.flash_attention", "true", "--precision.dtype", "bf16"],
     1e-4, 2e-3),
    ("gpt_bf16_unfused", "inputs/gpt_tiny_ci.ini", ["--precision.dtype", "bf16"], 1e-4, 2e-3),
    # the bf16 fused cases above take the cudnn entry (its host stand-in); this one Trident's kernel
    ("gpt_bf16_fused_local", "inputs/gpt_tiny_ci.ini", ["--model.flash_attention", "true", "--precision.dtype", "bf16",
                                                        "--model.attention_backend", "local"], 1e-4, 2e-3),
    ("llama_bf16_fused", "inputs/llama_tiny_ci.ini", ["--model.flash_attention", "true", "--precision.dtype", "bf16"],
     1e-4, 2e-3),
    ("llama_fp32_unfused", "inputs/llama_tiny_ci.ini", [], 1e-6, 2e-6),
    ("moe_bf16_fused", "inputs/moe_tiny_ci.ini", ["--model.flash_attention", "true", "--precision.dtype", "bf16"],
     1e-4, 2e-3),
    # two ranks, tensor-parallel: the vocabulary-parallel 16-bit classifier and the sequence-parallel kernels
    ("gpt_bf16_tp2_sp", "inputs/gpt_tiny_ci.ini", ["--parallel.tp", "2", "--parallel.sequence_parallel", "true",
                                                   "--precision.dtype", "bf16"], 1e-4, 2e-3),
    # BERT's padded samples: the cudnn entry with the padding as one length per sample
    ("bert_bf16_fused", "inputs/bert_tiny_ci.ini", ["--model.flash_attention", "true", "--precision.dtype", "bf16"],
     1e-4, 2e-3),
]
RANKS = {"gpt_bf16_tp2_sp": 2}  # cases run on more than one rank (mpiexec -n)
# cases of another app than pretrain_gpt: (app, shards and vocabulary under data/sample)
APPS = {"bert_bf16_fused": ("pretrain_bert", "kjv_bert_*.h5", ["--data.vocab_file", "bert/vocab.txt"])}
# cases whose device run must take the cudnn entry for every micro-batch (no fallback note)
CUDNN_ONLY = {"bert_bf16_fused"}
ITERS = 8


def train(app, root, deck, extra, metrics, log, ranks=1, shards="kjv_gpt2_*.h5"):
    cmd = ([os.environ.get("MPIEXEC", "mpiexec"), "-n", str(ranks)] if ranks > 1 else []) + [
        app, "--deck", os.path.join(root, deck), "--data.train_shards", os.path.join(root, "data", "sample", shards),
        "--train.iters", str(ITERS), "--eval.interval", "0", "--log.metrics_file", metrics] + extra
    with open(log, "w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=300).returncode
    if rc != 0:
        with open(log) as f:
            sys.stderr.write(f.read()[-3000:])
        raise SystemExit(f"compare_training: {' '.join(cmd)} exited {rc} (log: {log})")
    with open(metrics) as f:
        return [(float(r["loss"]), float(r["grad_norm"])) for r in csv.DictReader(f)]


def rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True)
    p.add_argument("--host-app", required=True)
    p.add_argument("--device-app", required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    failed = 0
    for name, deck, extra, tol_loss, tol_norm in CASES:
        runs = {}
        exe, shards, more = APPS.get(name, ("pretrain_gpt", "kjv_gpt2_*.h5", []))
        more = [more[0], os.path.join(a.root, "data", "sample", more[1])] if more else []
        for build, app in (("host", a.host_app), ("device", a.device_app)):
            d = os.path.join(a.work, name, build)
            os.makedirs(d)
            runs[build] = train(os.path.join(os.path.dirname(app), exe), a.root, deck, extra + more,
                                os.path.join(d, "metrics.csv"), os.path.join(d, "out.txt"), RANKS.get(name, 1), shards)
        if name in CUDNN_ONLY:
            with open(os.path.join(a.work, name, "device", "out.txt")) as f:
                out = f.read()
            if "attention: cudnn" not in out or "cannot express" in out:
                print(f"compare_training: {name}: the device run did not take the cudnn entry for every micro-batch")
                failed += 1
                continue
        h, g = runs["host"], runs["device"]
        if len(h) != ITERS or len(g) != ITERS:
            print(f"compare_training: {name}: {len(h)} and {len(g)} iterations written, {ITERS} expected")
            failed += 1
            continue
        dl = max(rel(x[0], y[0]) for x, y in zip(h, g))
        dn = max(rel(x[1], y[1]) for x, y in zip(h, g))
        ok = dl <= tol_loss and dn <= tol_norm
        failed += not ok
        print(f"compare_training: {name}: {ITERS} iterations, loss {h[0][0]:.6f} -> {h[-1][0]:.6f} (host), "
              f"largest relative difference: loss {dl:.2e} (tolerance {tol_loss:.0e}), "
              f"gradient norm {dn:.2e} (tolerance {tol_norm:.0e}): {'ok' if ok else 'FAILED'}")
    print(f"compare_training: {len(CASES) - failed} of {len(CASES)} cases within tolerance")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
