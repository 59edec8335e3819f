#!/usr/bin/env python3
"""Activation recomputation, distributed optimizer, mixed precision and memory checks of
pretrain_gpt (CTest labels mpi, precision).

usage: precision_checks.py CHECK --app PRETRAIN_GPT --deck DECK --shards GLOB --work DIR [--mpiexec M]

Checks (the tiny CI deck, dropout 0.1 where stated so that regenerated masks are exercised):
  recompute     3 layers, 1 rank: selective, full/uniform with groups of 2 (a partial last
                group) and full/block with 2 layers give step-1 gradients BITWISE identical to
                no recomputation, and the same losses over 5 steps
  recompute_tp  the same at tp=2 with sequence parallelism (np=2), and full/uniform under a
                2-stage 1F1B pipeline with 4 micro-batches in flight (np=2)
  zero1         dp=2 (np=2), fp32: the distributed optimizer gives losses equal to the plain
                optimizer's and final parameters and moments BITWISE identical; a checkpoint
                saved by the distributed optimizer at dp=2 resumes at dp=1 (plain), and one saved
                at dp=1 resumes at dp=2 (distributed), both continuing the uninterrupted losses
                (relative 1e-5: dp changes the summation order)
  memory        the measured memory (printed per rank at the end of a run) against Megatron's
                bytes per parameter and Korthikanti et al.'s activations per layer, within 15%,
                and each figure falls as predicted when its feature is turned on: selective and
                full recomputation (activations), tp=2 with sequence parallelism (activations
                divided by t), the distributed optimizer at dp=2 (optimizer state halved,
                bytes per parameter 16 -> 8 + 8/d)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tp_checks import Ctx  # noqa: E402


def same_grads(name, ref_path, got_path):
    """Every gradient tensor of step 1 bit for bit equal."""
    import h5py
    import numpy as np
    n = 0
    with h5py.File(ref_path) as fr, h5py.File(got_path) as fg:
        names = []
        fr.visit(lambda k: names.append(k) if isinstance(fr[k], h5py.Dataset) else None)
        for k in names:
            a, b = fr[k][()], fg[k][()]
            assert a.shape == b.shape, (k, a.shape, b.shape)
            if not np.array_equal(a.view(np.uint32), b.view(np.uint32)):
                d = np.abs(a.astype(np.float64) - b).max()
                raise SystemExit(f"FAILED {name}: gradient {k} is not bitwise identical (max |diff| {d:.3e})")
            n += 1
    assert n > 0, "no gradients were dumped"
    print(f"{name}: {n} gradient tensors after step 1 bitwise identical")


def same_losses(name, ref, got):
    assert len(ref) == len(got) and len(ref) > 0, (len(ref), len(got))
    for i, (a, b) in enumerate(zip(ref, got)):
        assert a == b, f"{name}: step {i + 1} differs: loss/grad norm {a} vs {b}"
    print(f"{name}: {len(ref)} steps, losses and gradient norms equal (9 significant digits printed)")


RECOMPUTE_MODES = [
    ("selective", ["--precision.recompute", "selective"]),
    ("full_uniform2", ["--precision.recompute", "full", "--precision.recompute_method", "uniform",
                       "--precision.recompute_num_layers", "2"]),
    ("full_block2", ["--precision.recompute", "full", "--precision.recompute_method", "block",
                     "--precision.recompute_num_layers", "2"]),
]


def check_recompute(c):
    layers = ["--model.num_layers", "3"]
    ref = c.train("none", 1, 1, iters=5, dropout=0.1, extra=layers)
    for name, extra in RECOMPUTE_MODES:
        got = c.train(name, 1, 1, iters=5, dropout=0.1, extra=layers + extra)
        same_losses(name, ref, got)
        same_grads(name, c.path("none_grads.h5"), c.path(name + "_grads.h5"))


def check_recompute_tp(c):
    layers = ["--model.num_layers", "4"]
    ref = c.train("tp2_none", 2, 2, sp=True, iters=4, dropout=0.1, extra=layers)
    for name, extra in RECOMPUTE_MODES:
        got = c.train("tp2_" + name, 2, 2, sp=True, iters=4, dropout=0.1, extra=layers + extra)
        same_losses("tp2+sp " + name, ref, got)
        same_grads("tp2+sp " + name, c.path("tp2_none_grads.h5"), c.path("tp2_" + name + "_grads.h5"))
    pipe = layers + ["--train.global_batch_size", "8"]
    ref = c.train("pp2_none", 2, 1, pp=2, iters=3, dropout=0.1, extra=pipe)
    got = c.train("pp2_full", 2, 1, pp=2, iters=3, dropout=0.1, extra=pipe + RECOMPUTE_MODES[1][1])
    same_losses("pp2 (1F1B, 4 micro-batches) full_uniform2", ref, got)
    same_grads("pp2 (1F1B, 4 micro-batches) full_uniform2", c.path("pp2_none_grads.h5"), c.path("pp2_full_grads.h5"))


def same_checkpoints(name, a, b):
    """Every dataset of two checkpoint files bit for bit equal."""
    import h5py
    import numpy as np
    n = 0
    with h5py.File(a) as fa, h5py.File(b) as fb:
        names = []
        fa.visit(lambda k: names.append(k) if isinstance(fa[k], h5py.Dataset) else None)
        for k in names:
            x, y = fa[k][()], fb[k][()]
            if x.shape != y.shape or not np.array_equal(x.view(np.uint32), y.view(np.uint32)):
                raise SystemExit(f"FAILED {name}: {k} is not bitwise identical")
            n += 1
    assert n > 0 and any(k.startswith("optimizer/") for k in names), "no optimizer state in the checkpoint"
    print(f"{name}: {n} datasets (parameters and Adam moments) bitwise identical")


def check_zero1(c):
    from tp_checks import compare_losses
    fixed = ["--optim.decay_iters", "8"]
    plain = c.train("plain", 2, 1, iters=8, dropout=0.1, extra=fixed + ["--checkpoint.save", c.path("ck_plain")])
    zero = c.train("zero", 2, 1, iters=8, dropout=0.1,
                   extra=fixed + ["--optim.distributed", "true", "--checkpoint.save", c.path("ck_zero")])
    same_losses("ZeRO-1 dp=2", plain, zero)
    ck = "iter_0000008/checkpoint.h5"
    same_checkpoints("ZeRO-1 dp=2 after 8 steps", c.path("ck_plain", ck), c.path("ck_zero", ck))
    # resume across data-parallel sizes and optimizer modes
    c.train("z1", 2, 1, iters=4, dropout=0.1, extra=fixed + ["--optim.distributed", "true", "--checkpoint.save", c.path("ck_z")])
    tail = c.train("z2", 1, 1, iters=8, dropout=0.1, extra=fixed + ["--checkpoint.load", c.path("ck_z")])
    compare_losses("ZeRO-1 dp=2 -> plain dp=1", plain[4:], tail)
    c.train("p1", 1, 1, iters=4, dropout=0.1, extra=fixed + ["--checkpoint.save", c.path("ck_p")])
    tail = c.train("p2", 2, 1, iters=8, dropout=0.1,
                   extra=fixed + ["--optim.distributed", "true", "--checkpoint.load", c.path("ck_p")])
    compare_losses("plain dp=1 -> ZeRO-1 dp=2", plain[4:], tail)


FIELDS = ["params", "grads", "optimizer", "bytes_per_param", "megatron_bytes_per_param", "activations", "slots",
          "workspace", "layer_activations", "korthikanti"]


def memory(c, name, np_, tp=1, sp=False, extra=()):
    """Rank 0's memory figures of a 2-step run."""
    from testlib import run
    cmd = [c.a.mpiexec, "-n", str(np_), c.a.app, "--deck", c.a.deck, "--data.train_shards", c.a.shards,
           "--parallel.tp", str(tp), "--parallel.sequence_parallel", "true" if sp else "false",
           "--model.hidden_dropout", "0.1", "--model.attention_dropout", "0.1", "--model.num_layers", "4",
           "--train.iters", "2", "--eval.interval", "0"] + list(extra)
    _, out, _ = run(cmd)
    line = [l for l in out.splitlines() if l.startswith("memory figures:")]
    assert line, out[-2000:]
    vals = [float(x) for x in line[0].split(":", 1)[1].split()]
    m = dict(zip(FIELDS, vals))
    print(f"{name:28s} bytes/param {m['bytes_per_param']:.2f} (Megatron {m['megatron_bytes_per_param']:.2f}), "
          f"optimizer {m['optimizer'] / 2**20:.2f} MiB, per layer {m['layer_activations'] / 1024:.1f} KiB "
          f"(Korthikanti {m['korthikanti'] / 1024:.1f} KiB)")
    return m


def within(name, got, want, tol=0.15):
    r = got / want
    assert abs(r - 1) <= tol, f"{name}: {got:.4g} vs predicted {want:.4g} (ratio {r:.3f}, tolerance {tol})"
    print(f"  ok {name}: ratio {r:.3f}")


def check_memory(c):
    base = memory(c, "fp32, no recomputation", 1)
    sel = memory(c, "selective", 1, extra=["--precision.recompute", "selective"])
    full = memory(c, "full uniform 1", 1, extra=["--precision.recompute", "full"])
    full2 = memory(c, "full uniform 2", 1, extra=["--precision.recompute", "full", "--precision.recompute_num_layers", "2"])
    tpsp = memory(c, "tp=2 + SP", 2, tp=2, sp=True)
    plain = memory(c, "dp=2", 2)
    zero = memory(c, "dp=2 distributed optimizer", 2, extra=["--optim.distributed", "true"])
    for name, m in [("no recomputation", base), ("selective", sel), ("full uniform 1", full),
                    ("full uniform 2", full2), ("tp=2 + SP", tpsp)]:
        within(name + ": activations per layer vs Korthikanti", m["layer_activations"], m["korthikanti"])
    for name, m in [("fp32", base), ("dp=2", plain), ("dp=2 ZeRO-1", zero)]:
        within(name + ": bytes per parameter vs Megatron", m["bytes_per_param"], m["megatron_bytes_per_param"])
    # each feature lowers its figure by the predicted factor
    for name, m in [("selective", sel), ("full uniform 1", full), ("full uniform 2", full2), ("tp=2 + SP", tpsp)]:
        assert m["layer_activations"] < base["layer_activations"], name
        within(name + ": fall of activations", m["layer_activations"] / base["layer_activations"],
               m["korthikanti"] / base["korthikanti"])
    assert zero["optimizer"] < plain["optimizer"]
    within("ZeRO-1: optimizer state dp=2 over dp=1", zero["optimizer"] / plain["optimizer"], 0.5, tol=0.02)
    assert zero["activations"] == plain["activations"]


CHECKS = {"memory": check_memory, "recompute": check_recompute, "recompute_tp": check_recompute_tp, "zero1": check_zero1}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("check", choices=sorted(CHECKS))
    p.add_argument("--app", required=True)
    p.add_argument("--deck", required=True)
    p.add_argument("--shards", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--mpiexec", default="mpiexec")
    a = p.parse_args()
    CHECKS[a.check](Ctx(a))
    print("PASSED")


if __name__ == "__main__":
    main()
