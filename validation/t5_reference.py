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
with grads.h5. The layer's math is torch_reference.py's. Exit status 0 pass, 1 tolerance exceeded, 2 bad input.

  t5_reference.py --checkpoint ck/iter_0000000/checkpoint.h5 --batches batches.h5 \\
                  --metrics metrics.csv --grads grads.h5
"""
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gpt_reference as g  # noqa: E402  (deck parsing, Config, schedule, AdamW, metrics, tolerances)
import reference_loop  # noqa: E402  (checkpoint reading, the training and comparison loop)
import torch_reference as tr  # noqa: E402  (the layer's math)


def decoder_shape(ck):
    """(decoder_seq_length, decoder layers) from the checkpoint's deck."""
    Sd = g._deck_get(ck.deck, "model", "decoder_seq_length", g._to_int)
    layers = g._deck_get(ck.deck, "model", "decoder_num_layers", g._to_int, 0)
    return Sd, layers if layers > 0 else ck.config.num_layers


class T5Reference(tr.Transformer):
    """T5 over torch_reference's layer (GPT-2's; the decoder's with cross-attention)."""

    def __init__(self, ckpt, dtype, drop):
        self.cfg, self.dec_layers = ckpt.config, decoder_shape(ckpt)[1]
        super().__init__({n: torch.tensor(v, dtype=dtype).requires_grad_(True) for n, v in ckpt.params.items()},
                         reference_loop.layer_spec(ckpt.config))
        self.p = self.params
        self.drop = drop  # reference_loop.Dropout: Trident's masks, where Trident applies them

    def loss(self, enc_tok, enc_pad, dec_in, dec_target):
        """Mean cross-entropy over the decoder targets of one micro-batch."""
        p = self.p
        wte, wpe = p["model/embedding/word_embeddings"], p["model/embedding/position_embeddings"]
        valid = enc_pad.bool()
        L, C = self.cfg.num_layers, wte.shape[1]
        x = wte[enc_tok] + wpe[:enc_tok.shape[1]][None]
        x = self.drop(x, "embedding", -1, "hidden_dropout", (x.shape[0] * x.shape[1], C))
        for i in range(L):
            x = self.layer(x, "model/encoder/layers/%d/" % i, i, causal=False, key_valid=valid)
        e = self.norm(x, "model/encoder/final_layernorm")
        y = wte[dec_in] + wpe[:dec_in.shape[1]][None]
        y = self.drop(y, "decoder_embedding", -1, "hidden_dropout", (y.shape[0] * y.shape[1], C))
        for i in range(self.dec_layers):  # Trident's layer index: the encoder's 0..L-1, then the decoder's L..
            y = self.layer(y, "model/decoder/layers/%d/" % i, L + i, causal=True, enc=e, enc_valid=valid)
        y = self.norm(y, "model/decoder/final_layernorm")
        logits = F.linear(y, wte, p["model/lm_head/bias"]).reshape(-1, wte.shape[0])
        return F.cross_entropy(logits, dec_target.reshape(-1), ignore_index=-1, reduction="mean")


def main(argv=None):
    a = reference_loop.arguments(__doc__.split("\n")[0], argv)
    torch.set_num_threads(2)
    try:
        ck = reference_loop.Checkpoint(a.checkpoint, "t5", "model/encoder/layers/0/mlp/fc1/weight")
        S, Sd = ck.config.seq_length, decoder_shape(ck)[0]
        drop = reference_loop.dropout_of(a, ck.config)
        model = T5Reference(ck, torch.float64, drop)
    except g.InputError as e:
        print("bad input:", e)
        return 2

    def micro_loss(b):
        return model.loss(b[:, :S], b[:, S:2 * S], b[:, 2 * S:2 * S + Sd], b[:, 2 * S + Sd:]), {}

    return reference_loop.run(a, ck, model.p, 2 * S + 2 * Sd, micro_loss, dropout=drop)


if __name__ == "__main__":
    sys.exit(main())
