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


CHECKS = {"recompute": check_recompute, "recompute_tp": check_recompute_tp}


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
