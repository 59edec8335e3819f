#!/usr/bin/env python3
"""Context parallelism against cp = 1 (docs/DESIGN.md "Context parallelism"; deck keys parallel.cp,
parallel.cp_comm_type).

usage: cp_checks.py CHECK --build BUILD --sample DIR --work DIR [--packed DIR] [--mpiexec M]
  ring     ring attention (p2p) on inputs/llama_tiny_ci.ini (rotary positions, 4 heads in 2
           key/value groups, hidden and attention dropout 0.1) with the fused kernel, 10 steps:
           cp=2 and cp=4 against one rank; cp=2 x tp=2 with sequence parallelism against tp=2
           (hidden dropout off there: under sequence parallelism each tp rank draws its own rows'
           masks, Megatron's convention, so only the attention masks can match across cp);
           cp=2 x pp=2; cp=2 x dp=2 with ZeRO-1; full recomputation; packed documents
           (data.reset_position_ids, reset_attention_mask, eod_mask_loss on sentence documents:
           ranks hold unequal numbers of scored tokens); bf16; and a run of 5 steps at cp=2
           resumed at cp=1 for 5 more
  a2a      all-to-all over heads: cp=2 (4 heads, 2 groups) and cp=4 (8 heads in 4 groups)
           against one rank, and packed documents at cp=2
  errors   one clear error each: seq_length not divisible by 2 cp, a2a heads not divisible by cp,
           the unfused attention path, BERT, MoE layers, an unknown cp_comm_type, a world size
           that tp x cp x pp does not divide

Every comparison: losses and gradient norms of every step within the fp32 layout tolerances of
validation/ (loss 7e-7, grad norm 5e-6 relative; bf16: loss 1e-4), and every parameter tensor
after steps 1, 5 and 10 (debug.dump_params) within 5e-6 of its norm (relative L2; bf16: 1e-2,
grad norm 1e-2). The layout each run
reports is asserted (tests/testlib.assert_layout).
"""
import argparse
import csv
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from testlib import assert_layout, run, single_error_failures  # noqa: E402

DECK = os.path.join(ROOT, "inputs", "llama_tiny_ci.ini")
# fp32: validation/'s layout tolerances for losses and grad norms; parameters per tensor, the L2 norm
# of the difference over the tensor's (measured at most 5.1e-7, packed documents at iteration 1)
LOSS_REL, GNORM_REL, PARAM_REL = 7e-7, 5e-6, 5e-6
# bf16 (measured: loss 7.4e-6, grad norm 3.5e-3, parameters 1.6e-3 after 20 steps)
BF16 = (1e-4, 1e-2, 1e-2)
ITERS = 10
PARAMS_AT = (1, ITERS // 2, ITERS)  # the parameters compared (dumped by every run)
DUMP_AT = ",".join(map(str, PARAMS_AT))


class Ctx:
    def __init__(self, a):
        self.a = a
        os.makedirs(a.work, exist_ok=True)
        self.app = os.path.join(a.build, "apps", "pretrain_gpt")
        self.shards = os.path.join(a.sample, "kjv_gpt2_*.h5")
        self.packed = os.path.join(a.packed, "kjv_sentences_gpt2_*.h5") if a.packed else None
        self.runs = {}

    def train(self, name, np_, *extra, iters=ITERS, dump=True):
        """Trains `name` (once per check) and returns its work directory."""
        if name in self.runs:
            return self.runs[name]
        w = os.path.join(self.a.work, name)
        shutil.rmtree(w, ignore_errors=True)
        os.makedirs(w)
        cmd = [self.a.mpiexec, "-n", str(np_), self.app, "--deck", DECK, "--data.train_shards", self.shards,
               "--model.flash_attention", "true", "--train.iters", str(iters), "--checkpoint.save", "",
               "--log.metrics_file", os.path.join(w, "metrics.csv"), "--eval.interval", "1000"]
        if dump:
            cmd += ["--debug.dump_params", os.path.join(w, "params"), "--debug.dump_params_iters", DUMP_AT]
        cmd += list(extra)
        _, out, dt = run(cmd)
        assert_layout(cmd, out)
        print(f"  trained {name} ({np_} ranks, {dt:.1f} s)")
        self.runs[name] = w
        return w


def metrics(w):
    with open(os.path.join(w, "metrics.csv")) as f:
        return {int(r["iteration"]): r for r in csv.DictReader(f)}


def params(w, it):
    import h5py
    out = {}
    with h5py.File(os.path.join(w, "params", "iter_%07d.h5" % it)) as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


def compare(name, base, other, tol=(LOSS_REL, GNORM_REL, PARAM_REL), iters=None, params_at=PARAMS_AT):
    import numpy as np
    a, b = metrics(base), metrics(other)
    iters = iters or sorted(b)
    worst_l = worst_g = worst_p = 0.0
    for it in iters:
        la, lb = float(a[it]["loss"]), float(b[it]["loss"])
        ga, gb = float(a[it]["grad_norm"]), float(b[it]["grad_norm"])
        worst_l = max(worst_l, abs(la - lb) / abs(la))
        worst_g = max(worst_g, abs(ga - gb) / ga)
    for it in params_at:
        pa, pb = params(base, it), params(other, it)
        assert sorted(pa) == sorted(pb), f"{name}: other tensors dumped at iteration {it}"
        assert len(pa) > 0, f"{name}: no parameters dumped at iteration {it}"
        for k in pa:
            x, y = pa[k].astype(np.float64), pb[k].astype(np.float64)
            worst_p = max(worst_p, float(np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-30)))
    ok = worst_l <= tol[0] and worst_g <= tol[1] and worst_p <= tol[2]
    print(f"{'ok  ' if ok else 'FAIL'} {name:34s} {len(iters)} steps: loss {worst_l:.1e} (<= {tol[0]:.0e}), grad norm "
          f"{worst_g:.1e} (<= {tol[1]:.0e}); parameters after {','.join(map(str, params_at))}: {worst_p:.1e} "
          f"(<= {tol[2]:.0e})")
    return ok


def check_ring(c):
    failures = []
    one = c.train("one", 1)
    packed = ["--data.train_shards", c.packed, "--data.reset_position_ids", "true", "--data.reset_attention_mask",
              "true", "--data.eod_mask_loss", "true"]
    sp = ["--parallel.tp", "2", "--parallel.sequence_parallel", "true", "--model.hidden_dropout", "0"]
    cases = [
        ("cp2", one, ("cp2", 2, "--parallel.cp", "2"), None),
        ("cp4", one, ("cp4", 4, "--parallel.cp", "4"), None),
        ("cp2_tp2_sp", c.train("tp2_sp", 2, *sp), ("cp2_tp2_sp", 4, "--parallel.cp", "2", *sp), None),
        ("cp2_pp2", one, ("cp2_pp2", 4, "--parallel.cp", "2", "--parallel.pp", "2"), None),
        ("cp2_dp2_zero1", one, ("cp2_dp2_zero1", 4, "--parallel.cp", "2", "--optim.distributed", "true"), None),
        ("cp2_recompute_full", one, ("cp2_recompute", 2, "--parallel.cp", "2", "--precision.recompute", "full",
                                     "--precision.recompute_num_layers", "1"), None),
        ("cp2_packed_documents", c.train("packed", 1, *packed), ("cp2_packed", 2, "--parallel.cp", "2", *packed),
         None),
        ("cp2_bf16", c.train("bf16", 1, "--precision.dtype", "bf16"),
         ("cp2_bf16", 2, "--parallel.cp", "2", "--precision.dtype", "bf16"), BF16),
    ]
    for name, base, (run_name, np_, *extra), tol in cases:
        if not compare(name, base, c.train(run_name, np_, *extra), tol or (LOSS_REL, GNORM_REL, PARAM_REL)):
            failures.append(name)
    # 5 steps at cp=2 with a checkpoint, then 5 more at cp=1 (its parameters dumped at 10); the
    # whole run's schedule in both jobs (decay_iters defaults to train.iters)
    w = os.path.join(c.a.work, "resume")
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(w)
    base = [c.a.mpiexec, "-n", "2", c.app, "--deck", DECK, "--data.train_shards", c.shards, "--model.flash_attention",
            "true", "--train.iters", str(ITERS), "--checkpoint.save", os.path.join(w, "ckpt"), "--checkpoint.interval",
            str(ITERS // 2), "--log.metrics_file", os.path.join(w, "metrics.csv"), "--eval.interval", "1000",
            "--debug.dump_params", os.path.join(w, "params"), "--debug.dump_params_iters", DUMP_AT,
            "--optim.decay_iters", str(ITERS)]
    first = base + ["--parallel.cp", "2"]
    first[first.index("--train.iters") + 1] = str(ITERS // 2)
    _, out, _ = run(first)
    assert_layout(first, out)
    second = list(base)
    second[2] = "1"
    second += ["--checkpoint.load", os.path.join(w, "ckpt")]
    _, out, _ = run(second)
    assert_layout(second, out)
    if "resum" not in out.lower():
        failures.append("resume: the cp=1 run did not report resuming")
    if not compare("resume5_cp2_to_cp1", one, w, iters=list(range(1, ITERS + 1))):
        failures.append("resume5_cp2_to_cp1")
    if failures:
        raise SystemExit("FAILED: " + ", ".join(failures))


def check_a2a(c):
    failures = []
    one = c.train("one", 1)
    a2a = ["--parallel.cp_comm_type", "a2a"]
    heads8 = ["--model.num_heads", "8", "--model.num_query_groups", "4"]
    packed = ["--data.train_shards", c.packed, "--data.reset_position_ids", "true", "--data.reset_attention_mask",
              "true", "--data.eod_mask_loss", "true"]
    cases = [
        ("a2a_cp2", one, ("a2a_cp2", 2, "--parallel.cp", "2", *a2a)),
        ("a2a_cp4_8heads", c.train("one_8heads", 1, *heads8), ("a2a_cp4", 4, "--parallel.cp", "4", *a2a, *heads8)),
        ("a2a_cp2_packed_documents", c.train("packed", 1, *packed),
         ("a2a_cp2_packed", 2, "--parallel.cp", "2", *a2a, *packed)),
    ]
    for name, base, (run_name, np_, *extra) in cases:
        if not compare(name, base, c.train(run_name, np_, *extra)):
            failures.append(name)
    if failures:
        raise SystemExit("FAILED: " + ", ".join(failures))


def check_errors(c):
    base = [c.a.mpiexec, "-n", "2", c.app, "--deck", DECK, "--data.train_shards", c.shards, "--train.iters", "2",
            "--checkpoint.save", "", "--parallel.cp", "2"]
    bert = os.path.join(c.a.build, "apps", "pretrain_bert")
    cases = [
        ("seq_length not divisible by 2 cp", base + ["--model.flash_attention", "true", "--model.seq_length", "30"],
         "is not divisible by 2 x parallel.cp"),
        ("a2a heads not divisible by cp",
         base[:2] + ["4"] + base[3:-1] + ["4", "--model.flash_attention", "true", "--parallel.cp_comm_type", "a2a"],
         "key/value groups over parallel.cp = 4"),
        ("unfused attention", base, "needs model.flash_attention = true"),
        ("BERT", [c.a.mpiexec, "-n", "2", bert, "--deck", os.path.join(ROOT, "inputs", "bert_tiny_ci.ini"),
                  "--data.train_shards", os.path.join(c.a.sample, "kjv_bert_*.h5"), "--train.iters", "2",
                  "--checkpoint.save", "", "--parallel.cp", "2", "--model.flash_attention", "true"],
         "supported by pretrain_gpt only"),
        ("MoE layers", base + ["--model.flash_attention", "true", "--moe.num_experts", "4", "--moe.router_topk", "2",
                               "--moe.ffn_hidden_size", "32"], "with MoE layers is not supported"),
        ("unknown cp_comm_type", base + ["--model.flash_attention", "true", "--parallel.cp_comm_type", "ring"],
         "parallel.cp_comm_type"),
        ("world not divisible by cp", base[:2] + ["3"] + base[3:] + ["--model.flash_attention", "true"],
         "is not divisible by parallel.tp x parallel.cp x parallel.pp"),
    ]
    failures = single_error_failures(cases)
    if failures:
        raise SystemExit("FAILED: " + ", ".join(failures))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("check", choices=["ring", "a2a", "errors"])
    p.add_argument("--build", required=True)
    p.add_argument("--sample", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--packed", default=None)
    p.add_argument("--mpiexec", default="mpiexec")
    a = p.parse_args()
    c = Ctx(a)
    {"ring": check_ring, "a2a": check_a2a, "errors": check_errors}[a.check](c)
    shutil.rmtree(a.work, ignore_errors=True)  # the runs' parameter dumps (about 1 GB for ring); kept on failure
    print(f"{a.check}: passed")


if __name__ == "__main__":
    main()
