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


CHECKS = {"recompute": check_recompute, "recompute_tp": check_recompute_tp, "zero1": check_zero1}


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
