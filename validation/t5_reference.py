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


def decoder_shape(ck):
    """(decoder_seq_length, decoder layers) from the checkpoint's deck."""
    Sd = g._deck_get(ck.deck, "model", "decoder_seq_length", g._to_int)
    layers = g._deck_get(ck.deck, "model", "decoder_num_layers", g._to_int, 0)
    return Sd, layers if layers > 0 else ck.config.num_layers


class T5Reference:
    def __init__(self, ckpt, dtype, drop):
        self.cfg, self.dec_layers = ckpt.config, decoder_shape(ckpt)[1]
        self.p = {n: torch.tensor(v, dtype=dtype).requires_grad_(True) for n, v in ckpt.params.items()}
        self.drop = drop  # reference_loop.Dropout: Trident's masks, where Trident applies them

    def _ln(self, x, name):
        C = x.shape[-1]
        return F.layer_norm(x, (C,), self.p[name + "/weight"], self.p[name + "/bias"], self.cfg.layernorm_epsilon)

    def _lin(self, x, name):
        return F.linear(x, self.p[name + "/weight"], self.p[name + "/bias"])

    def _attend(self, q, k, v, key_valid, causal, site, layer):
        """q (B, Tq, C), k / v (B, Tk, C) -> (B, Tq, C); `site` of the probabilities' dropout."""
        H, D = self.cfg.num_heads, self.cfg.head_dim
        B, Tq, C = q.shape
        Tk = k.shape[1]
        q, k, v = (t.reshape(B, -1, H, D).transpose(1, 2) for t in (q, k, v))
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(D)
        if key_valid is not None:
            s = s.masked_fill(~key_valid[:, None, None, :], float("-inf"))
        if causal:
            s = s.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool).triu(1), float("-inf"))
        att = self.drop(torch.softmax(s, -1), site, layer, "attention_dropout", (B, H, Tq, Tk))
        return torch.matmul(att, v).transpose(1, 2).reshape(B, Tq, C)

    def _layer(self, x, pre, index, key_valid, causal, enc=None, enc_valid=None):
        """One layer; `index` is Trident's (the encoder's 0..L-1, then the decoder's L..)."""
        B, T, C = x.shape
        drop = lambda y, site: self.drop(y, site, index, "hidden_dropout", (B * T, C))  # noqa: E731
        q, k, v = self._lin(self._ln(x, pre + "input_layernorm"), pre + "self_attention/qkv").split(C, -1)
        x = x + drop(self._lin(self._attend(q, k, v, key_valid, causal, "attention_probs", index),
                               pre + "self_attention/proj"), "after_proj")
        if enc is not None:
            q = self._lin(self._ln(x, pre + "cross_attention_layernorm"), pre + "cross_attention/q")
            k, v = self._lin(enc, pre + "cross_attention/kv").split(C, -1)
            x = x + drop(self._lin(self._attend(q, k, v, enc_valid, False, "cross_probs", index),
                                   pre + "cross_attention/proj"), "after_cross_proj")
        h = F.gelu(self._lin(self._ln(x, pre + "post_attention_layernorm"), pre + "mlp/fc1"), approximate="tanh")
        return x + drop(self._lin(h, pre + "mlp/fc2"), "after_fc2")

    def loss(self, enc_tok, enc_pad, dec_in, dec_target):
        """Mean cross-entropy over the decoder targets of one micro-batch."""
        p = self.p
        wte, wpe = p["model/embedding/word_embeddings"], p["model/embedding/position_embeddings"]
        valid = enc_pad.bool()
        L, C = self.cfg.num_layers, wte.shape[1]
        x = wte[enc_tok] + wpe[:enc_tok.shape[1]][None]
        x = self.drop(x, "embedding", -1, "hidden_dropout", (x.shape[0] * x.shape[1], C))
        for i in range(L):
            x = self._layer(x, "model/encoder/layers/%d/" % i, i, valid, False)
        e = self._ln(x, "model/encoder/final_layernorm")
        y = wte[dec_in] + wpe[:dec_in.shape[1]][None]
        y = self.drop(y, "decoder_embedding", -1, "hidden_dropout", (y.shape[0] * y.shape[1], C))
        for i in range(self.dec_layers):
            y = self._layer(y, "model/decoder/layers/%d/" % i, L + i, None, True, e, valid)
        y = self._ln(y, "model/decoder/final_layernorm")
        logits = F.linear(y, wte, p["model/lm_head/bias"]).reshape(-1, wte.shape[0])
        return F.cross_entropy(logits, dec_target.reshape(-1), ignore_index=-1, reduction="mean")


def main():
    a = reference_loop.arguments(__doc__.split("\n")[0])
    torch.set_num_threads(2)
    try:
        ck = reference_loop.Checkpoint(a.checkpoint, "t5", "model/encoder/layers/0/mlp/fc1/weight")
        S, Sd = ck.config.seq_length, decoder_shape(ck)[0]
        drop = reference_loop.dropout_of(a, ck.config)
    except g.InputError as e:
        print("bad input:", e)
        return 2
    model = T5Reference(ck, torch.float64, drop)

    def micro_loss(b):
        return model.loss(b[:, :S], b[:, S:2 * S], b[:, 2 * S:2 * S + Sd], b[:, 2 * S + Sd:]), {}

    return reference_loop.run(a, ck, model.p, 2 * S + 2 * Sd, micro_loss, dropout=drop)


if __name__ == "__main__":
    sys.exit(main())
