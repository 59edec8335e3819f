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
the step-1 gradients with grads.h5. The layer's math is torch_reference.py's. Exit status 0 pass, 1 tolerance exceeded, 2 bad input.

  bert_reference.py --checkpoint ck/iter_0000000/checkpoint.h5 --batches batches.h5 \\
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


class BertReference(tr.Transformer):
    """BERT over torch_reference's layer (GPT-2's, bidirectional under the padding mask)."""

    def __init__(self, ckpt, dtype, drop):
        self.cfg, self.binary = ckpt.config, "model/binary_head/weight" in ckpt.params
        super().__init__({n: torch.tensor(v, dtype=dtype).requires_grad_(True) for n, v in ckpt.params.items()},
                         reference_loop.layer_spec(ckpt.config))
        self.p = self.params
        self.drop = drop  # reference_loop.Dropout: Trident's masks, where Trident applies them

    def losses(self, tok, typ, lab, pad, order):
        """MLM and SOP losses (means) of one micro-batch."""
        cfg, p = self.cfg, self.p
        B, T = tok.shape
        C = cfg.hidden_size
        wte = p["model/embedding/word_embeddings"]
        x = wte[tok] + p["model/embedding/position_embeddings"][:T][None] + p["model/embedding/tokentype_embeddings"][typ]
        x = self.drop(x, "embedding", -1, "hidden_dropout", (B * T, C))
        valid = pad.bool()
        for i in range(cfg.num_layers):
            x = self.layer(x, "model/layers/%d/" % i, i, causal=False, key_valid=valid)
        x = self.norm(x, "model/final_layernorm")
        h = self.norm(tr.gelu_tanh(self.linear(x, "model/lm_head/dense")), "model/lm_head/layernorm")
        logits = F.linear(h, wte, p["model/lm_head/bias"]).reshape(B * T, -1)
        mlm = F.cross_entropy(logits, lab.reshape(-1), ignore_index=-1, reduction="mean")
        sop = torch.zeros((), dtype=x.dtype)
        if self.binary:
            pooled = torch.tanh(self.linear(x[:, 0], "model/pooler/dense"))
            sop = F.cross_entropy(self.linear(pooled, "model/binary_head"), order)
        return mlm, sop


def main(argv=None):
    a = reference_loop.arguments(__doc__.split("\n")[0], argv)
    torch.set_num_threads(2)
    try:
        ck = reference_loop.Checkpoint(a.checkpoint, "bert", "model/layers/0/mlp/fc1/weight")
        drop = reference_loop.dropout_of(a, ck.config)
        model = BertReference(ck, torch.float64, drop)
    except g.InputError as e:
        print("bad input:", e)
        return 2
    S = ck.config.seq_length

    def micro_loss(b):
        mlm, sop = model.losses(b[:, :S], b[:, S:2 * S], b[:, 2 * S:3 * S], b[:, 3 * S:4 * S], b[:, 4 * S])
        return mlm + sop, {"lm_loss": mlm.item(), "sop_loss": sop.item()}

    return reference_loop.run(a, ck, model.p, 4 * S + 1, micro_loss, parts=("lm_loss", "sop_loss"), dropout=drop)


if __name__ == "__main__":
    sys.exit(main())
