#!/usr/bin/python3
"""Self-test of validation/torch_reference.py and the references built on it (run with Debian's
/usr/bin/python3; no Trident binary involved; about a minute on 2 loaded cores).

  1. The refactor: gpt_reference.py (GPTReference on GPT-2's layer and the Llama-family variants,
     with and without a dropout tape; GPTReference16 in bf16 and fp16), bert_reference.py,
     t5_reference.py and hf_models.py (gpt2_logits, megatron_bert_outputs) give the losses, logits
     and gradients of their pre-refactor versions (commit PRE_REFACTOR, read with `git show`) on
     random parameters, to 1e-12 relative (each side in its own process).
  2. Grouped-query attention: num_query_groups = num_heads (and kv_channels = C / nh) given
     explicitly is the multi-head model bit for bit, and torch_reference.attention with nh groups
     is a plain per-head softmax(q k^T / sqrt(d)) v bit for bit; ng < nh equals the multi-head model
     whose key and value rows are repeated per query head (repeat_kv), losses and gradients (the
     repeated rows' gradients summed), in float64 and in the bf16 emulation; the attention equals
     a loop over the heads with group h // (nh / ng).
  3. The variants against a loop-level numpy forward written from the definitions (RMSNorm / LayerNorm,
     grouped-query attention with kv_channels != C / nh, per-head q / k norms before the rotary
     positions, SwiGLU, untied output, with and without biases): q / k RMSNorm with unit weights,
     with random weights, and q / k LayerNorm with weights and biases, to 1e-12.
  4. Deck and shapes: Config's derived values and errors, expected_shapes, key_bias_block, the
     BERT / T5 references' refusal of grouped-query decks.
  5. The 16-bit emulation at the variant settings (GQA, q / k RMSNorm, rotary, SwiGLU, untied, no
     biases; and a LayerNorm variant with biases): forward and backward run, the hooks are called
     at Trident's rounding points in order, every stored value is a 16-bit value, and the loss and
     gradients agree with float64 to the format's precision.
  6. `gpt_reference.py compare` end to end on fake runs of the variant model made by the reference
     itself: an fp32 "Trident" (the reference in float32) passes; a bf16 run (the emulation's own
     trajectory) passes with zero differences, the forward and update checks included.
  7. Mixture of experts (torch_reference's moe_* functions and Transformer.moe, gpt_reference's
     [moe] deck, objective and metrics): the routing of all score variants (softmax after / before
     the top-k, sigmoid with and without the expert bias) against a brute-force enumeration of the
     k-subsets on logits with ties; capacity drops under both policies on a hand-built example
     whose kept set is stated; the aux loss equals E coeff sum_e f_e P_e; an MoE layer with E = 1,
     k = 1, softmax is the dense MLP bit for bit (and a whole model: loss and gradients); autograd
     gradients of the MoE layer (router, experts, shared expert, input) against central finite
     differences in float64; the expert-bias update; the [moe] deck keys, their errors and the
     checkpoint names; `compare` end to end on fake MoE runs (with and without Trident's moe_*
     columns, and a wrong moe_aux_loss refused).

Exit status 0 when everything holds, 1 otherwise.
"""
import os
import sys

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import io  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
from contextlib import redirect_stderr, redirect_stdout  # noqa: E402
from fractions import Fraction  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# the last commit before torch_reference.py: the six copies of the layer the refactor replaced
PRE_REFACTOR = "75f67e051ac43e666f97efd62748df721af4ec8b"
REFERENCES = ("gpt_reference", "bert_reference", "t5_reference", "hf_models", "reference_loop")
V, C, NH, L, T, B, FFN = 40, 24, 3, 2, 8, 2, 20


# --------------------------------------------------------------------------------------
# Inputs common to both sides of the refactor check
# --------------------------------------------------------------------------------------

def deck_text(model, precision="fp32", extra=""):
    lines = ["[model]"] + ["%s = %s" % kv for kv in model.items()]
    lines += ["", "[train]", "micro_batch_size = %d" % B, "global_batch_size = %d" % (2 * B), "iters = 3", "",
              "[optim]", "lr = 1e-3", "min_lr = 1e-4", "warmup_iters = 1", "weight_decay = 0.1", "clip_grad = 1.0",
              "beta1 = 0.9", "beta2 = 0.95", "", "[precision]", "dtype = " + precision, ""]
    return "\n".join(lines) + extra


def base_model(**kw):
    m = dict(num_layers=L, hidden_size=C, num_heads=NH, ffn_hidden_size=FFN, seq_length=T,
             max_position_embeddings=T + 4, hidden_dropout=0.0, attention_dropout=0.0)
    m.update(kw)
    return m


# decks the pre-refactor reference reads too (no grouped-query keys)
GPT_DECKS = {
    "gpt2": base_model(),
    "llama": base_model(normalization="RMSNorm", norm_epsilon=1e-6, position_embedding_type="rope",
                        rotary_base=10000.0, use_rope_scaling="true", rope_scaling_factor=8.0,
                        rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                        rope_original_max_position_embeddings=100, swiglu="true", add_bias_linear="false",
                        untie_embeddings_and_output_weights="true"),
    "mix": base_model(position_embedding_type="rope", rotary_base=500.0, rotary_percent=0.5, add_bias_linear="false",
                      add_qkv_bias="true"),
    "nopos": base_model(normalization="RMSNorm", position_embedding_type="none", swiglu="true"),
}


def gpt_config(g, model, precision="fp32"):
    cp = g.parse_deck(deck_text(model, precision))
    learned = model.get("position_embedding_type", "learned_absolute") == "learned_absolute"
    swiglu = model.get("swiglu", "false") == "true"
    shapes = {"model/embedding/word_embeddings": (V, C),
              "model/layers/0/mlp/fc1/weight": ((2 if swiglu else 1) * model["ffn_hidden_size"], C)}
    if learned:
        shapes["model/embedding/position_embeddings"] = (model["max_position_embeddings"], C)
    return g.Config(cp, shapes)


def random_params(shapes, seed):
    """Weights of std 1/sqrt(fan-in) (q and k of order 1: non-trivial attention), norm weights
    near 1, biases of 0.1, float32 values (as a checkpoint holds)."""
    rng = np.random.default_rng(seed)
    out = {}
    for n, shp in shapes.items():
        if "norm" in n and n.endswith("/weight"):
            v = 1.0 + 0.1 * rng.standard_normal(shp)
        elif n.endswith("/bias") or len(shp) == 1:
            v = 0.1 * rng.standard_normal(shp)
        else:
            v = rng.standard_normal(shp) / math.sqrt(shp[1])
        out[n] = v.astype(np.float32).astype(np.float64)
    return out


class FakeTape:
    """Stands in for gpt_reference.DropoutTape: a fresh random mask per call, the calls recorded."""

    def __init__(self, seed):
        self.rng, self.iteration, self.calls, self.pos, self.n, self.masks = np.random.default_rng(seed), 1, [], 0, 0, []

    def next(self, site, layer, p, shape):
        self.calls.append("%s/%d/%s" % (site, layer, "x".join(map(str, shape))))
        return (self.rng.random(tuple(shape)) >= p).astype(np.float64)


def windows(seed, rows=B, width=T + 1):
    return np.random.default_rng(seed).integers(0, V, size=(rows, width))


def bert_params(seed):
    s = {"model/embedding/word_embeddings": (V, C), "model/embedding/position_embeddings": (T, C),
         "model/embedding/tokentype_embeddings": (2, C)}
    s.update(layer_shapes("model/layers/%d/", L))
    s.update({"model/final_layernorm/weight": (C,), "model/final_layernorm/bias": (C,),
              "model/lm_head/dense/weight": (C, C), "model/lm_head/dense/bias": (C,),
              "model/lm_head/layernorm/weight": (C,), "model/lm_head/layernorm/bias": (C,), "model/lm_head/bias": (V,),
              "model/pooler/dense/weight": (C, C), "model/pooler/dense/bias": (C,),
              "model/binary_head/weight": (2, C), "model/binary_head/bias": (2,)})
    return random_params(s, seed)


def layer_shapes(prefix, layers, cross=False):
    s = {}
    for i in range(layers):
        p = prefix % i
        for n in ("input_layernorm", "post_attention_layernorm") + (("cross_attention_layernorm",) if cross else ()):
            s[p + n + "/weight"], s[p + n + "/bias"] = (C,), (C,)
        lin = [("self_attention/qkv", 3 * C, C), ("self_attention/proj", C, C), ("mlp/fc1", FFN, C),
               ("mlp/fc2", C, FFN)]
        if cross:
            lin += [("cross_attention/q", C, C), ("cross_attention/kv", 2 * C, C), ("cross_attention/proj", C, C)]
        for n, r, c in lin:
            s[p + n + "/weight"], s[p + n + "/bias"] = (r, c), (r,)
    return s


def t5_params(seed):
    s = {"model/embedding/word_embeddings": (V, C), "model/embedding/position_embeddings": (T, C)}
    s.update(layer_shapes("model/encoder/layers/%d/", L))
    s.update(layer_shapes("model/decoder/layers/%d/", L, cross=True))
    for n in ("model/encoder/final_layernorm", "model/decoder/final_layernorm"):
        s[n + "/weight"], s[n + "/bias"] = (C,), (C,)
    s["model/lm_head/bias"] = (V,)
    return random_params(s, seed)


def hf_gpt2(seed):
    s = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (T, C), "transformer.ln_f.weight": (C,),
         "transformer.ln_f.bias": (C,)}
    for i in range(L):
        b = "transformer.h.%d." % i
        s.update({b + "ln_1.weight": (C,), b + "ln_1.bias": (C,), b + "ln_2.weight": (C,), b + "ln_2.bias": (C,),
                  b + "attn.c_attn.weight": (C, 3 * C), b + "attn.c_attn.bias": (3 * C,),
                  b + "attn.c_proj.weight": (C, C), b + "attn.c_proj.bias": (C,),
                  b + "mlp.c_fc.weight": (C, FFN), b + "mlp.c_fc.bias": (FFN,),
                  b + "mlp.c_proj.weight": (FFN, C), b + "mlp.c_proj.bias": (C,)})
    return {"n_head": NH, "n_layer": L, "n_embd": C, "layer_norm_epsilon": 1e-5}, random_params(s, seed)


def hf_bert(seed):
    s = {"bert.embeddings.word_embeddings.weight": (V, C), "bert.embeddings.position_embeddings.weight": (T, C),
         "bert.embeddings.token_type_embeddings.weight": (2, C), "bert.encoder.ln.weight": (C,),
         "bert.encoder.ln.bias": (C,), "cls.predictions.transform.dense.weight": (C, C),
         "cls.predictions.transform.dense.bias": (C,), "cls.predictions.transform.LayerNorm.weight": (C,),
         "cls.predictions.transform.LayerNorm.bias": (C,), "cls.predictions.bias": (V,),
         "bert.pooler.dense.weight": (C, C), "bert.pooler.dense.bias": (C,), "cls.seq_relationship.weight": (2, C),
         "cls.seq_relationship.bias": (2,)}
    for i in range(L):
        b = "bert.encoder.layer.%d." % i
        for n, shp in (("attention.ln", None), ("ln", None), ("attention.self.query", (C, C)),
                       ("attention.self.key", (C, C)), ("attention.self.value", (C, C)),
                       ("attention.output.dense", (C, C)), ("intermediate.dense", (FFN, C)),
                       ("output.dense", (C, FFN))):
            s[b + n + ".weight"] = shp or (C,)
            s[b + n + ".bias"] = (shp[0],) if shp else (C,)
    return {"num_attention_heads": NH, "num_hidden_layers": L, "layer_norm_eps": 1e-12}, random_params(s, seed)


def bert_inputs(seed):
    rng = np.random.default_rng(seed)
    tok = rng.integers(0, V, size=(B, T))
    typ = (np.arange(T)[None, :] >= rng.integers(2, T - 2, size=(B, 1))).astype(np.int64)
    pad = (np.arange(T)[None, :] < np.array([[T], [T - 3]])).astype(np.int64)
    lab = np.where(rng.random((B, T)) < 0.4, rng.integers(0, V, size=(B, T)), -1)
    lab[:, 1] = 5
    return tok, typ, lab, pad, np.array([0, 1])


def t5_inputs(seed):
    rng = np.random.default_rng(seed)
    Sd = 5
    enc = rng.integers(0, V, size=(B, T))
    enc_pad = (np.arange(T)[None, :] < np.array([[T], [T - 2]])).astype(np.int64)
    dec_in = rng.integers(0, V, size=(B, Sd))
    tgt = rng.integers(0, V, size=(B, Sd))
    tgt[1, -1] = -1
    return enc, enc_pad, dec_in, tgt


# --------------------------------------------------------------------------------------
# 1. The refactor: both sides compute these, each in its own process
# --------------------------------------------------------------------------------------

def side_outputs(src):
    """{name: array} of the references imported from directory src."""
    sys.path.insert(0, src)
    import torch
    import gpt_reference as g
    import bert_reference
    import t5_reference
    import hf_models
    import reference_loop
    torch.set_num_threads(1)
    out = {}

    def grads(case, loss, params):
        loss.backward()
        out[case + "/loss"] = np.array(float(loss))
        for n, t in params.items():
            out[case + "/grad/" + n] = t.grad.detach().numpy().copy()

    w = torch.as_tensor(windows(1))
    for name, model in GPT_DECKS.items():
        for dropout in (False, True):
            m = dict(model, hidden_dropout=0.1, attention_dropout=0.1) if dropout else model
            cfg = gpt_config(g, m)
            ref = g.GPTReference(cfg, random_params(g.expected_shapes(cfg), 11))
            if dropout:
                ref.tape = FakeTape(5)
            case = "gpt/%s/%s" % (name, "dropout" if dropout else "plain")
            grads(case, ref.loss_sum(w), ref.params)
            if dropout:
                out[case + "/tape"] = np.array(ref.tape.calls)
            else:
                with torch.no_grad():
                    out[case + "/logits"] = ref.logits(w[:, :-1]).numpy()
    for fmt, dropout in (("bf16", True), ("fp16", False)):
        m = dict(GPT_DECKS["gpt2"], hidden_dropout=0.1, attention_dropout=0.1) if dropout else GPT_DECKS["gpt2"]
        cfg = gpt_config(g, m, fmt)
        p = {n: g.round16(torch.from_numpy(v), fmt).numpy() for n, v in random_params(g.expected_shapes(cfg), 12).items()}
        ref = g.GPTReference16(cfg, p, fmt)
        if dropout:
            ref.tape = FakeTape(6)
        grads("gpt16/%s" % fmt, ref.loss_sum(w), ref.params)

    for dropout in (False, True):
        m = dict(base_model(max_position_embeddings=T), **({"hidden_dropout": 0.1, "attention_dropout": 0.1}
                                                           if dropout else {}))
        params = bert_params(21)
        cfg = g.Config(g.parse_deck(deck_text(m)), {k: params[k].shape for k in (
            "model/embedding/word_embeddings", "model/embedding/position_embeddings", "model/layers/0/mlp/fc1/weight")})
        ck = types.SimpleNamespace(config=cfg, params=params)
        tape = FakeTape(7) if dropout else None
        ref = bert_reference.BertReference(ck, torch.float64, reference_loop.Dropout(tape, cfg))
        tok, typ, lab, pad, order = (torch.as_tensor(a) for a in bert_inputs(3))
        mlm, sop = ref.losses(tok, typ, lab, pad, order)
        case = "bert/%s" % ("dropout" if dropout else "plain")
        out[case + "/mlm"] = np.array(float(mlm))
        grads(case, mlm + sop, ref.p)
        if tape:
            out[case + "/tape"] = np.array(tape.calls)

        m = dict(base_model(max_position_embeddings=T, decoder_seq_length=5, decoder_num_layers=L),
                 **({"hidden_dropout": 0.1, "attention_dropout": 0.1} if dropout else {}))
        params = t5_params(31)
        deck = g.parse_deck(deck_text(m))
        cfg = g.Config(deck, {"model/embedding/word_embeddings": (V, C), "model/embedding/position_embeddings": (T, C),
                              "model/layers/0/mlp/fc1/weight": (FFN, C)})
        ck = types.SimpleNamespace(config=cfg, params=params, deck=deck)
        tape = FakeTape(8) if dropout else None
        ref = t5_reference.T5Reference(ck, torch.float64, reference_loop.Dropout(tape, cfg))
        case = "t5/%s" % ("dropout" if dropout else "plain")
        grads(case, ref.loss(*(torch.as_tensor(a) for a in t5_inputs(4))), ref.p)
        if tape:
            out[case + "/tape"] = np.array(tape.calls)

    with torch.no_grad():
        hcfg, hw = hf_gpt2(41)
        out["hf/gpt2/logits"] = hf_models.gpt2_logits(hcfg, {k: torch.tensor(v) for k, v in hw.items()},
                                                      torch.as_tensor(windows(2)[:, :T])).numpy()
        hcfg, hw = hf_bert(42)
        tok, typ, _, pad, _ = (torch.as_tensor(a) for a in bert_inputs(5))
        logits, sop = hf_models.megatron_bert_outputs(hcfg, {k: torch.tensor(v) for k, v in hw.items()}, tok, typ, pad)
        out["hf/bert/logits"], out["hf/bert/sop"] = logits.numpy(), sop.numpy()
    return out


def check_refactor(check):
    tmp = tempfile.mkdtemp(prefix="torch_reference_selftest_")
    try:
        old = os.path.join(tmp, "old")
        os.makedirs(old)
        for m in REFERENCES:
            r = subprocess.run(["git", "-C", HERE, "show", "%s:validation/%s.py" % (PRE_REFACTOR, m)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            if r.returncode != 0:  # a copy without the history (a tarball): nothing to compare with
                print("note: refactor check not run: the pre-refactor sources (git show %s) are unavailable: %s"
                      % (PRE_REFACTOR[:10], r.stderr.decode().strip()))
                return
            with open(os.path.join(old, m + ".py"), "wb") as fh:
                fh.write(r.stdout)
        res = {}
        for side, src in (("old", old), ("new", HERE)):
            path = os.path.join(tmp, side + ".npz")
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--side", src, path],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if r.returncode != 0:
                check("refactor: the %s references run" % side, False, r.stdout.decode()[-2000:])
                return
            with np.load(path) as z:
                res[side] = {k: z[k] for k in z.files}
        o, n = res["old"], res["new"]
        check("refactor: the same outputs on both sides", set(o) == set(n),
              "only old: %s, only new: %s" % (sorted(set(o) - set(n))[:5], sorted(set(n) - set(o))[:5]))
        groups = {}
        for k in sorted(set(o) & set(n)):
            if o[k].dtype.kind == "U":
                check("refactor: dropout calls of %s" % k, o[k].shape == n[k].shape and bool((o[k] == n[k]).all()),
                      "%d vs %d calls" % (o[k].size, n[k].size))
                continue
            a, b = o[k].astype(np.float64), n[k].astype(np.float64)
            den = max(float(np.linalg.norm(a)), 1e-300)
            err = float(np.linalg.norm(a - b)) / den if a.shape == b.shape else float("inf")
            g = "/".join(k.split("/")[:3]) if not k.startswith("gpt16") else "/".join(k.split("/")[:2])
            worst, bitwise, count = groups.get(g, (0.0, True, 0))
            groups[g] = (max(worst, err), bitwise and a.shape == b.shape and bool((a == b).all()), count + 1)
        for g, (worst, bitwise, count) in groups.items():
            check("refactor: %s (%d arrays) against the pre-refactor code" % (g, count), worst <= 1e-12,
                  "worst relative L2 difference %.1e%s" % (worst, ", bitwise equal" if bitwise else ""))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------
# 2 - 6: the new code alone
# --------------------------------------------------------------------------------------

QWEN = base_model(normalization="RMSNorm", norm_epsilon=1e-6, position_embedding_type="rope", rotary_base=1000.0,
                  swiglu="true", add_bias_linear="false", untie_embeddings_and_output_weights="true",
                  num_heads=4, num_query_groups=2, kv_channels=8, qk_layernorm="true")
QWEN_LN = base_model(position_embedding_type="rope", rotary_base=1000.0, rotary_percent=0.5, num_heads=4,
                     num_query_groups=2, kv_channels=12, qk_layernorm="true", add_bias_linear="true")
GQA_LEARNED = base_model(num_heads=4, num_query_groups=2, kv_channels=5)


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    d = max(float(np.linalg.norm(b)), 1e-300)
    return float(np.linalg.norm(a - b)) / d


def loss_and_grads(model, w):
    for t in model.params.values():
        t.grad = None
    loss = model.loss_sum(w)
    loss.backward()
    return float(loss), {n: t.grad.detach().numpy().copy() for n, t in model.params.items()}


def repeat_kv_params(cfg, p):
    """The multi-head parameters equivalent to grouped-query ones: qkv's key and value rows of
    group g repeated for each of its nh / ng query heads (weights and bias)."""
    nh, ng, d = cfg.num_heads, cfg.num_query_groups, cfg.head_dim
    rep = nh // ng
    rows = list(range(nh * d))
    for base in (nh * d, (nh + ng) * d):
        for h in range(nh):
            g0 = base + (h // rep) * d
            rows += list(range(g0, g0 + d))
    out = dict(p)
    for i in range(cfg.num_layers):
        for s in ("weight", "bias"):
            n = "model/layers/%d/self_attention/qkv/%s" % (i, s)
            if n in p:
                out[n] = p[n][rows]
    return out, rows


def fold_repeated(cfg, grads_mha, rows):
    """The multi-head model's gradients mapped back to the grouped-query parameters: the
    gradients of repeated rows summed."""
    out = dict(grads_mha)
    for i in range(cfg.num_layers):
        for s in ("weight", "bias"):
            n = "model/layers/%d/self_attention/qkv/%s" % (i, s)
            if n in grads_mha:
                g = np.zeros((max(rows) + 1,) + grads_mha[n].shape[1:])
                np.add.at(g, rows, grads_mha[n])
                out[n] = g
    return out


def check_gqa(check, g, tr, torch):
    w = torch.as_tensor(windows(1))
    # ng = nh given explicitly: the multi-head model, bit for bit
    for name in ("gpt2", "llama"):
        cfg_a = gpt_config(g, GPT_DECKS[name])
        cfg_b = gpt_config(g, dict(GPT_DECKS[name], num_query_groups=NH, kv_channels=C // NH))
        p = random_params(g.expected_shapes(cfg_a), 13)
        la, ga = loss_and_grads(g.GPTReference(cfg_a, p), w)
        lb, gb = loss_and_grads(g.GPTReference(cfg_b, p), w)
        check("gqa: %s with num_query_groups = num_heads, kv_channels = C / nh given is the multi-head model" % name,
              la == lb and all((ga[n] == gb[n]).all() for n in ga), "loss %r vs %r" % (la, lb))
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 6, 5, generator=gen, dtype=torch.float64) for _ in range(3))
    valid = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    for causal, kv in ((True, None), (False, valid), (True, valid)):
        s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(5))
        if kv is not None:
            s = s.masked_fill(~kv[:, None, None, :], float("-inf"))
        if causal:
            s = s.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
        plain = torch.matmul(torch.softmax(s, dim=-1), v)
        got = tr.attention(q, k, v, causal=causal, key_valid=kv)
        check("gqa: attention with nh groups is plain multi-head attention (causal %s, key mask %s)"
              % (causal, kv is not None), bool((got == plain).all()), "max difference %.1e" % float((got - plain).abs().max()))
    # ng < nh: each query head with its group's keys and values
    kg, vg = k[:, :2], v[:, :2]
    got = tr.attention(q, kg, vg, causal=True)
    loop = []
    for h in range(4):
        s = torch.matmul(q[:, h], kg[:, h // 2].transpose(-1, -2)) / math.sqrt(5)
        s = s.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
        loop.append(torch.matmul(torch.softmax(s, dim=-1), vg[:, h // 2]))
    check("gqa: attention with 2 groups of 4 heads is a loop over heads with group h // 2",
          rel(got.numpy(), torch.stack(loop, 1).numpy()) <= 1e-14, "relative %.1e" % rel(got.numpy(), torch.stack(loop, 1).numpy()))
    # the whole model against the repeat_kv multi-head model, float64 and bf16
    for name, model in (("learned positions, biases", GQA_LEARNED), ("Qwen 3 layer", QWEN)):
        cfg = gpt_config(g, model)
        mha = gpt_config(g, dict(model, num_query_groups=cfg.num_heads))
        p = random_params(g.expected_shapes(cfg), 14)
        pm, rows = repeat_kv_params(cfg, p)
        for fmt in (None, "bf16"):
            if fmt is None:
                a, b = g.GPTReference(cfg, p), g.GPTReference(mha, pm)
            else:
                p16 = {n: g.round16(torch.from_numpy(x), fmt).numpy() for n, x in p.items()}
                pm16, _ = repeat_kv_params(cfg, p16)
                a, b = g.GPTReference16(cfg, p16, fmt), g.GPTReference16(mha, pm16, fmt)
            la, ga = loss_and_grads(a, w)
            lb, gb = loss_and_grads(b, w)
            gb = fold_repeated(cfg, gb, rows)
            worst = max(rel(ga[n], gb[n]) for n in ga)
            # bf16: the forward is the same; the gradients agree to bf16 precision only, as the expanded
            # model rounds each head's key / value gradient before the qkv GEMM and the grouped one
            # (as Trident) their sum over the group's heads
            tol = 1e-12 if fmt is None else 2e-2
            check("gqa: %s, ng = 2 of nh = 4 (%s) equals the repeat_kv multi-head model%s"
                  % (name, fmt or "float64", "" if fmt is None else " (loss bit for bit, gradients to bf16 precision)"),
                  la == lb if fmt else abs(la - lb) <= 1e-13 * abs(lb) and worst <= tol,
                  "loss %.1e, gradients %.1e relative" % (abs(la - lb) / abs(lb), worst))


def naive_loss(cfg, p, wins):
    """Loop-level numpy forward of the GPT variants from their definitions, mean cross-entropy."""
    nh, ng, d = cfg.num_heads, cfg.num_query_groups, cfg.head_dim
    rep, eps, rot = nh // ng, cfg.layernorm_epsilon, cfg.rotary_dim
    Fh = cfg.ffn_hidden_size

    def nrm(x, name):
        wt = p[name + "/weight"]
        if cfg.normalization == "RMSNorm":
            return x / math.sqrt(float(np.mean(x * x)) + eps) * wt
        mu = float(np.mean(x))
        var = float(np.mean((x - mu) ** 2))
        return (x - mu) / math.sqrt(var + eps) * wt + p[name + "/bias"]

    def lin(x, name):
        y = p[name + "/weight"] @ x
        return y + p[name + "/bias"] if name + "/bias" in p else y

    def turn(x, t):
        y = x.copy()
        for j in range(rot // 2):
            ang = t * cfg.rotary_base ** (-2.0 * j / rot)
            a, b = x[j], x[j + rot // 2]
            y[j], y[j + rot // 2] = a * math.cos(ang) - b * math.sin(ang), b * math.cos(ang) + a * math.sin(ang)
        return y

    total, count = 0.0, 0
    for win in wins:
        inp, tgt = win[:-1], win[1:]
        Tn = len(inp)
        x = [p["model/embedding/word_embeddings"][inp[t]].copy() for t in range(Tn)]
        if cfg.learned_positions:
            x = [x[t] + p["model/embedding/position_embeddings"][t] for t in range(Tn)]
        for i in range(cfg.num_layers):
            pre = "model/layers/%d/" % i
            Q, K, Vv = [], [], []
            for t in range(Tn):
                qkv = lin(nrm(x[t], pre + "input_layernorm"), pre + "self_attention/qkv")
                qs = [qkv[h * d:(h + 1) * d] for h in range(nh)]
                ks = [qkv[nh * d + g * d:nh * d + (g + 1) * d] for g in range(ng)]
                Vv.append([qkv[(nh + ng) * d + g * d:(nh + ng) * d + (g + 1) * d] for g in range(ng)])
                if cfg.qk_layernorm:
                    qs = [nrm(q, pre + "self_attention/q_layernorm") for q in qs]
                    ks = [nrm(k, pre + "self_attention/k_layernorm") for k in ks]
                if cfg.position_embedding_type == "rope":
                    qs, ks = [turn(q, t) for q in qs], [turn(k, t) for k in ks]
                Q.append(qs)
                K.append(ks)
            for t in range(Tn):
                y = []
                for h in range(nh):
                    g_ = h // rep
                    s = np.array([Q[t][h] @ K[j][g_] / math.sqrt(d) for j in range(t + 1)])
                    e = np.exp(s - s.max())
                    att = e / e.sum()
                    y.append(sum(att[j] * Vv[j][g_] for j in range(t + 1)))
                x[t] = x[t] + lin(np.concatenate(y), pre + "self_attention/proj")
            for t in range(Tn):
                h1 = lin(nrm(x[t], pre + "post_attention_layernorm"), pre + "mlp/fc1")
                if cfg.swiglu:
                    gate, up = h1[:Fh], h1[Fh:]
                    act = gate / (1.0 + np.exp(-gate)) * up
                else:
                    act = 0.5 * h1 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h1 + 0.044715 * h1 ** 3)))
                x[t] = x[t] + lin(act, pre + "mlp/fc2")
        wout = p["model/output_layer/weight"] if cfg.untied else p["model/embedding/word_embeddings"]
        for t in range(Tn):
            z = wout @ nrm(x[t], "model/final_layernorm")
            z = z - z.max()
            total += math.log(np.exp(z).sum()) - z[tgt[t]]
            count += 1
    return total / count


def check_against_loops(check, g, torch):
    wins = windows(9)
    for label, model, unit in (("q / k RMSNorm with unit weights, GQA, rope, SwiGLU, untied, no biases", QWEN, True),
                               ("the same with random q / k norm weights", QWEN, False),
                               ("q / k LayerNorm (weights, biases), partial rope, GQA, kv_channels 12, biases",
                                QWEN_LN, False),
                               ("GQA with learned positions, kv_channels 5 (nh d = 20 != C)", GQA_LEARNED, False)):
        cfg = gpt_config(g, model)
        p = random_params(g.expected_shapes(cfg), 15)
        if unit:
            for n in p:
                if "q_layernorm/weight" in n or "k_layernorm/weight" in n:
                    p[n] = np.ones_like(p[n])
        mine = float(g.GPTReference(cfg, p).loss_sum(torch.as_tensor(wins))) / (wins.shape[0] * (wins.shape[1] - 1))
        loop = naive_loss(cfg, p, wins)
        check("loops: %s" % label, abs(mine - loop) <= 1e-12 * abs(loop),
              "reference %.15g, loops %.15g (relative %.1e)" % (mine, loop, abs(mine - loop) / abs(loop)))


def check_deck(check, g, reference_loop):
    cfg = gpt_config(g, QWEN)
    check("deck: Qwen 3 keys parsed", (cfg.num_heads, cfg.num_query_groups, cfg.head_dim, cfg.qk_layernorm,
                                       cfg.rotary_dim) == (4, 2, 8, True, 8),
          (cfg.num_heads, cfg.num_query_groups, cfg.head_dim, cfg.qk_layernorm))
    s = g.expected_shapes(cfg)
    want = {"model/layers/0/self_attention/qkv/weight": ((4 + 4) * 8, C),
            "model/layers/0/self_attention/proj/weight": (C, 32),
            "model/layers/1/self_attention/q_layernorm/weight": (8,),
            "model/layers/1/self_attention/k_layernorm/weight": (8,),
            "model/output_layer/weight": (V, C)}
    check("deck: Qwen 3 shapes", all(s.get(n) == v for n, v in want.items())
          and "model/layers/0/self_attention/q_layernorm/bias" not in s
          and "model/layers/0/self_attention/qkv/bias" not in s, {n: s.get(n) for n in want})
    s = g.expected_shapes(gpt_config(g, QWEN_LN))
    check("deck: q / k LayerNorm has weight and bias of kv_channels",
          s.get("model/layers/0/self_attention/q_layernorm/bias") == (12,)
          and s.get("model/layers/0/self_attention/qkv/bias") == (96,), s.get("model/layers/0/self_attention/qkv/bias"))
    resolved = gpt_config(g, dict(GPT_DECKS["gpt2"], num_query_groups=0, kv_channels=0))
    check("deck: 0 derives num_heads groups of C / nh", (resolved.num_query_groups, resolved.head_dim) == (NH, C // NH))
    for bad, why in ((dict(num_heads=4, num_query_groups=3), "nh % ng"),
                     (dict(num_heads=5), "C % nh without kv_channels")):
        try:
            gpt_config(g, base_model(**bad))
            ok = False
        except g.InputError:
            ok = True
        check("deck: refused (%s)" % why, ok)
    check("deck: C % nh with kv_channels accepted", gpt_config(g, base_model(num_heads=5, kv_channels=4)).head_dim == 4)
    kb = g.key_bias_block(gpt_config(g, GQA_LEARNED))
    ix = kb.get("model/layers/0/self_attention/qkv/bias")
    check("deck: key_bias_block of GQA is the ng d rows after the nh d query rows",
          ix is not None and list(ix) == list(range(20, 30)), ix)
    check("deck: key_bias_block of GPT-2 is C .. 2C",
          list(g.key_bias_block(gpt_config(g, GPT_DECKS["gpt2"]))["model/layers/1/self_attention/qkv/bias"])
          == list(range(C, 2 * C)))
    check("deck: no key_bias_block under rope, q / k norms or without a qkv bias",
          not g.key_bias_block(gpt_config(g, QWEN_LN)) and not g.key_bias_block(gpt_config(g, GPT_DECKS["llama"]))
          and not g.key_bias_block(gpt_config(g, dict(GQA_LEARNED, qk_layernorm="true"))))
    try:
        reference_loop.layer_spec(gpt_config(g, GQA_LEARNED))
        ok = False
    except g.InputError:
        ok = True
    check("deck: the BERT / T5 layer refuses grouped-query attention", ok)


def check_16bit(check, g, torch):
    w = torch.as_tensor(windows(1, rows=4))
    for name, model in (("Qwen 3 layer", QWEN), ("LayerNorm variant with biases", QWEN_LN)):
        cfg = gpt_config(g, model)
        p = random_params(g.expected_shapes(cfg), 16)
        for fmt, tol_loss, tol_grad in (("bf16", 1e-2, 5e-2), ("fp16", 2e-3, 1e-2)):
            p16 = {n: g.round16(torch.from_numpy(x), fmt).numpy() for n, x in p.items()}
            ref64 = g.GPTReference(cfg, p16)
            l64, g64 = loss_and_grads(ref64, w)
            calls = []

            class Recorder(g.GPTReference16):
                def store(self, x):
                    y = super().store(x)
                    calls.append(("store", sys._getframe(1).f_code.co_name, x.shape[-1]))
                    stored.append(y)
                    return y

                def store_both(self, x):
                    calls.append(("store_both", sys._getframe(1).f_code.co_name, x.shape[-1]))
                    return super().store_both(x)

                def grad_store(self, x):
                    calls.append(("grad_store", sys._getframe(1).f_code.co_name, x.shape[-1]))
                    return super().grad_store(x)

            stored = []
            ref16 = Recorder(cfg, p16, fmt)
            l16, g16 = loss_and_grads(ref16, w)
            gl = math.sqrt(sum(float((x ** 2).sum()) for x in g64.values()))
            glob = math.sqrt(sum(float(((g16[n] - g64[n]) ** 2).sum()) for n in g64)) / gl
            worst = max(rel(g16[n], g64[n]) for n in g64 if float(np.linalg.norm(g64[n])) > 1e-3 * gl)
            check("16-bit: %s in %s against float64 (loss within %g, gradients within %g)" % (name, fmt, tol_loss, tol_grad),
                  abs(l16 - l64) <= tol_loss * abs(l64) and glob <= tol_grad,
                  "loss %.2e relative, gradients %.2e globally, worst tensor %.2e"
                  % (abs(l16 - l64) / abs(l64), glob, worst))
            check("16-bit: %s in %s: every stored value is a %s value" % (name, fmt, fmt),
                  all(bool((s == g.round16(s, fmt)).all()) for s in stored), "%d stores" % len(stored))
            H, G, D = cfg.num_heads, cfg.num_query_groups, cfg.head_dim
            F1 = 2 * cfg.ffn_hidden_size if cfg.swiglu else cfg.ffn_hidden_size
            layer = [("store", "layer", C), ("grad_store", "linear", (H + 2 * G) * D), ("store", "self_attention",
                                                                                      (H + 2 * G) * D),
                     ("store", "self_attention", D), ("store", "self_attention", D),   # q norm, k norm
                     ("store", "self_attention", D), ("store", "self_attention", D),   # rope q, rope k
                     ("grad_store", "attention", T), ("store_both", "attention", D),   # scores, context
                     ("grad_store", "linear", C), ("store", "layer", C),               # proj, post norm
                     ("grad_store", "linear", F1), ("store", "mlp", F1), ("store", "mlp", cfg.ffn_hidden_size),
                     ("grad_store", "linear", C)]                                      # fc1, its store, act, fc2
            want = layer * cfg.num_layers + [("store", "_hidden", C), ("grad_store", "loss_sum", V)]
            check("16-bit: %s in %s: the rounding points in order (norms, qkv, q / k norms, rope, scores, context, "
                  "proj, fc1, activation, fc2, final norm, logits)" % (name, fmt), calls == want,
                  "%d hook calls" % len(calls) if calls == want else "first difference at call %s of %d: %s"
                  % (next((i for i, (a, b) in enumerate(zip(calls, want)) if a != b), min(len(calls), len(want))),
                     len(calls), calls))


def check_compare_end_to_end(check, g, torch):
    import h5py
    tmp = tempfile.mkdtemp(prefix="torch_reference_selftest_run_")
    try:
        for precision in ("fp32", "bf16"):
            d = os.path.join(tmp, precision)
            os.makedirs(os.path.join(d, "params"))
            deck = deck_text(QWEN, precision)
            cfg = gpt_config(g, QWEN, precision)
            p = random_params(g.expected_shapes(cfg), 17)
            if precision == "bf16":
                p = {n: g.round16(torch.from_numpy(x), "bf16").numpy() for n, x in p.items()}
            ck_path = os.path.join(d, "ck.h5")
            with h5py.File(ck_path, "w") as f:
                f.attrs.update({"format": "trident.checkpoint", "format_version": 1, "model": "gpt", "iteration": 0,
                                "consumed_samples": 0, "deck": deck})
                for n, x in p.items():
                    f[n] = x.astype(np.float32)
                    if precision == "bf16":
                        f["optimizer/master/" + n] = x.astype(np.float32)
            batches = [windows(100 + i, rows=cfg.global_batch_size) for i in range(3)]
            with h5py.File(os.path.join(d, "batches.h5"), "w") as f:
                for i, b_ in enumerate(batches, 1):
                    f[g.batch_name(i)] = b_.astype(np.int32)
            # the fake "Trident": the reference in float32 (fp32), the emulation's own trajectory (bf16)
            ck = g.Checkpoint(ck_path)
            trainer = g.Trainer(ck, torch.float32) if precision == "fp32" else g.Trainer(ck, torch.float64, None, "bf16")
            rows = []
            for i, b_ in enumerate(batches, 1):
                res = trainer.step(b_, keep_grads=(i == 1))
                if i == 1:
                    with h5py.File(os.path.join(d, "grads.h5"), "w") as f:
                        f.attrs["iteration"] = 1
                        for n, x in res["grads"].items():
                            f[n] = x.astype(np.float32)
                with h5py.File(os.path.join(d, "params", "iter_%07d.h5" % i), "w") as f:
                    for n, t in trainer.model.params.items():
                        f[n] = t.detach().numpy().astype(np.float32)
                rows.append("%d,%d,%.17g,%.17g,%.17g,1,0,1,1,0,0" % (i, i * cfg.global_batch_size, res["loss"], res["lr"],
                                                                   res["grad_norm"]))
            with open(os.path.join(d, "metrics.csv"), "w") as fh:
                fh.write(",".join(g.METRICS_COLUMNS) + "\n" + "\n".join(rows) + "\n")
            argv = ["compare", "--checkpoint", ck_path, "--batches", os.path.join(d, "batches.h5"),
                    "--metrics", os.path.join(d, "metrics.csv"), "--grads", os.path.join(d, "grads.h5"),
                    "--params", os.path.join(d, "params"), "--threads", "1", "--report", os.path.join(d, "report.json")]
            if precision == "bf16":
                # the gradients file holds fp32 values of the emulation's float64 gradients
                argv += ["--loss-rtol", "0", "--gnorm-rtol", "0", "--grad-rtol", "1e-6", "--param-rtol", "0",
                         "--forward-rtol", "0"]
            buf = io.StringIO()
            with redirect_stdout(buf), redirect_stderr(buf):
                rc = g.main(argv)
            text = buf.getvalue()
            extra = ""
            if precision == "bf16":
                ok_upd = re.search(r": 0 of \d+ 16-bit parameters differ from Trident's", text) is not None
                extra = "; the update of its step-1 gradients reproduced exactly" if ok_upd else "; UPDATE CHECK MISSING"
                rc = rc if ok_upd else 1
            check("compare: a fake %s run of the Qwen 3 layer passes%s" % (precision, " with zero tolerances (gradients: fp32)"
                                                                            if precision == "bf16" else ""),
                  rc == 0, (text.strip().splitlines() or ["(no output)"])[-1] + extra)
            if rc != 0:
                print(text)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------
# 7. Mixture of experts
# --------------------------------------------------------------------------------------

def moe_deck(**kw):
    """A [moe] section of the keys given."""
    return "\n[moe]\n" + "".join("%s = %s\n" % kv for kv in kw.items())


def moe_config(g, model, precision="fp32", **moe):
    """gpt_reference.Config of a deck with a [moe] section; the shapes Config reads of every layer
    (dense fc1 and MoE router / expert 0 / shared expert) from the deck's own values."""
    cp = g.parse_deck(deck_text(model, precision, moe_deck(**moe)))
    blocks = 2 if model.get("swiglu", "false") == "true" else 1
    E = int(moe.get("num_experts", 0))
    Fe = int(moe.get("ffn_hidden_size", 0)) or model["ffn_hidden_size"]
    S = int(moe.get("shared_expert_intermediate_size", 0))
    shapes = {"model/embedding/word_embeddings": (V, C)}
    if model.get("position_embedding_type", "learned_absolute") == "learned_absolute":
        shapes["model/embedding/position_embeddings"] = (model["max_position_embeddings"], C)
    for i in range(model["num_layers"]):
        pre = "model/layers/%d/mlp/" % i
        shapes[pre + "fc1/weight"] = (blocks * model["ffn_hidden_size"], C)
        shapes[pre + "router/weight"] = (E, C)
        shapes[pre + "experts/0/fc1/weight"] = (blocks * Fe, C)
        shapes[pre + "shared_experts/fc1/weight"] = (blocks * S, C)
    return g.Config(cp, shapes)


class RecordingLayer:
    """A torch_reference.Transformer that keeps the router records (the hook's default drops them)."""

    @staticmethod
    def make(tr, params, spec, buffers=None):
        class _T(tr.Transformer):
            def moe_record(self, prefix, record):
                self.records.append((prefix, record))
        t = _T(params, spec, buffers)
        t.records = []
        return t


def brute_topk(scores, k):
    """The k-subset S of a row of scores with s_i > s_j, or s_i == s_j and i < j, for every i in S and
    j outside (the lower index wins ties): all subsets enumerated, the unique such one returned."""
    E = len(scores)
    hits = [S for S in itertools.combinations(range(E), k)
            if all(scores[i] > scores[j] or (scores[i] == scores[j] and i < j) for i in S for j in range(E) if j not in S)]
    assert len(hits) == 1, hits
    return hits[0]


def check_moe_routing(check, tr, torch):
    rng = np.random.default_rng(71)
    N, E = 12, 5
    # half the rows on a coarse grid (exact ties, several per row), half continuous
    logits = np.concatenate([rng.integers(-3, 4, size=(N // 2, E)) / 2.0, rng.standard_normal((N - N // 2, E))])
    logits[0] = 0.5  # all tied
    bias = np.array([0.25, 0.0, 0.25, -0.5, 0.0])  # ties kept among experts of equal bias
    lt = torch.tensor(logits)
    for k in (1, 2, 3):
        for label, score, pre, b in (("softmax, top-k then softmax", "softmax", False, None),
                                      ("softmax before the top-k", "softmax", True, None),
                                      ("sigmoid", "sigmoid", False, None),
                                      ("sigmoid with the expert bias", "sigmoid", False, bias)):
            probs, idx = tr.moe_route(lt, k, score, pre, None if b is None else torch.tensor(b))
            if score == "softmax":
                sel_scores = (lt if not pre else torch.softmax(lt, dim=-1)).numpy()
            else:
                sel_scores = torch.sigmoid(lt).numpy() + (0.0 if b is None else b)
            worst, same = 0.0, True
            for t in range(N):
                S = brute_topk(list(sel_scores[t]), k)
                got = [int(j) for j in idx[t]]
                # the slots: largest score first, equal scores lower index first
                same &= got == sorted(S, key=lambda j: (-sel_scores[t][j], j))
                l = logits[t]
                if score == "softmax" and not pre:
                    e = [math.exp(l[j]) for j in S]
                    want = [v / sum(e) for v in e]
                elif score == "softmax":
                    e = [math.exp(v) for v in l]
                    want = [math.exp(l[j]) / sum(e) for j in S]
                else:
                    sg = [1.0 / (1.0 + math.exp(-l[j])) for j in S]
                    want = [v / (sum(sg) + 1e-20) for v in sg] if k > 1 else sg
                want = dict(zip(S, want))
                worst = max([worst] + [abs(float(probs[t, s]) - want[got[s]]) / want[got[s]] for s in range(k)
                                       if got[s] in want])
            check("moe: routing %s, k = %d, against the brute-force k-subsets (ties: lower index)" % (label, k),
                  same and worst <= 1e-14, "selections %s, probs worst relative %.1e" % ("equal" if same else "DIFFER", worst))


def check_moe_capacity(check, tr, torch):
    # T = 8 tokens, E = 2, k = 1, softmax before the top-k (probs = the softmax value of the chosen
    # expert), capacity factor 0.5: capacity = ceil(8 * 1 / 2 * 0.5) = 2 tokens per expert.
    #   token      0     1     2     3     4     5     6     7
    #   expert     0     0     1     0     0     1     0     1
    #   prob     .622  .881  .731  .731  .953  .550  .881  .924   (token 6 ties token 1)
    # probs:    expert 0 keeps {4, 1} (1 beats 6 on the tie: lower index), expert 1 keeps {7, 2}
    # position: expert 0 keeps {0, 1}, expert 1 keeps {2, 5}
    d = [(0.5, 0.0), (2.0, 0.0), (0.0, 1.0), (1.0, 0.0), (3.0, 0.0), (0.0, 0.2), (2.0, 0.0), (0.0, 2.5)]
    N, Cm, F_ = len(d), 3, 4
    cap = tr.moe_capacity(N, 1, 2, 0.5)
    check("moe: capacity ceil(T k / E factor) = ceil(8 / 2 x 0.5) = 2", cap == 2, cap)
    gen = torch.Generator().manual_seed(5)
    x = torch.cat([torch.tensor(d, dtype=torch.float64), torch.randn(N, 1, generator=gen, dtype=torch.float64)], 1)
    params = {"l/mlp/router/weight": torch.eye(2, Cm, dtype=torch.float64)}  # logits = the first two channels
    for j in range(2):
        params["l/mlp/experts/%d/fc1/weight" % j] = torch.randn(F_, Cm, generator=gen, dtype=torch.float64)
        params["l/mlp/experts/%d/fc1/bias" % j] = torch.randn(F_, generator=gen, dtype=torch.float64)
        params["l/mlp/experts/%d/fc2/weight" % j] = torch.randn(Cm, F_, generator=gen, dtype=torch.float64)
        params["l/mlp/experts/%d/fc2/bias" % j] = torch.randn(Cm, generator=gen, dtype=torch.float64)
    for policy, kept in (("probs", {0: {1, 4}, 1: {2, 7}}), ("position", {0: {0, 1}, 1: {2, 5}})):
        probs, idx = tr.moe_route(x @ params["l/mlp/router/weight"].T, 1, "softmax", True)
        keep = tr.moe_capacity_keep(probs, idx, 2, cap, policy)
        got = {e: {t for t in range(N) if bool(keep[t, 0]) and int(idx[t, 0]) == e} for e in range(2)}
        spec = tr.LayerSpec(1, Cm, moe=tr.MoESpec(2, 1, "softmax", True, 0.5, policy))
        layer = RecordingLayer.make(tr, params, spec)
        y = layer.mlp(x.reshape(1, N, Cm), "l/mlp/").reshape(N, Cm)
        want = torch.zeros(N, Cm, dtype=torch.float64)
        for e, toks in kept.items():
            for t in toks:  # the kept tokens: prob x expert(x), the prob not renormalised
                want[t] = probs[t, 0] * layer.mlp(x[t:t + 1], "l/mlp/experts/%d/" % e)[0]
        rec = layer.records[0][1]
        check("moe: capacity 2, policy %s keeps expert 0 %s, expert 1 %s; the dropped tokens' output is 0, the "
              "kept ones prob x expert(x); 4 of 8 selections dropped" % (policy, sorted(kept[0]), sorted(kept[1])),
              got == kept and float((y - want).abs().max()) <= 1e-15 and rec["dropped"] == 4 and rec["selections"] == 8
              and rec["counts"].tolist() == [5, 3],
              "kept %s, output max difference %.1e, dropped %d" % (got, float((y - want).abs().max()), rec["dropped"]))


def check_moe_aux(check, tr, torch):
    rng = np.random.default_rng(72)
    N, E, k, coeff = 9, 4, 2, 0.01
    logits = torch.tensor(rng.standard_normal((N, E)))
    for score in ("softmax", "sigmoid"):
        p = tr.moe_aux_scores(logits, score)
        pn = p.numpy()
        counts = np.zeros(E)
        for t in range(N):
            for j in brute_topk(list(pn[t]), k):
                counts[j] += 1
        f = counts / (k * N)
        P = [sum(pn[t][e] for t in range(N)) / N for e in range(E)]
        want = E * coeff * sum(f[e] * P[e] for e in range(E))
        got = coeff * float(tr.moe_aux_loss(p, torch.tensor(counts, dtype=torch.int64), k))
        check("moe: aux loss (%s scores) = E coeff sum_e f_e P_e, f_e = counts_e / (k T), P_e = mean_t p_te" % score,
              abs(got - want) <= 1e-15 * abs(want), "%.17g vs %.17g" % (got, want))
    # in the layer: the counts of the aux loss are the top-k of p (no expert bias, before capacity drops), the
    # z loss is mean_t logsumexp^2
    Cm = 4
    gen = torch.Generator().manual_seed(9)
    params = {"l/router/weight": torch.randn(E, Cm, generator=gen, dtype=torch.float64)}
    for j in range(E):
        params["l/experts/%d/fc1/weight" % j] = torch.randn(3, Cm, generator=gen, dtype=torch.float64)
        params["l/experts/%d/fc2/weight" % j] = torch.randn(Cm, 3, generator=gen, dtype=torch.float64)
    buffers = {"l/router/expert_bias": torch.tensor([2.0, 0.0, 0.0, -2.0], dtype=torch.float64)}
    x = torch.randn(1, N, Cm, generator=gen, dtype=torch.float64)
    layer = RecordingLayer.make(tr, params, tr.LayerSpec(1, Cm, moe=tr.MoESpec(E, k, "sigmoid", False, 0.6, "position",
                                                                               True)), buffers)
    layer.mlp(x, "l/")
    rec = layer.records[0][1]
    lg = (x[0] @ params["l/router/weight"].T)
    pn = tr.moe_aux_scores(lg, "sigmoid").numpy()
    counts = np.zeros(E)
    for t in range(N):
        for j in brute_topk(list(pn[t]), k):
            counts[j] += 1
    want = E * sum(counts[e] / (k * N) * pn[:, e].mean() for e in range(E))
    zwant = float(np.mean([math.log(sum(math.exp(v) for v in row)) ** 2 for row in lg.numpy()]))
    routed = rec["counts"].numpy()
    check("moe: the layer's aux loss counts the top-k of p without the expert bias and before capacity drops "
          "(the biased routing's counts %s differ from those %s, %d dropped); its z loss is mean_t logsumexp^2"
          % (routed.tolist(), counts.astype(int).tolist(), rec["dropped"]),
          abs(float(rec["aux"]) - want) <= 1e-14 * want and abs(float(rec["z"]) - zwant) <= 1e-14 * zwant
          and routed.tolist() != counts.tolist() and rec["dropped"] > 0,
          "aux %.17g vs %.17g, z %.17g vs %.17g" % (float(rec["aux"]), want, float(rec["z"]), zwant))


def check_moe_dense_equivalence(check, g, tr, torch):
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(3, 7, C, generator=gen, dtype=torch.float64)
    for swiglu, bias in ((False, True), (True, False)):
        F1 = 2 * FFN if swiglu else FFN
        dense = {"d/fc1/weight": torch.randn(F1, C, generator=gen, dtype=torch.float64),
                 "d/fc2/weight": torch.randn(C, FFN, generator=gen, dtype=torch.float64)}
        if bias:
            dense["d/fc1/bias"] = torch.randn(F1, generator=gen, dtype=torch.float64)
            dense["d/fc2/bias"] = torch.randn(C, generator=gen, dtype=torch.float64)
        params = dict(dense)
        params["m/router/weight"] = torch.randn(1, C, generator=gen, dtype=torch.float64)
        for n, t in dense.items():
            params["m/experts/0/" + n[2:]] = t
        for rows in (None, 1):
            # micro-batches of 1 row: the dense MLP of each row (GEMMs of other heights round differently)
            spec = tr.LayerSpec(NH, C // NH, swiglu=swiglu, moe=tr.MoESpec(1, 1, "softmax", group_rows=rows))
            layer = tr.Transformer(params, spec)
            a = layer.mlp(x, "d/") if rows is None else torch.cat([layer.mlp(x[r:r + 1], "d/") for r in range(3)])
            b = layer.mlp(x, "m/")
            check("moe: E = 1, k = 1, softmax is the dense MLP bit for bit (%s%s, %s)"
                  % ("SwiGLU" if swiglu else "GELU", " with biases" if bias else "", "one micro-batch of 3 rows"
                     if rows is None else "micro-batches of 1 row, against the dense MLP of each row"),
                  bool((a == b).all()), "max difference %.1e" % float((a - b).abs().max()))
    # a whole model: every layer MoE with the dense weights as its expert 0: the loss and the gradients of one
    # micro-batch bit for bit, the router's gradient exactly 0 (the probs are 1 whatever the logit; the aux loss
    # is the constant 1)
    w = torch.as_tensor(windows(1, rows=B))
    for name in ("gpt2", "llama"):
        cfg_d = gpt_config(g, GPT_DECKS[name])
        cfg_m = moe_config(g, GPT_DECKS[name], num_experts=1, router_topk=1, aux_loss_coeff=0.1)
        pd = random_params(g.expected_shapes(cfg_d), 18)
        pm = {}
        for n in g.expected_shapes(cfg_m):
            src = n.replace("mlp/experts/0/", "mlp/")
            pm[n] = pd[src] if src in pd else np.random.default_rng(3).standard_normal((1, C))
        ld, gd = loss_and_grads(g.GPTReference(cfg_d, pd), w)
        mm = g.GPTReference(cfg_m, pm)
        lm, gm = loss_and_grads(mm, w)
        recs = mm.moe_take()
        same = ld == lm and all((gm[n] == gd[n.replace("mlp/experts/0/", "mlp/")]).all() for n in gm if "router" not in n)
        router_zero = all(not gm[n].any() for n in gm if "router" in n)
        check("moe: a %s model whose layers are MoE layers of E = 1, k = 1 (softmax) is the dense model: loss and "
              "gradients bit for bit, the router's gradient 0, the aux loss 1" % name,
              same and router_zero and all(float(r["aux"]) == 1.0 for _, r in recs) and len(recs) == L,
              "loss %r vs %r" % (lm, ld))


def check_moe_gradients(check, tr, torch):
    """Autograd against central differences: J = sum(y * R) + 0.3 aux + 0.2 z (every record) of an MoE
    layer on 2 micro-batches of 1 row, in float64, every element of the router, the experts, the shared
    expert and the input."""
    Cm, E, Fe, S, Tn = 4, 4, 3, 2, 5
    for label, swiglu, bias, moe in (
            ("softmax top-k then softmax, capacity 1.0 (probs policy), GELU with biases, shared expert",
             False, True, tr.MoESpec(E, 2, "softmax", False, 1.0, "probs", group_rows=1)),
            ("softmax before the top-k, dropless, SwiGLU, shared expert", True, False,
             tr.MoESpec(E, 2, "softmax", True, group_rows=1)),
            ("sigmoid with the expert bias, k = 3, capacity 0.8 (position policy), GELU with biases", False, True,
             tr.MoESpec(E, 3, "sigmoid", False, 0.8, "position", True, group_rows=1)),
            ("sigmoid, k = 1, SwiGLU", True, False, tr.MoESpec(E, 1, "sigmoid", group_rows=1))):
        gen = torch.Generator().manual_seed(23)
        blocks = 2 if swiglu else 1
        shapes = {"router/weight": (E, Cm)}
        for pre, width in (["experts/%d/" % j, Fe] for j in range(E)) if label.endswith("k = 1, SwiGLU") else \
                [["experts/%d/" % j, Fe] for j in range(E)] + [["shared_experts/", S]]:
            shapes[pre + "fc1/weight"], shapes[pre + "fc2/weight"] = (blocks * width, Cm), (Cm, width)
            if bias:
                shapes[pre + "fc1/bias"], shapes[pre + "fc2/bias"] = (blocks * width,), (Cm,)
        params = {n: torch.randn(*shp, generator=gen, dtype=torch.float64).requires_grad_(True) for n, shp in shapes.items()}
        buffers = {"router/expert_bias": torch.tensor([0.3, -0.2, 0.0, 0.1], dtype=torch.float64)}
        x = torch.randn(2, Tn, Cm, generator=gen, dtype=torch.float64).requires_grad_(True)
        R = torch.randn(2, Tn, Cm, generator=gen, dtype=torch.float64)
        layer = RecordingLayer.make(tr, params, tr.LayerSpec(1, Cm, swiglu=swiglu, moe=moe), buffers)

        def J():
            layer.records = []
            y = layer.mlp(x, "")
            return (y * R).sum() + sum(0.3 * r["aux"] + 0.2 * r["z"] for _, r in layer.records)

        J().backward()
        dropped = sum(r["dropped"] for _, r in layer.records)
        h, worst = 1e-5, 0.0
        with torch.no_grad():
            for name, t in list(params.items()) + [("x", x)]:
                fd = torch.zeros_like(t)
                flat, fdf = t.view(-1), fd.view(-1)
                for e in range(flat.numel()):
                    v = float(flat[e])
                    flat[e] = v + h
                    jp = float(J())
                    flat[e] = v - h
                    jm = float(J())
                    flat[e] = v
                    fdf[e] = (jp - jm) / (2 * h)
                ag = t.grad.numpy() if t.grad is not None else np.zeros(tuple(t.shape))  # an expert without tokens
                worst = max(worst, rel(ag, fd.numpy()) if float(fd.abs().max()) > 0 else float(np.abs(ag).max()))
        check("moe: gradients of the MoE layer (router, experts, input) against central differences: %s%s"
              % (label, " (%d selections dropped)" % dropped if moe.capacity_factor > 0 else ""),
              worst <= 1e-7 and (moe.capacity_factor == 0 or dropped > 0), "worst relative L2 error %.1e" % worst)


def check_moe_deck(check, g, reference_loop, tr, torch):
    cfg = moe_config(g, base_model(), num_experts=4)
    check("moe deck: defaults (router_topk 2, expert width = ffn_hidden_size, layer_freq 1: every layer, softmax, "
          "no shared expert, dropless, probs policy, no expert bias, rate 1e-3, coefficients 0)",
          (cfg.moe_router_topk, cfg.moe_ffn_hidden_size, cfg.moe_layers, cfg.moe_router_score_function,
           cfg.moe_router_pre_softmax, cfg.moe_shared_expert_intermediate_size, cfg.moe_expert_capacity_factor,
           cfg.moe_token_drop_policy, cfg.moe_router_enable_expert_bias, cfg.moe_router_bias_update_rate,
           cfg.moe_aux_loss_coeff, cfg.moe_z_loss_coeff)
          == (2, FFN, [True] * L, "softmax", False, 0, 0.0, "probs", False, 1e-3, 0.0, 0.0))
    four = dict(base_model(), num_layers=4)
    check("moe deck: layer_freq 2 of 4 layers is [1,0,1,0]; [0,1,1,0] as listed",
          moe_config(g, four, num_experts=2, layer_freq=2).moe_layers == [True, False, True, False]
          and moe_config(g, four, num_experts=2, layer_freq="[0,1,1,0]").moe_layers == [False, True, True, False])
    dense = gpt_config(g, GPT_DECKS["gpt2"])
    zero = moe_config(g, GPT_DECKS["gpt2"], num_experts=0, router_topk=8)
    check("moe deck: num_experts 0 is the dense model (same names and shapes, no MoE layer)",
          list(g.expected_shapes(zero).items()) == list(g.expected_shapes(dense).items()) and not g.is_moe(zero))
    for bad, why in ((dict(num_experts=4, router_topk=5), "router_topk > num_experts"),
                     (dict(num_experts=4, router_topk=0), "router_topk 0"),
                     (dict(num_experts=-1), "num_experts < 0"),
                     (dict(num_experts=4, router_score_function="relu"), "an unknown score function"),
                     (dict(num_experts=4, token_drop_policy="random"), "an unknown drop policy"),
                     (dict(num_experts=4, layer_freq="[1,0,1]"), "a layer_freq list of 3 for 2 layers"),
                     (dict(num_experts=4, layer_freq="[1,2]"), "a layer_freq list entry 2"),
                     (dict(num_experts=4, layer_freq="0"), "layer_freq 0"),
                     (dict(num_experts=4, layer_freq="x"), "layer_freq x"),
                     (dict(num_experts=4, router_enable_expert_bias="true"), "the expert bias with softmax"),
                     (dict(num_experts=4, expert_capacity_factor=-1), "a negative capacity factor"),
                     (dict(num_experts=4, aux_loss_coeff="nan"), "a NaN coefficient"),
                     (dict(num_experts=4, router_pre_softmax="maybe"), "router_pre_softmax maybe")):
        try:
            moe_config(g, base_model(), **bad)
            ok = False
        except g.InputError:
            ok = True
        check("moe deck: refused (%s)" % why, ok)
    # the checkpoint's widths: layer 0 an MoE layer, its experts checked against moe.ffn_hidden_size, layer 1's fc1
    # against model.ffn_hidden_size
    cp = g.parse_deck(deck_text(base_model(), "fp32", moe_deck(num_experts=3, ffn_hidden_size=6, layer_freq="[1,0]",
                                                                shared_expert_intermediate_size=5)))
    good = {"model/embedding/word_embeddings": (V, C), "model/embedding/position_embeddings": (T + 4, C),
            "model/layers/0/mlp/router/weight": (3, C), "model/layers/0/mlp/experts/0/fc1/weight": (6, C),
            "model/layers/0/mlp/shared_experts/fc1/weight": (5, C), "model/layers/1/mlp/fc1/weight": (FFN, C)}
    ok_good = g.Config(cp, good).moe_ffn_hidden_size == 6
    refused = []
    for n, shp in (("model/layers/0/mlp/experts/0/fc1/weight", (FFN, C)), ("model/layers/0/mlp/router/weight", (4, C)),
                   ("model/layers/0/mlp/shared_experts/fc1/weight", (6, C)), ("model/layers/1/mlp/fc1/weight", (6, C)),
                   ("model/layers/0/mlp/router/weight", None)):
        s_ = dict(good)
        if shp is None:
            del s_[n]
        else:
            s_[n] = shp
        try:
            g.Config(cp, s_)
        except g.InputError:
            refused.append(n)
    check("moe deck: layer 0 an MoE layer: the experts' width checked against moe.ffn_hidden_size, the shared "
          "expert's and the router's against theirs, the dense layer 1's fc1 against ffn_hidden_size",
          ok_good and len(refused) == 5, refused)
    cfg = moe_config(g, dict(GPT_DECKS["llama"]), num_experts=2, ffn_hidden_size=6, layer_freq="[0,1]",
                     shared_expert_intermediate_size=4, router_score_function="sigmoid", router_enable_expert_bias="true")
    s = g.expected_shapes(cfg)
    want = {"model/layers/0/mlp/fc1/weight": (2 * FFN, C), "model/layers/1/mlp/router/weight": (2, C),
            "model/layers/1/mlp/router/expert_bias": (2,), "model/layers/1/mlp/experts/1/fc1/weight": (12, C),
            "model/layers/1/mlp/experts/1/fc2/weight": (C, 6), "model/layers/1/mlp/shared_experts/fc1/weight": (8, C),
            "model/layers/1/mlp/shared_experts/fc2/weight": (C, 4)}
    check("moe deck: checkpoint names and shapes (SwiGLU experts of 2 Fe rows, the expert bias a buffer, no biases "
          "without add_bias_linear, no dense fc1 in an MoE layer)",
          all(s.get(n) == v for n, v in want.items()) and "model/layers/1/mlp/fc1/weight" not in s
          and not any(n.endswith("/bias") and "mlp" in n and "expert_bias" not in n for n in s)
          and g.buffer_names(cfg) == ["model/layers/1/mlp/router/expert_bias"]
          and "model/layers/1/mlp/router/expert_bias" not in g.param_names(cfg), {n: s.get(n) for n in want})
    with_bias = g.expected_shapes(moe_config(g, base_model(), num_experts=2, shared_expert_intermediate_size=3))
    check("moe deck: with add_bias_linear the experts and the shared expert have fc1 / fc2 biases, the router none",
          with_bias.get("model/layers/0/mlp/experts/1/fc2/bias") == (C,)
          and with_bias.get("model/layers/0/mlp/shared_experts/fc1/bias") == (3,)
          and "model/layers/0/mlp/router/bias" not in with_bias)
    try:
        reference_loop.layer_spec(cfg)
        ok = False
    except g.InputError:
        ok = True
    check("moe deck: the BERT / T5 layer refuses MoE decks", ok)
    b = torch.tensor([0.0, 0.5, -0.5, 1.0], dtype=torch.float64)
    tr.expert_bias_update(b, torch.tensor([5, 3, 4, 4]), 1e-3)
    check("moe: expert bias update b += rate sign(mean(c) - c): counts [5, 3, 4, 4] move [0, .5, -.5, 1] by "
          "[-1, +1, 0, 0] x 1e-3", b.tolist() == [-1e-3, 0.5 + 1e-3, -0.5, 1.0], b.tolist())


MOE_CASES = {
    # sigmoid routing with the expert bias, capacity drops, a shared expert, both losses; layer 1 dense. GELU and
    # biases; rotary positions, as the fp32 run's key bias (whose gradient is 0 with learned positions: gpt_reference's
    # key_bias_block) would otherwise be updated by rounding noise
    "GPT-2 layer with rope, sigmoid + expert bias, capacity 1.0, shared expert, layer_freq [1,0]":
        (base_model(position_embedding_type="rope", rotary_base=1000.0),
         dict(num_experts=4, router_topk=2, ffn_hidden_size=12, layer_freq="[1,0]", shared_expert_intermediate_size=8,
              router_score_function="sigmoid", router_enable_expert_bias="true", router_bias_update_rate=0.01,
              aux_loss_coeff=0.01, z_loss_coeff=0.001, expert_capacity_factor=1.0, token_drop_policy="probs")),
    # the Qwen 3 layer (SwiGLU, no biases) with softmax routing in every layer, dropless
    "Qwen 3 layer, softmax top-2 of 3, every layer, dropless":
        (QWEN, dict(num_experts=3, router_topk=2, ffn_hidden_size=10, aux_loss_coeff=0.01, z_loss_coeff=0.001)),
}


def write_fake_moe_run(g, torch, d, model, moe, columns=True, corrupt=False, precision="fp32", loss_scale=1.0):
    """A fake fp32 "Trident" MoE run (the reference in float32) in directory d; its metrics with the moe_*
    columns (optionally one moe_aux_loss off by 1e-3) or without them. Returns the compare argv. precision
    bf16 / fp16: a 16-bit run, the emulation's own trajectory (16-bit parameters, fp32 masters in the
    checkpoint; fp16 at the constant loss scale loss_scale), compared with zero tolerances."""
    import h5py
    os.makedirs(os.path.join(d, "params"))
    deck = deck_text(model, precision, moe_deck(**moe))
    cfg = moe_config(g, model, precision, **moe)
    p = random_params(g.expected_shapes(cfg), 19)
    for n in g.buffer_names(cfg):
        p[n] = np.zeros_like(p[n])
    half = precision != "fp32"
    if half:
        p = {n: x if n in g.buffer_names(cfg) else g.round16(torch.from_numpy(x), precision).numpy() for n, x in p.items()}
    ck_path = os.path.join(d, "ck.h5")
    with h5py.File(ck_path, "w") as f:
        f.attrs.update({"format": "trident.checkpoint", "format_version": 1, "model": "gpt", "iteration": 0,
                        "consumed_samples": 0, "deck": deck})
        for n, x in p.items():
            f[n] = x.astype(np.float32)
            if half and n not in g.buffer_names(cfg):
                f["optimizer/master/" + n] = x.astype(np.float32)
    batches = [windows(200 + i, rows=cfg.global_batch_size) for i in range(3)]
    with h5py.File(os.path.join(d, "batches.h5"), "w") as f:
        for i, b_ in enumerate(batches, 1):
            f[g.batch_name(i)] = b_.astype(np.int32)
    trainer = g.Trainer(g.Checkpoint(ck_path), torch.float32) if not half else \
        g.Trainer(g.Checkpoint(ck_path), torch.float64, None, precision)
    rows, bias_moved = [], []
    for i, b_ in enumerate(batches, 1):
        before = {n: t.clone() for n, t in trainer.model.buffers.items()}
        res = trainer.step(b_, keep_grads=(i == 1)) if not half else \
            trainer.step(b_, keep_grads=(i == 1), loss_scale=loss_scale)
        bias_moved.append(all(bool((trainer.model.buffers[n] != before[n]).any()) for n in before))
        if i == 1:
            with h5py.File(os.path.join(d, "grads.h5"), "w") as f:
                f.attrs["iteration"] = 1
                for n, x in res["grads"].items():
                    f[n] = x.astype(np.float32)
        with h5py.File(os.path.join(d, "params", "iter_%07d.h5" % i), "w") as f:
            for n, t in list(trainer.model.params.items()) + list(trainer.model.buffers.items()):
                # (16-bit: the expert biases as the emulation holds them, float64, for the zero tolerances)
                f[n] = t.detach().numpy().astype(np.float64 if half and n in trainer.model.buffers else np.float32)
        m = res["moe"]
        aux = m["moe_aux_loss"] * (1.001 if corrupt and i == 2 else 1.0)
        rows.append("%d,%d,%.17g,%.17g,%.17g,%.17g,0,1,1,0,0" % (i, i * cfg.global_batch_size, res["loss"], res["lr"],
                                                                res["grad_norm"], loss_scale if half else 1)
                    + (",%.17g,%.17g,%.17g,%.17g" % (aux, m["moe_z_loss"], m["moe_max_load"], m["moe_dropped"])
                       if columns else ""))
    with open(os.path.join(d, "metrics.csv"), "w") as fh:
        fh.write(",".join(g.METRICS_COLUMNS + (list(g.MOE_METRICS) if columns else [])) + "\n" + "\n".join(rows) + "\n")
    argv = ["compare", "--checkpoint", ck_path, "--batches", os.path.join(d, "batches.h5"),
            "--metrics", os.path.join(d, "metrics.csv"), "--grads", os.path.join(d, "grads.h5"),
            "--params", os.path.join(d, "params"), "--threads", "1", "--report", os.path.join(d, "report.json")]
    if half:  # the gradients file holds fp32 values of the emulation's float64 gradients
        argv += ["--loss-rtol", "0", "--gnorm-rtol", "0", "--grad-rtol", "1e-6", "--param-rtol", "0",
                 "--forward-rtol", "0"]
    return argv, cfg, bias_moved, res["moe"]


def check_moe_objective(check, g, torch):
    """The Trainer's gradient is that of mean CE + sum over MoE layers of the mean over micro-batches of
    (aux_coeff aux + z_coeff z), computed here from the model's forward of each micro-batch."""
    model, moe = MOE_CASES["GPT-2 layer with rope, sigmoid + expert bias, capacity 1.0, shared expert, layer_freq [1,0]"]
    cfg = moe_config(g, model, **moe)
    p = random_params(g.expected_shapes(cfg), 20)
    batch = windows(300, rows=cfg.global_batch_size)
    ck = types.SimpleNamespace(config=cfg, params=p, iteration=0, exp_avg=None, exp_avg_sq=None)
    res = g.Trainer(ck).step(batch, keep_grads=True)
    ref = g.GPTReference(cfg, p)
    w = torch.as_tensor(batch)
    mbs, n_mb = cfg.micro_batch_size, cfg.global_batch_size // cfg.micro_batch_size
    aux, z, counts = [], [], {}
    for s0 in range(0, w.shape[0], mbs):
        ce = ref.loss_sum(w[s0:s0 + mbs]) / (w.shape[0] * (w.shape[1] - 1))
        recs = ref.moe_take()
        extra = sum(0.01 * r["aux"] + 0.001 * r["z"] for _, r in recs) / n_mb
        (ce + extra).backward()
        aux += [float(r["aux"]) for _, r in recs]
        z += [float(r["z"]) for _, r in recs]
        for pre, r in recs:
            counts[pre] = counts.get(pre, 0) + r["counts"].numpy()
    worst = max(rel(res["grads"][n], t.grad.numpy()) for n, t in ref.params.items())
    c = counts["model/layers/0/mlp/"]
    want = {"moe_aux_loss": sum(aux) / len(aux), "moe_z_loss": sum(z) / len(z), "moe_max_load": c.max() / c.mean()}
    check("moe: the objective's gradient (mean CE + mean over micro-batches of 0.01 aux + 0.001 z) and the metrics "
          "(aux %.4g, z %.4g, max load %.4g, dropped %.4g)" % tuple(res["moe"][k] for k in g.MOE_METRICS),
          worst <= 1e-13 and all(abs(res["moe"][k] - v) <= 1e-13 * abs(v) for k, v in want.items())
          and len(aux) == n_mb and 0 < res["moe"]["moe_dropped"] < 1,
          "gradients %.1e; %s" % (worst, {k: (res["moe"][k], v) for k, v in want.items()}))


def check_moe_idle_expert(check, g, torch):
    """An expert that no token reaches (sigmoid routing, its expert bias -10: s + b < 0 < the others'): a zero
    gradient, and the step goes on (AdamW with a zero gradient at the first step: the weight decay alone)."""
    cfg = moe_config(g, base_model(), num_experts=4, router_topk=1, ffn_hidden_size=6, router_score_function="sigmoid",
                     router_enable_expert_bias="true", aux_loss_coeff=0.01)
    p = random_params(g.expected_shapes(cfg), 21)
    for i in range(L):
        p["model/layers/%d/mlp/router/expert_bias" % i] = np.array([0.0, 0.0, 0.0, -10.0])
    ck = types.SimpleNamespace(config=cfg, params=p, iteration=0, exp_avg=None, exp_avg_sq=None)
    trainer = g.Trainer(ck)
    res = trainer.step(windows(400, rows=cfg.global_batch_size), keep_grads=True)
    n = "model/layers/1/mlp/experts/3/fc1/weight"
    after = trainer.model.params[n].detach().numpy()
    lr = g.lr_at(cfg, 1)
    check("moe: an expert no token reaches gets a zero gradient and the step runs (AdamW: the weight decay alone)",
          not any(res["grads"][n.replace("fc1/weight", x)].any() for x in ("fc1/weight", "fc1/bias", "fc2/weight", "fc2/bias"))
          and np.array_equal(after, p[n] * (1.0 - lr * cfg.weight_decay)),
          "gradient norm %.1e, max load %.3g" % (float(np.linalg.norm(res["grads"][n])), res["moe"]["moe_max_load"]))


def check_moe_compare(check, g, torch):
    tmp = tempfile.mkdtemp(prefix="torch_reference_selftest_moe_")
    try:
        for n_case, (label, (model, moe)) in enumerate(MOE_CASES.items()):
            variants = (("with moe_* columns", True, False), ("without moe_* columns", False, False),
                        ("with a wrong moe_aux_loss", True, True)) if n_case == 0 else (("with moe_* columns", True, False),)
            for k_, (what, columns, corrupt) in enumerate(variants):
                d = os.path.join(tmp, "%d_%d" % (n_case, k_))
                argv, cfg, bias_moved, last = write_fake_moe_run(g, torch, d, model, moe, columns, corrupt)
                buf = io.StringIO()
                with redirect_stdout(buf), redirect_stderr(buf):
                    rc = g.main(argv)
                text = buf.getvalue()
                if corrupt:
                    ok = rc == 1 and "iteration 2: moe_aux_loss differs" in text
                elif columns:
                    ok = rc == 0 and text.count(" moe (trident ref rel): ") == 3 and (
                        "expert biases after iteration" in text or not cfg.moe_router_enable_expert_bias)
                else:
                    ok = rc == 0 and "note: Trident's metrics have no column moe_aux_loss, moe_z_loss, moe_max_load, " \
                                     "moe_dropped: not compared" in text
                extra = ""
                if cfg.moe_router_enable_expert_bias and k_ == 0:
                    extra = "; the expert biases moved at every step" if all(bias_moved) else "; EXPERT BIAS NOT MOVED"
                    ok = ok and all(bias_moved)
                check("compare: a fake fp32 MoE run (%s) %s %s%s" % (label, what, "is refused" if corrupt else "passes", extra),
                      ok, (text.strip().splitlines() or ["(no output)"])[-1])
                if not ok:
                    print(text)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_moe_16bit(check, g, tr, torch):
    """The 16-bit emulation of MoE layers (GPTReference16, Trainer._step16, compare): an expert is the dense
    MLP's call at its rounding points and the router is not rounded; a model of E = 1, k = 1 MoE layers is
    the dense 16-bit model bit for bit; the step's gradients (the MoE terms scaled with the loss) do not
    depend on a power-of-two loss scale and agree with float64's; an idle expert; compare end to end."""
    w = torch.as_tensor(windows(1, rows=B))
    # a whole model whose layers are MoE layers of E = 1, k = 1 with the dense weights as expert 0
    for name in ("gpt2", "llama"):
        for fmt in ("bf16", "fp16"):
            cfg_d = gpt_config(g, GPT_DECKS[name], fmt)
            cfg_m = moe_config(g, GPT_DECKS[name], fmt, num_experts=1, router_topk=1, aux_loss_coeff=0.1)
            pd = {n: g.round16(torch.from_numpy(x), fmt).numpy()
                  for n, x in random_params(g.expected_shapes(cfg_d), 18).items()}
            pm = {}
            for n in g.expected_shapes(cfg_m):
                src = n.replace("mlp/experts/0/", "mlp/")
                pm[n] = pd[src] if src in pd else g.round16(torch.from_numpy(
                    np.random.default_rng(3).standard_normal((1, C))), fmt).numpy()
            ld, gd = loss_and_grads(g.GPTReference16(cfg_d, pd, fmt), w)
            lm, gm = loss_and_grads(g.GPTReference16(cfg_m, pm, fmt), w)
            same = ld == lm and all((gm[n] == gd[n.replace("mlp/experts/0/", "mlp/")]).all()
                                    for n in gm if "router" not in n)
            router_zero = all(not gm[n].any() for n in gm if "router" in n)
            check("moe 16-bit: a %s model whose layers are MoE layers of E = 1, k = 1 is the dense %s emulation: loss and "
                  "gradients bit for bit, the router's gradient 0" % (name, fmt), same and router_zero,
                  "loss %r vs %r" % (lm, ld))
    # the rounding points of an MoE layer: per expert with tokens (and the shared expert) the dense MLP's
    # fc1 GEMM (its gradient rounded), fc1's stored output, the stored activation, fc2's GEMM (its gradient
    # rounded); nothing else in the layer (the router, the combination) rounds
    model, moe = MOE_CASES["GPT-2 layer with rope, sigmoid + expert bias, capacity 1.0, shared expert, layer_freq [1,0]"]
    cfg = moe_config(g, model, "bf16", **moe)
    p = {n: g.round16(torch.from_numpy(x), "bf16").numpy() for n, x in random_params(g.expected_shapes(cfg), 22).items()}
    calls, stored = [], []

    class Recorder(g.GPTReference16):
        def store(self, x):
            y = super().store(x)
            calls.append(("store", sys._getframe(1).f_code.co_name, x.shape[-1]))
            stored.append(y)
            return y

        def store_both(self, x):
            calls.append(("store_both", sys._getframe(1).f_code.co_name, x.shape[-1]))
            return super().store_both(x)

        def grad_store(self, x):
            calls.append(("grad_store", sys._getframe(1).f_code.co_name, x.shape[-1]))
            return super().grad_store(x)

        def moe_tokens(self, x, prefix):
            calls.append(("moe", prefix))
            return super().moe_tokens(x, prefix)

    rec = Recorder(cfg, p, "bf16")
    rec.loss_sum(torch.as_tensor(windows(2, rows=B)))
    layer0 = rec.moe_take()[0][1]
    Fe, S = cfg.moe_ffn_hidden_size, cfg.moe_shared_expert_intermediate_size
    expert = lambda F_: [("grad_store", "linear", F_), ("store", "mlp", F_), ("store", "mlp", F_),  # noqa: E731
                         ("grad_store", "linear", C)]
    start = calls.index(("moe", "model/layers/0/mlp/"))
    end = next(i for i in range(start, len(calls)) if calls[i] == ("store", "layer", C))  # layer 1's first norm
    got = calls[start + 1:end]
    want = expert(Fe) * (len(got) // 4 - 1) + expert(S)
    check("moe 16-bit: the rounding points of an MoE layer are the dense MLP's, per expert with tokens and for the "
          "shared expert; the router and the combination do not round; every stored value is a bf16 value",
          got == want and len(got) // 4 - 1 >= 2 and layer0["dropped"] > 0
          and all(bool((t == g.round16(t, "bf16")).all()) for t in stored),
          "%d hook calls in layer 0's MoE layer (%d experts with tokens)" % (len(got), len(got) // 4 - 1))
    # the step: a power-of-two loss scale changes nothing (the MoE terms are scaled with the loss), and the
    # gradients agree with the float64 reference's to the format's precision
    model, moe = MOE_CASES["Qwen 3 layer, softmax top-2 of 3, every layer, dropless"]
    moe = dict(moe, aux_loss_coeff=0.1, z_loss_coeff=0.01)
    cfg = moe_config(g, model, "bf16", **moe)
    p = {n: g.round16(torch.from_numpy(x), "bf16").numpy() for n, x in random_params(g.expected_shapes(cfg), 23).items()}
    ck = lambda: types.SimpleNamespace(config=cfg, params=p, masters=p, names=g.param_names(cfg), iteration=0,  # noqa: E731
                                       optimizer_steps=0, exp_avg=None, exp_avg_sq=None)
    batch = windows(500, rows=cfg.global_batch_size)
    r1 = g.Trainer(ck(), torch.float64, None, "bf16").step(batch, keep_grads=True, loss_scale=1.0)
    r2 = g.Trainer(ck(), torch.float64, None, "bf16").step(batch, keep_grads=True, loss_scale=4096.0)
    r64 = g.Trainer(ck()).step(batch, keep_grads=True)
    same = all((r1["grads"][n] == r2["grads"][n]).all() for n in r1["grads"]) and r1["moe"] == r2["moe"] \
        and r1["objective"] == r2["objective"]
    gl = math.sqrt(sum(float((x ** 2).sum()) for x in r64["grads"].values()))
    glob = math.sqrt(sum(float(((r1["grads"][n] - r64["grads"][n]) ** 2).sum()) for n in r64["grads"])) / gl
    router = max(rel(r1["grads"][n], r64["grads"][n]) for n in r64["grads"] if "router" in n)
    check("moe 16-bit: the step's gradients and MoE metrics at loss scale 4096 equal those at 1 bit for bit (bf16), and "
          "agree with float64's (aux 0.1, z 0.01: gradients within 5e-2, the routers' within 5e-2, objective within 1e-2)",
          same and glob <= 5e-2 and router <= 5e-2 and abs(r1["objective"] - r64["objective"]) <= 1e-2 * r64["objective"],
          "gradients %.1e globally, routers %.1e, objective %.2e relative"
          % (glob, router, abs(r1["objective"] - r64["objective"]) / r64["objective"]))
    # an expert no token reaches: a zero gradient, and MasterAdamW steps it (the weight decay alone)
    cfg = moe_config(g, base_model(), "bf16", num_experts=4, router_topk=1, ffn_hidden_size=6,
                     router_score_function="sigmoid", router_enable_expert_bias="true", aux_loss_coeff=0.01)
    p = {n: g.round16(torch.from_numpy(x), "bf16").numpy() for n, x in random_params(g.expected_shapes(cfg), 21).items()}
    for i in range(L):
        p["model/layers/%d/mlp/router/expert_bias" % i] = np.array([0.0, 0.0, 0.0, -10.0])
    ck = types.SimpleNamespace(config=cfg, params=p, masters=p, names=g.param_names(cfg), iteration=0, optimizer_steps=0,
                               exp_avg=None, exp_avg_sq=None)
    trainer = g.Trainer(ck, torch.float64, None, "bf16")
    res = trainer.step(windows(400, rows=cfg.global_batch_size), keep_grads=True)
    n = "model/layers/1/mlp/experts/3/fc1/weight"
    decay = torch.tensor(float(Fraction(1) - Fraction(g.lr_at(cfg, 1)) * Fraction(cfg.weight_decay)), dtype=torch.float32)
    check("moe 16-bit: an expert no token reaches gets a zero gradient and the step runs (its master decayed, rounded)",
          not any(res["grads"][n.replace("fc1/weight", x)].any()
                  for x in ("fc1/weight", "fc1/bias", "fc2/weight", "fc2/bias"))
          and bool((trainer.opt.master[n] == torch.from_numpy(p[n].astype(np.float32)) * decay).all())
          and bool((trainer.model.params[n] == g.round16(trainer.opt.master[n].double(), "bf16")).all()),
          "max load %.3g" % res["moe"]["moe_max_load"])
    # compare end to end: the emulation's own trajectories pass with zero tolerances, the forward from the dumped
    # parameters (with the expert biases) and the update of the step-1 gradients exact
    tmp = tempfile.mkdtemp(prefix="torch_reference_selftest_moe16_")
    try:
        for k_, ((label, (model, moe)), precision, scale) in enumerate(zip(MOE_CASES.items(), ("fp16", "bf16"),
                                                                            (1024.0, 1.0))):
            d = os.path.join(tmp, str(k_))
            argv, cfg, bias_moved, _ = write_fake_moe_run(g, torch, d, model, moe, precision=precision, loss_scale=scale)
            buf = io.StringIO()
            with redirect_stdout(buf), redirect_stderr(buf):
                rc = g.main(argv)
            text = buf.getvalue()
            rep_ = {"update_from_trident": None, "forward_from_trident": []}
            if os.path.exists(os.path.join(d, "report.json")):
                with open(os.path.join(d, "report.json")) as fh:
                    rep_ = json.load(fh)
            upd, fwd = rep_["update_from_trident"], rep_["forward_from_trident"]
            ok = rc == 0 and text.count(" moe (trident ref rel): ") == 3 and upd is not None and upd["differ"] == 0 \
                and len(fwd) == 3 and all(r["loss_rel"] == 0 for r in fwd) \
                and (all(bias_moved) and "expert biases after iteration" in text or not cfg.moe_router_enable_expert_bias)
            check("compare: a fake %s MoE run (%s%s) passes with zero tolerances, the forward and update checks included"
                  % (precision, label, ", loss scale %g" % scale if precision == "fp16" else ""), ok,
                  (text.strip().splitlines() or ["(no output)"])[-1])
            if not ok:
                print(text)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_moe(check, g, reference_loop, tr, torch):
    check_moe_routing(check, tr, torch)
    check_moe_capacity(check, tr, torch)
    check_moe_aux(check, tr, torch)
    check_moe_dense_equivalence(check, g, tr, torch)
    check_moe_gradients(check, tr, torch)
    check_moe_deck(check, g, reference_loop, tr, torch)
    check_moe_objective(check, g, torch)
    check_moe_idle_expert(check, g, torch)
    check_moe_compare(check, g, torch)
    check_moe_16bit(check, g, tr, torch)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--side":
        out = side_outputs(sys.argv[2])
        np.savez(sys.argv[3], **out)
        return 0
    t0 = time.time()
    log = []

    def check(label, ok, detail=""):
        log.append(bool(ok))
        detail = detail if isinstance(detail, str) else str(detail)
        print("%-4s %s%s" % ("ok" if ok else "FAIL", label, (": " + detail) if detail else ""), flush=True)

    check_refactor(check)
    sys.path.insert(0, HERE)
    import torch
    torch.set_num_threads(1)
    import gpt_reference as g
    import reference_loop
    import torch_reference as tr
    check_gqa(check, g, tr, torch)
    check_against_loops(check, g, torch)
    check_deck(check, g, reference_loop)
    check_16bit(check, g, torch)
    check_compare_end_to_end(check, g, torch)
    check_moe(check, g, reference_loop, tr, torch)
    bad = log.count(False)
    print("\ntorch_reference_selftest: %d checks, %s (%.0f s)" % (len(log), "all passed" if not bad else "%d FAILED" % bad,
                                                                  time.time() - t0))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
