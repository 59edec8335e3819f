#!/usr/bin/python3
"""PyTorch reference for Trident's BERT pretraining (run with Debian's /usr/bin/python3).

A plain re-implementation of pretrain_bert, built from a Trident BERT checkpoint (shapes from
the datasets, hyper-parameters from the deck in the root attribute `deck`), trained on the
global batches Trident dumped (debug.dump_batches: per sample tokens, token types, MLM labels,
padding mask, each seq_length long, then the sentence-order label):

  * x = wte[tok] + wpe[pos] + tte[type]; per layer (pre-LN, bidirectional, padded keys masked)
        x = x + proj(attn(LN1(x)));  x = x + fc2(gelu_tanh(fc1(LN2(x)))); final LN;
  * masked LM: h = LN(gelu_tanh(dense(x))); logits = h wte^T + bias; cross-entropy at the
    labelled positions, mean per micro-batch;
  * sentence order: tanh(pooler(x[:, 0])) -> binary head -> cross-entropy, mean per micro-batch;
  * the step's loss is the mean over the micro-batches (consecutive blocks of micro_batch_size
    rows of the dump) of MLM + SOP; clipping, schedule and AdamW as gpt_reference.py.

Compares per-step loss, MLM and SOP losses, lr and grad norm with Trident's metrics CSV and
the step-1 gradients with grads.h5. Exit status 0 pass, 1 tolerance exceeded, 2 bad input.

  bert_reference.py --checkpoint ck/iter_0000000/checkpoint.h5 --batches batches.h5 \\
                    --metrics metrics.csv --grads grads.h5
"""
import argparse
import json
import math
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gpt_reference as g  # noqa: E402  (deck parsing, Config, schedule, AdamW, metrics, tolerances)


class BertCheckpoint:
    def __init__(self, path):
        g._need_file(path, "checkpoint")
        with h5py.File(path, "r") as f:
            model = g._attr_str(f.attrs.get("model", ""))
            if model != "bert":
                raise g.InputError("%s: model is %r, expected 'bert'" % (path, model))
            self.iteration = int(f.attrs.get("iteration", 0))
            cp = g.parse_deck(g._attr_str(f.attrs["deck"]))
            shapes = {n: tuple(f[n].shape) for n in ("model/embedding/word_embeddings",
                                                      "model/embedding/position_embeddings",
                                                      "model/layers/0/mlp/fc1/weight")}
            self.config = g.Config(cp, shapes)
            self.params = {}
            f["model"].visititems(lambda n, d: self.params.__setitem__(
                "model/" + n, np.asarray(d[...], dtype=np.float64)) if isinstance(d, h5py.Dataset) else None)
        self.binary_head = "model/binary_head/weight" in self.params


class BertReference:
    def __init__(self, ckpt, dtype):
        self.cfg, self.binary = ckpt.config, ckpt.binary_head
        self.p = {n: torch.tensor(v, dtype=dtype).requires_grad_(True) for n, v in ckpt.params.items()}

    def _block(self, x, i, valid):
        cfg, p = self.cfg, self.p
        pre = "model/layers/%d/" % i
        B, T, C = x.shape
        H, D, eps = cfg.num_heads, cfg.head_dim, cfg.layernorm_epsilon
        a = F.layer_norm(x, (C,), p[pre + "input_layernorm/weight"], p[pre + "input_layernorm/bias"], eps)
        q, k, v = F.linear(a, p[pre + "self_attention/qkv/weight"], p[pre + "self_attention/qkv/bias"]).split(C, -1)
        q, k, v = (t.reshape(B, T, H, D).transpose(1, 2) for t in (q, k, v))
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(D)
        s = s.masked_fill(~valid[:, None, None, :], float("-inf"))  # padded keys
        y = torch.matmul(torch.softmax(s, -1), v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, p[pre + "self_attention/proj/weight"], p[pre + "self_attention/proj/bias"])
        a = F.layer_norm(x, (C,), p[pre + "post_attention_layernorm/weight"],
                         p[pre + "post_attention_layernorm/bias"], eps)
        h = F.gelu(F.linear(a, p[pre + "mlp/fc1/weight"], p[pre + "mlp/fc1/bias"]), approximate="tanh")
        return x + F.linear(h, p[pre + "mlp/fc2/weight"], p[pre + "mlp/fc2/bias"])

    def losses(self, tok, typ, lab, pad, order):
        """MLM and SOP losses (means) of one micro-batch."""
        cfg, p = self.cfg, self.p
        B, T = tok.shape
        C, eps = cfg.hidden_size, cfg.layernorm_epsilon
        wte = p["model/embedding/word_embeddings"]
        x = wte[tok] + p["model/embedding/position_embeddings"][:T][None] + p["model/embedding/tokentype_embeddings"][typ]
        valid = pad.bool()
        for i in range(cfg.num_layers):
            x = self._block(x, i, valid)
        x = F.layer_norm(x, (C,), p["model/final_layernorm/weight"], p["model/final_layernorm/bias"], eps)
        h = F.gelu(F.linear(x, p["model/lm_head/dense/weight"], p["model/lm_head/dense/bias"]), approximate="tanh")
        h = F.layer_norm(h, (C,), p["model/lm_head/layernorm/weight"], p["model/lm_head/layernorm/bias"], eps)
        logits = F.linear(h, wte, p["model/lm_head/bias"]).reshape(B * T, -1)
        mlm = F.cross_entropy(logits, lab.reshape(-1), ignore_index=-1, reduction="mean")
        sop = torch.zeros((), dtype=x.dtype)
        if self.binary:
            pooled = torch.tanh(F.linear(x[:, 0], p["model/pooler/dense/weight"], p["model/pooler/dense/bias"]))
            sop = F.cross_entropy(F.linear(pooled, p["model/binary_head/weight"], p["model/binary_head/bias"]), order)
        return mlm, sop


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--batches", required=True)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--grads")
    ap.add_argument("--loss-rtol", type=float, default=g.DEFAULT_LOSS_RTOL)
    ap.add_argument("--grad-rtol", type=float, default=g.DEFAULT_GRAD_RTOL)
    ap.add_argument("--gnorm-rtol", type=float, default=g.DEFAULT_GNORM_RTOL)
    ap.add_argument("--lr-rtol", type=float, default=g.DEFAULT_LR_RTOL)
    ap.add_argument("--report")
    a = ap.parse_args()
    torch.set_num_threads(2)
    try:
        ck = BertCheckpoint(a.checkpoint)
        cfg = ck.config
        rows = g.read_metrics(a.metrics)
        for need in ("lm_loss", "sop_loss"):
            if need not in next(iter(rows.values())):
                raise g.InputError("%s: column %r is missing (not a BERT run?)" % (a.metrics, need))
        ref_grads = None
        if a.grads:
            g._need_file(a.grads, "grads")
            with h5py.File(a.grads, "r") as f:
                ref_grads = {n: np.asarray(f[n][...], dtype=np.float64) for n in ck.params if n in f}
    except g.InputError as e:
        print("bad input:", e)
        return 2
    model = BertReference(ck, torch.float64)
    opt = g.AdamW(model.p, cfg, step=ck.iteration)
    S, mbs = cfg.seq_length, cfg.micro_batch_size
    worst = {"loss": 0.0, "lm_loss": 0.0, "sop_loss": 0.0, "lr": 0.0, "grad_norm": 0.0, "grad": 0.0}
    failures = []
    it = ck.iteration
    with h5py.File(a.batches, "r") as fb:
        while g.batch_name(it + 1) in fb and it + 1 in rows:
            it += 1
            batch = torch.as_tensor(np.asarray(fb[g.batch_name(it)][...], dtype=np.int64))
            if tuple(batch.shape) != (cfg.global_batch_size, 4 * S + 1):
                print("bad input: %s has shape %s, expected (%d, %d)" % (g.batch_name(it), tuple(batch.shape),
                                                                        cfg.global_batch_size, 4 * S + 1))
                return 2
            for t in model.p.values():
                t.grad = None
            nmb = cfg.global_batch_size // mbs
            tot = {"loss": 0.0, "lm_loss": 0.0, "sop_loss": 0.0}
            for k in range(nmb):
                b = batch[k * mbs:(k + 1) * mbs]
                mlm, sop = model.losses(b[:, :S], b[:, S:2 * S], b[:, 2 * S:3 * S], b[:, 3 * S:4 * S], b[:, 4 * S])
                ((mlm + sop) / nmb).backward()
                tot["lm_loss"] += mlm.item() / nmb
                tot["sop_loss"] += sop.item() / nmb
            tot["loss"] = tot["lm_loss"] + tot["sop_loss"]
            with torch.no_grad():
                gnorm = math.sqrt(sum(float((t.grad ** 2).sum()) for t in model.p.values()))
                if it == 1 and ref_grads is not None:
                    for n, t in model.p.items():
                        if n not in ref_grads:
                            failures.append("step-1 gradient of %s missing from grads.h5" % n)
                            continue
                        ref = t.grad.numpy()
                        err = np.linalg.norm(ref_grads[n] - ref) / max(np.linalg.norm(ref),
                                                                        g.DEFAULT_GRAD_FLOOR_FRAC * gnorm)
                        worst["grad"] = max(worst["grad"], err)
                        if err > a.grad_rtol:
                            failures.append("step-1 gradient of %s: relative L2 error %.2e" % (n, err))
                if cfg.clip_grad > 0 and cfg.clip_grad / (gnorm + 1e-6) < 1:
                    for t in model.p.values():
                        t.grad.mul_(cfg.clip_grad / (gnorm + 1e-6))
            lr = g.lr_at(cfg, it)
            opt.step(lr)
            row = rows[it]
            for key, mine, tol in (("loss", tot["loss"], a.loss_rtol), ("lm_loss", tot["lm_loss"], a.loss_rtol),
                                   ("sop_loss", tot["sop_loss"], a.loss_rtol), ("lr", lr, a.lr_rtol),
                                   ("grad_norm", gnorm, a.gnorm_rtol)):
                r = g._rel(row[key], mine)
                worst[key] = max(worst[key], r)
                if r > tol:
                    failures.append("step %d: %s Trident %.8g, reference %.8g (relative %.2e > %.0e)"
                                    % (it, key, row[key], mine, r, tol))
            print("step %3d | loss %.6f (Trident %.6f) | lm %.6f | sop %.6f | gnorm %.5f (Trident %.5f)"
                  % (it, tot["loss"], row["loss"], tot["lm_loss"], tot["sop_loss"], gnorm, row["grad_norm"]))
    steps = it - ck.iteration
    if steps == 0:
        print("bad input: no batch matches a metrics row")
        return 2
    print("worst relative differences over %d steps: %s" % (steps, ", ".join("%s %.2e" % kv for kv in worst.items())))
    if a.report:
        with open(a.report, "w") as fh:
            json.dump({"steps": steps, "worst": worst, "failures": failures}, fh, indent=1)
    for f_ in failures:
        print("FAIL:", f_)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
