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
import math
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gpt_reference as g  # noqa: E402  (deck parsing, Config, schedule, AdamW, metrics, tolerances)
import reference_loop  # noqa: E402  (checkpoint reading, the training and comparison loop)


class BertReference:
    def __init__(self, ckpt, dtype, drop):
        self.cfg, self.binary = ckpt.config, "model/binary_head/weight" in ckpt.params
        self.p = {n: torch.tensor(v, dtype=dtype).requires_grad_(True) for n, v in ckpt.params.items()}
        self.drop = drop  # reference_loop.Dropout: Trident's masks, where Trident applies them

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
        att = self.drop(torch.softmax(s, -1), "attention_probs", i, "attention_dropout", (B, H, T, T))
        y = torch.matmul(att, v).transpose(1, 2).reshape(B, T, C)
        x = x + self.drop(F.linear(y, p[pre + "self_attention/proj/weight"], p[pre + "self_attention/proj/bias"]),
                          "after_proj", i, "hidden_dropout", (B * T, C))
        a = F.layer_norm(x, (C,), p[pre + "post_attention_layernorm/weight"],
                         p[pre + "post_attention_layernorm/bias"], eps)
        h = F.gelu(F.linear(a, p[pre + "mlp/fc1/weight"], p[pre + "mlp/fc1/bias"]), approximate="tanh")
        return x + self.drop(F.linear(h, p[pre + "mlp/fc2/weight"], p[pre + "mlp/fc2/bias"]),
                             "after_fc2", i, "hidden_dropout", (B * T, C))

    def losses(self, tok, typ, lab, pad, order):
        """MLM and SOP losses (means) of one micro-batch."""
        cfg, p = self.cfg, self.p
        B, T = tok.shape
        C, eps = cfg.hidden_size, cfg.layernorm_epsilon
        wte = p["model/embedding/word_embeddings"]
        x = wte[tok] + p["model/embedding/position_embeddings"][:T][None] + p["model/embedding/tokentype_embeddings"][typ]
        x = self.drop(x, "embedding", -1, "hidden_dropout", (B * T, C))
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
    a = reference_loop.arguments(__doc__.split("\n")[0])
    torch.set_num_threads(2)
    try:
        ck = reference_loop.Checkpoint(a.checkpoint, "bert", "model/layers/0/mlp/fc1/weight")
        drop = reference_loop.dropout_of(a, ck.config)
    except g.InputError as e:
        print("bad input:", e)
        return 2
    model = BertReference(ck, torch.float64, drop)
    S = ck.config.seq_length

    def micro_loss(b):
        mlm, sop = model.losses(b[:, :S], b[:, S:2 * S], b[:, 2 * S:3 * S], b[:, 3 * S:4 * S], b[:, 4 * S])
        return mlm + sop, {"lm_loss": mlm.item(), "sop_loss": sop.item()}

    return reference_loop.run(a, ck, model.p, 4 * S + 1, micro_loss, parts=("lm_loss", "sop_loss"), dropout=drop)


if __name__ == "__main__":
    sys.exit(main())
