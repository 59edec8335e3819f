#!/usr/bin/python3
"""PyTorch reference for Trident's T5 pretraining (run with Debian's /usr/bin/python3).

A plain re-implementation of pretrain_t5, built from a Trident T5 checkpoint (shapes from the
datasets, hyper-parameters from the deck in the root attribute `deck`), trained on the global
batches Trident dumped (debug.dump_batches: per sample the encoder tokens and padding mask,
seq_length each, then the decoder input and targets, decoder_seq_length each, -1 at padding):

  * emb(t) = wte[t] + wpe[position]  (one table of each, shared by encoder and decoder);
  * encoder layer (pre-LN, bidirectional, padded keys masked):
        x = x + proj(attn(LN1(x)));  x = x + fc2(gelu_tanh(fc1(LN2(x))));  e = LN_enc(x)
  * decoder layer (pre-LN, causal self-attention, then cross-attention over e with the
    encoder's padded keys masked):
        y = y + proj(attn(LN1(y)));  y = y + cproj(attn(q(LNx(y)), kv(e)));
        y = y + fc2(gelu_tanh(fc1(LN2(y))));  then LN_dec;
  * logits = y wte^T + lm_bias; cross-entropy over the decoder targets, mean per micro-batch;
    the step's loss is the mean over the micro-batches; clipping, schedule and AdamW as
    gpt_reference.py.

Compares per-step loss, lr and grad norm with Trident's metrics CSV and the step-1 gradients
with grads.h5. Exit status 0 pass, 1 tolerance exceeded, 2 bad input.

  t5_reference.py --checkpoint ck/iter_0000000/checkpoint.h5 --batches batches.h5 \\
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


class T5Checkpoint:
    def __init__(self, path):
        g._need_file(path, "checkpoint")
        with h5py.File(path, "r") as f:
            model = g._attr_str(f.attrs.get("model", ""))
            if model != "t5":
                raise g.InputError("%s: model is %r, expected 't5'" % (path, model))
            self.iteration = int(f.attrs.get("iteration", 0))
            cp = g.parse_deck(g._attr_str(f.attrs["deck"]))
            shapes = {n: tuple(f[n].shape) for n in ("model/embedding/word_embeddings",
                                                      "model/embedding/position_embeddings")}
            shapes["model/layers/0/mlp/fc1/weight"] = tuple(f["model/encoder/layers/0/mlp/fc1/weight"].shape)
            self.config = g.Config(cp, shapes)
            self.decoder_seq_length = g._deck_get(cp, "model", "decoder_seq_length", g._to_int)
            dec_layers = g._deck_get(cp, "model", "decoder_num_layers", g._to_int, 0)
            self.decoder_layers = dec_layers if dec_layers > 0 else self.config.num_layers
            self.params = {}
            f["model"].visititems(lambda n, d: self.params.__setitem__(
                "model/" + n, np.asarray(d[...], dtype=np.float64)) if isinstance(d, h5py.Dataset) else None)


class T5Reference:
    def __init__(self, ckpt, dtype):
        self.cfg, self.dec_layers = ckpt.config, ckpt.decoder_layers
        self.p = {n: torch.tensor(v, dtype=dtype).requires_grad_(True) for n, v in ckpt.params.items()}

    def _ln(self, x, name):
        C = x.shape[-1]
        return F.layer_norm(x, (C,), self.p[name + "/weight"], self.p[name + "/bias"], self.cfg.layernorm_epsilon)

    def _lin(self, x, name):
        return F.linear(x, self.p[name + "/weight"], self.p[name + "/bias"])

    def _attend(self, q, k, v, key_valid, causal):
        """q (B, Tq, C), k / v (B, Tk, C) -> (B, Tq, C)."""
        H, D = self.cfg.num_heads, self.cfg.head_dim
        B, Tq, C = q.shape
        Tk = k.shape[1]
        q, k, v = (t.reshape(B, -1, H, D).transpose(1, 2) for t in (q, k, v))
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(D)
        if key_valid is not None:
            s = s.masked_fill(~key_valid[:, None, None, :], float("-inf"))
        if causal:
            s = s.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool).triu(1), float("-inf"))
        return torch.matmul(torch.softmax(s, -1), v).transpose(1, 2).reshape(B, Tq, C)

    def _layer(self, x, pre, key_valid, causal, enc=None, enc_valid=None):
        C = x.shape[-1]
        q, k, v = self._lin(self._ln(x, pre + "input_layernorm"), pre + "self_attention/qkv").split(C, -1)
        x = x + self._lin(self._attend(q, k, v, key_valid, causal), pre + "self_attention/proj")
        if enc is not None:
            q = self._lin(self._ln(x, pre + "cross_attention_layernorm"), pre + "cross_attention/q")
            k, v = self._lin(enc, pre + "cross_attention/kv").split(C, -1)
            x = x + self._lin(self._attend(q, k, v, enc_valid, False), pre + "cross_attention/proj")
        h = F.gelu(self._lin(self._ln(x, pre + "post_attention_layernorm"), pre + "mlp/fc1"), approximate="tanh")
        return x + self._lin(h, pre + "mlp/fc2")

    def loss(self, enc_tok, enc_pad, dec_in, dec_target):
        """Mean cross-entropy over the decoder targets of one micro-batch."""
        p = self.p
        wte, wpe = p["model/embedding/word_embeddings"], p["model/embedding/position_embeddings"]
        valid = enc_pad.bool()
        x = wte[enc_tok] + wpe[:enc_tok.shape[1]][None]
        for i in range(self.cfg.num_layers):
            x = self._layer(x, "model/encoder/layers/%d/" % i, valid, False)
        e = self._ln(x, "model/encoder/final_layernorm")
        y = wte[dec_in] + wpe[:dec_in.shape[1]][None]
        for i in range(self.dec_layers):
            y = self._layer(y, "model/decoder/layers/%d/" % i, None, True, e, valid)
        y = self._ln(y, "model/decoder/final_layernorm")
        logits = F.linear(y, wte, p["model/lm_head/bias"]).reshape(-1, wte.shape[0])
        return F.cross_entropy(logits, dec_target.reshape(-1), ignore_index=-1, reduction="mean")


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
        ck = T5Checkpoint(a.checkpoint)
        cfg = ck.config
        rows = g.read_metrics(a.metrics)
        ref_grads = None
        if a.grads:
            g._need_file(a.grads, "grads")
            with h5py.File(a.grads, "r") as f:
                ref_grads = {n: np.asarray(f[n][...], dtype=np.float64) for n in ck.params if n in f}
    except g.InputError as e:
        print("bad input:", e)
        return 2
    model = T5Reference(ck, torch.float64)
    opt = g.AdamW(model.p, cfg, step=ck.iteration)
    S, Sd, mbs = cfg.seq_length, ck.decoder_seq_length, cfg.micro_batch_size
    worst = {"loss": 0.0, "lr": 0.0, "grad_norm": 0.0, "grad": 0.0}
    failures = []
    it = ck.iteration
    with h5py.File(a.batches, "r") as fb:
        while g.batch_name(it + 1) in fb and it + 1 in rows:
            it += 1
            batch = torch.as_tensor(np.asarray(fb[g.batch_name(it)][...], dtype=np.int64))
            if tuple(batch.shape) != (cfg.global_batch_size, 2 * S + 2 * Sd):
                print("bad input: %s has shape %s, expected (%d, %d)" % (g.batch_name(it), tuple(batch.shape),
                                                                        cfg.global_batch_size, 2 * S + 2 * Sd))
                return 2
            for t in model.p.values():
                t.grad = None
            nmb = cfg.global_batch_size // mbs
            loss = 0.0
            for k in range(nmb):
                b = batch[k * mbs:(k + 1) * mbs]
                lm = model.loss(b[:, :S], b[:, S:2 * S], b[:, 2 * S:2 * S + Sd], b[:, 2 * S + Sd:])
                (lm / nmb).backward()
                loss += lm.item() / nmb
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
            for key, mine, tol in (("loss", loss, a.loss_rtol), ("lr", lr, a.lr_rtol),
                                   ("grad_norm", gnorm, a.gnorm_rtol)):
                r = g._rel(row[key], mine)
                worst[key] = max(worst[key], r)
                if r > tol:
                    failures.append("step %d: %s Trident %.8g, reference %.8g (relative %.2e > %.0e)"
                                    % (it, key, row[key], mine, r, tol))
            print("step %3d | loss %.6f (Trident %.6f) | gnorm %.5f (Trident %.5f)"
                  % (it, loss, row["loss"], gnorm, row["grad_norm"]))
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
