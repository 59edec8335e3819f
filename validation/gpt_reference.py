#!/usr/bin/python3
"""PyTorch reference for Trident's GPT-2 training (run with Debian's /usr/bin/python3).

The reference must be readable end to end and run standalone, importing nothing of Trident's,
so that it stays independent of what it checks; the layer's math (norms, linears, attention,
rotary positions, MLP) is validation/torch_reference.py's, shared with the BERT and T5 references.

An independent, deliberately plain re-implementation of what Trident's GPT does, used as
ground truth in validation cases:

  * the model is built from a Trident checkpoint (shapes from the HDF5 datasets, the rest
    from the deck stored in the checkpoint's root attribute `deck`);
  * GPT-2: x = wte[tok] + wpe[pos]; per layer (pre-LN)
        x = x + proj(causal_attn(LN1(x)));  x = x + fc2(gelu_tanh(fc1(LN2(x))))
    then a final LN and logits = x @ wte^T (tied); no dropout; the Llama-family variants (RMSNorm,
    rotary positions, SwiGLU, no linear biases, an untied output layer) and Qwen's (the qkv bias,
    grouped-query attention with kv_channels, per-head q / k norms), from the deck;
  * mixture of experts ([moe] num_experts > 0; Megatron's flag names): the MoE layers' MLP is
    torch_reference's Transformer.moe (a top-k router, experts, a shared expert), each
    micro-batch routed on its own;
  * loss = mean next-token cross-entropy over all B*T tokens of the global batch; with MoE the
    objective adds, per MoE layer, the mean over micro-batches of aux_loss_coeff * aux +
    z_loss_coeff * z (the `loss` reported and compared is the cross-entropy alone; the unscaled
    aux and z losses and the expert loads are compared as the metrics columns moe_*), and the
    sigmoid router's expert bias is updated after each optimizer step (MoEStats);
  * global-norm clipping, Megatron-style LR schedule, AdamW (torch.optim.AdamW's update
    rule, decoupled weight decay on >= 2-D parameters only).

Sub-commands
  compare  train N steps from a checkpoint on Trident's batches and compare per-step loss,
           lr and grad norm (metrics CSV; MoE: also moe_aux_loss, moe_z_loss, moe_max_load,
           moe_dropped when Trident's CSV has them) and the step-1 gradients (grads.h5) with Trident's.
           A bf16 / fp16 run (the checkpoint's precision.dtype; --emulate) is compared with an
           emulation of Trident's 16-bit rounding points (GPTReference16, MasterAdamW: float64
           arithmetic between them, fp32 masters), plus two checks from Trident's own state: the
           loss of the iteration after each parameter dump, and the update of Trident's step-1
           gradients, which must reproduce its 16-bit model bit for bit.
  eval     recompute Trident's evaluation mode (`eval loss: <value>`) on a token shard.

Exit status: 0 = pass, 1 = a tolerance was exceeded, 2 = bad input (missing file, dataset,
deck key, or a shape mismatch).

Threads: the number of BLAS/OpenMP threads is fixed before torch is imported (from --threads,
default 2) unless OMP_NUM_THREADS / OPENBLAS_NUM_THREADS are already set in the environment;
on a shared machine set e.g. `OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2` explicitly.
"""

import os
import sys


def _threads_from_argv(argv, default=2):
    """--threads must take effect before torch (and its BLAS) is loaded."""
    for k, a in enumerate(argv):
        if a == "--threads" and k + 1 < len(argv):
            return argv[k + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return str(default)


if __name__ == "__main__":
    _t = _threads_from_argv(sys.argv)
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, _t)

import argparse  # noqa: E402
import configparser  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from fractions import Fraction  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as tr  # noqa: E402  (the layer's math, shared with the BERT and T5 references)


def tune_malloc():
    """Keep freed memory in the process instead of returning it to the kernel.

    Every step allocates and frees the same large blocks (the (B*T, V) logits and their
    gradient, the (V, C) embedding gradient, AdamW temporaries). glibc serves blocks above 32 MiB
    with fresh mmaps, so each step page-faults them in again: measured 4x slower steps on the
    20-step case (most of it system time). Disabling mmap for malloc and trimming makes the heap
    reuse them. Only the CLIs call this; it is a no-op where glibc's mallopt is unavailable."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
        libc.mallopt(M_MMAP_MAX, 0)
        libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
        libc.mallopt(M_TOP_PAD, 64 << 20)
    except (OSError, AttributeError):
        pass


class InputError(Exception):
    """Missing file / dataset / deck key, or inconsistent shapes: exit status 2."""


# --------------------------------------------------------------------------------------
# Deck and configuration
# --------------------------------------------------------------------------------------

def parse_deck(text):
    cp = configparser.ConfigParser(interpolation=None, strict=False,
                                   inline_comment_prefixes=("#", ";"))
    cp.optionxform = str  # keep key case
    try:
        cp.read_string(text)
    except configparser.Error as e:
        raise InputError("cannot parse the checkpoint's deck: %s" % e)
    return cp


def _deck_get(cp, section, key, conv, default=None):
    if cp.has_section(section) and cp.has_option(section, key):
        raw = cp.get(section, key).strip()
        try:
            return conv(raw)
        except ValueError:
            raise InputError("deck key [%s] %s: bad value %r" % (section, key, raw))
    if default is None:
        raise InputError("deck key [%s] %s is missing" % (section, key))
    return default


def _to_bool(s):
    v = s.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise ValueError(s)


def _to_int(s):
    f = float(s)
    if f != int(f):
        raise ValueError(s)
    return int(f)


class Config:
    """Everything the reference needs: model shapes (checkpoint) + deck hyper-parameters."""

    def __init__(self, cp, shapes):
        g = lambda s, k, c=float, d=None: _deck_get(cp, s, k, c, d)  # noqa: E731
        self.num_layers = g("model", "num_layers", _to_int)
        self.hidden_size = g("model", "hidden_size", _to_int)
        self.num_heads = g("model", "num_heads", _to_int)
        self.ffn_hidden_size = g("model", "ffn_hidden_size", _to_int)
        self.seq_length = g("model", "seq_length", _to_int)
        self.max_position_embeddings = g("model", "max_position_embeddings", _to_int)
        # model.norm_epsilon, or its older name model.layernorm_epsilon (0 there: not given)
        alias = g("model", "layernorm_epsilon", float, 0.0)
        self.layernorm_epsilon = alias if alias > 0 else g("model", "norm_epsilon", float, 1e-5)
        # The Llama-family variants (Megatron's flags; docs/DESIGN.md "Layer spec"), defaults GPT-2's.
        self.normalization = g("model", "normalization", str, "LayerNorm").strip()
        self.position_embedding_type = g("model", "position_embedding_type", str, "learned_absolute").strip()
        self.rotary_base = g("model", "rotary_base", float, 10000.0)
        self.rotary_percent = g("model", "rotary_percent", float, 1.0)
        self.use_rope_scaling = g("model", "use_rope_scaling", _to_bool, False)
        self.rope_scaling_factor = g("model", "rope_scaling_factor", float, 8.0)
        self.rope_low_freq_factor = g("model", "rope_low_freq_factor", float, 1.0)
        self.rope_high_freq_factor = g("model", "rope_high_freq_factor", float, 4.0)
        self.rope_original_max = g("model", "rope_original_max_position_embeddings", float, 8192.0)
        self.swiglu = g("model", "swiglu", _to_bool, False)
        self.add_bias_linear = g("model", "add_bias_linear", _to_bool, True)
        self.add_qkv_bias = g("model", "add_qkv_bias", _to_bool, False)
        self.untied = g("model", "untie_embeddings_and_output_weights", _to_bool, False)
        # Attention (Megatron's --num-query-groups, --kv-channels, --qk-layernorm; 0 = derived):
        # key/value groups (num_heads: multi-head), channels per head (hidden_size / num_heads),
        # per-head norms of the queries and keys (Qwen 3)
        self.num_query_groups = g("model", "num_query_groups", _to_int, 0)
        self.kv_channels = g("model", "kv_channels", _to_int, 0)
        self.qk_layernorm = g("model", "qk_layernorm", _to_bool, False)
        if self.normalization not in ("LayerNorm", "RMSNorm"):
            raise InputError("deck key [model] normalization: unknown value %r" % self.normalization)
        if self.position_embedding_type not in ("learned_absolute", "rope", "none"):
            raise InputError("deck key [model] position_embedding_type: unknown value %r"
                             % self.position_embedding_type)
        # Document-aware packing (Megatron's --reset-position-ids, --reset-attention-mask,
        # --eod-mask-loss); the end-of-document id comes with compare --eod-id
        self.reset_position_ids = g("data", "reset_position_ids", _to_bool, False)
        self.reset_attention_mask = g("data", "reset_attention_mask", _to_bool, False)
        self.eod_mask_loss = g("data", "eod_mask_loss", _to_bool, False)
        self.eod_id = None
        # Instruction fine-tuning (sft.train_data): the batches are records of input tokens, targets
        # (-1: no loss) and each position's conversation (-1: padding), 3 x seq_length wide;
        # packing restarts at every change of conversation instead of after end-of-document tokens
        self.sft = bool(g("sft", "train_data", str, "").strip())
        self.hidden_dropout = g("model", "hidden_dropout", float, 0.0)
        self.attention_dropout = g("model", "attention_dropout", float, 0.0)

        self.micro_batch_size = g("train", "micro_batch_size", _to_int)
        self.global_batch_size = g("train", "global_batch_size", _to_int)
        self.train_iters = g("train", "iters", _to_int)

        self.lr = g("optim", "lr")
        self.min_lr = g("optim", "min_lr", float, 0.0)
        self.warmup_iters = g("optim", "warmup_iters", _to_int, 0)
        self.decay_iters = g("optim", "decay_iters", _to_int, 0)
        self.decay_style = g("optim", "decay_style", str, "cosine").strip().lower()
        self.weight_decay = g("optim", "weight_decay", float, 0.0)
        self.clip_grad = g("optim", "clip_grad", float, 0.0)
        self.beta1 = g("optim", "beta1", float, 0.9)
        self.beta2 = g("optim", "beta2", float, 0.999)
        self.eps = g("optim", "eps", float, 1e-8)
        self.precision = g("precision", "dtype", str, "fp32").strip().lower()
        if self.decay_style not in ("constant", "linear", "cosine"):
            raise InputError("deck key [optim] decay_style: unknown value %r" % self.decay_style)
        self._read_moe(g)

        # Trident's "0 = derived" conventions, in case a deck carries them unresolved.
        if self.ffn_hidden_size == 0:  # Megatron: 4h, or int(8h / 3 / 64) * 64 per half of a SwiGLU
            self.ffn_hidden_size = (8 * self.hidden_size // 3) // 64 * 64 if self.swiglu else 4 * self.hidden_size
        if self.max_position_embeddings == 0:
            self.max_position_embeddings = self.seq_length
        if self.moe_ffn_hidden_size == 0:  # [moe] ffn_hidden_size 0: each expert as wide as the dense MLP
            self.moe_ffn_hidden_size = self.ffn_hidden_size

        # Shapes: the checkpoint is authoritative, the deck must agree with it.
        V, C = shapes["model/embedding/word_embeddings"]
        self.vocab_size = V
        deck_vocab = g("model", "vocab_size", _to_int, 0)
        if deck_vocab not in (0, V):
            print("note: deck model.vocab_size = %d but the checkpoint's word_embeddings has %d rows"
                  " (the checkpoint is used; it must hold the unpadded vocabulary)" % (deck_vocab, V))
        self.learned_positions = self.position_embedding_type == "learned_absolute"
        P, C2 = shapes.get("model/embedding/position_embeddings", (self.max_position_embeddings, C))
        # ffn_hidden_size from the first dense layer's fc1 (layer 0 of a dense model)
        dense = [i for i in range(self.num_layers) if not self.moe_layers[i]]
        if dense:
            fc1 = "model/layers/%d/mlp/fc1/weight" % dense[0]
            if fc1 not in shapes:
                raise InputError("checkpoint: dataset %r is missing" % fc1)
            Fh = shapes[fc1][0] // (2 if self.swiglu else 1)  # SwiGLU: gate, up
        if C != self.hidden_size or C2 != C:
            raise InputError("hidden size: deck says %d, checkpoint embeddings are %s / %s"
                             % (self.hidden_size, shapes["model/embedding/word_embeddings"], (P, C2)))
        if P != self.max_position_embeddings:
            raise InputError("max_position_embeddings: deck says %d, checkpoint has %d rows"
                             % (self.max_position_embeddings, P))
        if dense and Fh != self.ffn_hidden_size:
            raise InputError("ffn_hidden_size: deck says %d, checkpoint fc1 has %d rows"
                             % (self.ffn_hidden_size, Fh))
        if self.num_experts > 0:
            self._check_moe_shapes(shapes, C)
        if self.num_heads <= 0 or self.num_query_groups < 0 or self.kv_channels < 0:
            raise InputError("deck keys [model] num_heads %d, num_query_groups %d, kv_channels %d: must be >= 0 "
                             "(num_heads > 0)" % (self.num_heads, self.num_query_groups, self.kv_channels))
        if self.kv_channels == 0 and C % self.num_heads:
            raise InputError("hidden_size %d is not a multiple of num_heads %d" % (C, self.num_heads))
        if self.num_query_groups == 0:
            self.num_query_groups = self.num_heads
        if self.num_heads % self.num_query_groups:
            raise InputError("num_heads %d is not a multiple of num_query_groups %d"
                             % (self.num_heads, self.num_query_groups))
        if self.seq_length > P:
            raise InputError("seq_length %d > max_position_embeddings %d" % (self.seq_length, P))
        if self.global_batch_size % self.micro_batch_size:
            raise InputError("global_batch_size %d is not a multiple of micro_batch_size %d"
                             % (self.global_batch_size, self.micro_batch_size))
        self.head_dim = self.kv_channels if self.kv_channels > 0 else C // self.num_heads
        self.rotary_dim = int(self.head_dim * self.rotary_percent)
        if self.position_embedding_type == "rope" and (self.rotary_dim <= 0 or self.rotary_dim % 2):
            raise InputError("rotary positions turn an even number of channels: head_dim %d x rotary_percent %g = %d"
                             % (self.head_dim, self.rotary_percent, self.rotary_dim))

    def _read_moe(self, g):
        """The [moe] section (Megatron's --num-experts, --moe-router-topk, --moe-ffn-hidden-size,
        --moe-layer-freq, --moe-shared-expert-intermediate-size, --moe-router-score-function,
        --moe-router-pre-softmax, --moe-aux-loss-coeff, --moe-z-loss-coeff,
        --moe-expert-capacity-factor, --moe-token-drop-policy, --moe-router-enable-expert-bias,
        --moe-router-bias-update-rate). num_experts 0 (the default): a dense model, moe_layers all
        False. layer_freq: an integer N (layer i, 0-based, is an MoE layer when i % N == 0) or a
        list [1,0,...] of num_layers 0 / 1 entries. ffn_hidden_size 0: model.ffn_hidden_size."""
        self.num_experts = g("moe", "num_experts", _to_int, 0)
        self.moe_router_topk = g("moe", "router_topk", _to_int, 2)
        self.moe_ffn_hidden_size = g("moe", "ffn_hidden_size", _to_int, 0)
        self.moe_layer_freq = g("moe", "layer_freq", str, "1").strip()
        self.moe_shared_expert_intermediate_size = g("moe", "shared_expert_intermediate_size", _to_int, 0)
        self.moe_router_score_function = g("moe", "router_score_function", str, "softmax").strip().lower()
        self.moe_router_pre_softmax = g("moe", "router_pre_softmax", _to_bool, False)
        self.moe_aux_loss_coeff = g("moe", "aux_loss_coeff", float, 0.0)
        self.moe_z_loss_coeff = g("moe", "z_loss_coeff", float, 0.0)
        self.moe_expert_capacity_factor = g("moe", "expert_capacity_factor", float, 0.0)
        self.moe_token_drop_policy = g("moe", "token_drop_policy", str, "probs").strip().lower()
        self.moe_router_enable_expert_bias = g("moe", "router_enable_expert_bias", _to_bool, False)
        self.moe_router_bias_update_rate = g("moe", "router_bias_update_rate", float, 1e-3)
        self.moe_layers = [False] * self.num_layers
        if self.num_experts == 0:
            return
        E, k = self.num_experts, self.moe_router_topk
        if E < 0:
            raise InputError("deck key [moe] num_experts: must be >= 0, got %d" % E)
        if not 1 <= k <= E:
            raise InputError("deck key [moe] router_topk: must be in 1..num_experts = %d, got %d" % (E, k))
        for key in ("ffn_hidden_size", "shared_expert_intermediate_size"):
            if getattr(self, "moe_" + key) < 0:
                raise InputError("deck key [moe] %s: must be >= 0, got %d" % (key, getattr(self, "moe_" + key)))
        for key in ("aux_loss_coeff", "z_loss_coeff", "expert_capacity_factor", "router_bias_update_rate"):
            v = getattr(self, "moe_" + key)
            if not (v >= 0.0 and math.isfinite(v)):
                raise InputError("deck key [moe] %s: must be a finite value >= 0, got %r" % (key, v))
        if self.moe_router_score_function not in tr.MOE_SCORE_FUNCTIONS:
            raise InputError("deck key [moe] router_score_function: unknown value %r (softmax or sigmoid)"
                             % self.moe_router_score_function)
        if self.moe_token_drop_policy not in tr.MOE_DROP_POLICIES:
            raise InputError("deck key [moe] token_drop_policy: unknown value %r (probs or position)"
                             % self.moe_token_drop_policy)
        if self.moe_router_enable_expert_bias and self.moe_router_score_function != "sigmoid":
            raise InputError("deck key [moe] router_enable_expert_bias: the expert bias needs "
                             "router_score_function = sigmoid (it is %s)" % self.moe_router_score_function)
        freq = self.moe_layer_freq
        if freq.startswith("["):
            if not freq.endswith("]"):
                raise InputError("deck key [moe] layer_freq: bad value %r" % freq)
            try:
                pattern = [_to_int(x) for x in freq[1:-1].split(",") if x.strip()]
            except ValueError:
                raise InputError("deck key [moe] layer_freq: bad value %r" % freq)
            if len(pattern) != self.num_layers or any(v not in (0, 1) for v in pattern):
                raise InputError("deck key [moe] layer_freq: %r must list num_layers = %d entries of 0 or 1"
                                 % (freq, self.num_layers))
            self.moe_layers = [v == 1 for v in pattern]
        else:
            try:
                n = _to_int(freq)
            except ValueError:
                raise InputError("deck key [moe] layer_freq: bad value %r (an integer or a list [1,0,...])" % freq)
            if n < 1:
                raise InputError("deck key [moe] layer_freq: must be >= 1, got %d" % n)
            self.moe_layers = [i % n == 0 for i in range(self.num_layers)]

    def _check_moe_shapes(self, shapes, C):
        """The first MoE layer's router [E, C], expert 0's fc1 (blocks x moe.ffn_hidden_size rows)
        and shared expert fc1 (blocks x shared_expert_intermediate_size rows) against the deck."""
        if not any(self.moe_layers):
            return
        i = self.moe_layers.index(True)
        blocks = 2 if self.swiglu else 1
        want = [("router/weight", (self.num_experts, C), "num_experts %d and hidden_size %d" % (self.num_experts, C)),
                ("experts/0/fc1/weight", (blocks * self.moe_ffn_hidden_size, C),
                 "moe.ffn_hidden_size %d%s" % (self.moe_ffn_hidden_size, " (SwiGLU: 2 x)" if self.swiglu else ""))]
        if self.moe_shared_expert_intermediate_size > 0:
            S = self.moe_shared_expert_intermediate_size
            want.append(("shared_experts/fc1/weight", (blocks * S, C),
                         "moe.shared_expert_intermediate_size %d%s" % (S, " (SwiGLU: 2 x)" if self.swiglu else "")))
        for name, shape, what in want:
            n = "model/layers/%d/mlp/%s" % (i, name)
            if n not in shapes:
                raise InputError("checkpoint: dataset %r of MoE layer %d is missing (deck [moe] layer_freq %s)"
                                 % (n, i, self.moe_layer_freq))
            if tuple(shapes[n]) != shape:
                raise InputError("%s has shape %s, the deck's %s want %s" % (n, tuple(shapes[n]), what, shape))


def attention_shape(cfg):
    """(num_heads nh, num_query_groups ng, head_dim d) of a config; one without the
    grouped-query keys (a duck-typed test config) is multi-head with d = C / nh."""
    nh = getattr(cfg, "num_heads", 1)
    return nh, getattr(cfg, "num_query_groups", nh) or nh, getattr(cfg, "head_dim", cfg.hidden_size // nh)


def moe_layer_flags(cfg):
    """[bool] per layer: an MoE layer (configs without the [moe] keys: all dense)."""
    flags = getattr(cfg, "moe_layers", None)
    if not getattr(cfg, "num_experts", 0) or flags is None:
        return [False] * cfg.num_layers
    return list(flags)


def is_moe(cfg):
    """The model has at least one MoE layer."""
    return any(moe_layer_flags(cfg))


def expected_shapes(cfg):
    """{checkpoint dataset name: shape} of every GPT parameter, in a fixed order. GPT-2: learned
    positions, LayerNorm weight and bias, biases everywhere; the Llama variants drop the position
    table (rope, none), the norms' biases (RMSNorm) and the linears' biases (add_bias_linear false;
    add_qkv_bias keeps qkv's), and a SwiGLU fc1 holds gate then up (2F rows). Attention: qkv has
    (nh + 2 ng) d rows (q heads | k groups | v groups, each head d contiguous rows), proj nh d
    columns; qk_layernorm adds self_attention/{q,k}_layernorm of d (weight, and bias under
    LayerNorm). An MoE layer's mlp/ (instead of fc1, fc2): router/weight [E, C] (no bias),
    router/expert_bias [E] (router_enable_expert_bias; a buffer, not a parameter: buffer_names),
    experts/<j>/fc1 [blocks Fe, C] and fc2 [C, Fe] for j = 0..E-1 and, with
    shared_expert_intermediate_size S > 0, shared_experts/fc1 [blocks S, C] and fc2 [C, S]
    (biases as the dense MLP's: add_bias_linear)."""
    V, P, C, Fh = cfg.vocab_size, cfg.max_position_embeddings, cfg.hidden_size, cfg.ffn_hidden_size
    F1 = 2 * Fh if cfg.swiglu else Fh
    nh, ng, d = attention_shape(cfg)
    out = {"model/embedding/word_embeddings": (V, C)}
    if cfg.learned_positions:
        out["model/embedding/position_embeddings"] = (P, C)

    def norm(name, width=C):
        out[name + "/weight"] = (width,)
        if cfg.normalization == "LayerNorm":
            out[name + "/bias"] = (width,)

    def linear(name, rows, cols, bias):
        out[name + "/weight"] = (rows, cols)
        if bias:
            out[name + "/bias"] = (rows,)

    moe = moe_layer_flags(cfg)
    for i in range(cfg.num_layers):
        p = "model/layers/%d/" % i
        norm(p + "input_layernorm")
        linear(p + "self_attention/qkv", (nh + 2 * ng) * d, C, cfg.add_bias_linear or cfg.add_qkv_bias)
        if getattr(cfg, "qk_layernorm", False):
            norm(p + "self_attention/q_layernorm", d)
            norm(p + "self_attention/k_layernorm", d)
        linear(p + "self_attention/proj", C, nh * d, cfg.add_bias_linear)
        norm(p + "post_attention_layernorm")
        if moe[i]:
            blocks = 2 if cfg.swiglu else 1
            Fe, S = cfg.moe_ffn_hidden_size, cfg.moe_shared_expert_intermediate_size
            linear(p + "mlp/router", cfg.num_experts, C, False)
            if cfg.moe_router_enable_expert_bias:
                out[p + "mlp/router/expert_bias"] = (cfg.num_experts,)
            for j in range(cfg.num_experts):
                linear(p + "mlp/experts/%d/fc1" % j, blocks * Fe, C, cfg.add_bias_linear)
                linear(p + "mlp/experts/%d/fc2" % j, C, Fe, cfg.add_bias_linear)
            if S > 0:
                linear(p + "mlp/shared_experts/fc1", blocks * S, C, cfg.add_bias_linear)
                linear(p + "mlp/shared_experts/fc2", C, S, cfg.add_bias_linear)
            continue
        linear(p + "mlp/fc1", F1, C, cfg.add_bias_linear)
        linear(p + "mlp/fc2", C, Fh, cfg.add_bias_linear)
    norm("model/final_layernorm")
    if cfg.untied:  # an output layer of its own (Megatron's output_layer, Hugging Face's lm_head)
        out["model/output_layer/weight"] = (V, C)
    return out


def param_names(cfg):
    """Checkpoint dataset names of all trained GPT parameters, in a fixed order (the MoE
    routers' expert biases are not among them: buffer_names)."""
    return [n for n in expected_shapes(cfg) if not n.endswith("/router/expert_bias")]


def buffer_names(cfg):
    """Checkpoint datasets of the model that the optimizer does not train: the sigmoid routers'
    expert biases (router_enable_expert_bias), updated by MoEStats.update_expert_bias."""
    return [n for n in expected_shapes(cfg) if n.endswith("/router/expert_bias")]


def _need_file(path, what):
    if not path or not os.path.isfile(path):
        raise InputError("%s file not found: %r" % (what, path))


def _read_dataset(f, name, fname):
    if name not in f:
        raise InputError("%s: dataset %r is missing" % (fname, name))
    obj = f[name]
    if not isinstance(obj, h5py.Dataset):
        raise InputError("%s: %r is not a dataset" % (fname, name))
    return obj[()]


def _attr_str(v):
    if isinstance(v, bytes):
        return v.decode("utf-8")
    if isinstance(v, np.ndarray) and v.shape == ():
        return _attr_str(v[()])
    return str(v)


class Checkpoint:
    """A Trident GPT checkpoint read into numpy arrays (float64)."""

    def __init__(self, path, need_optimizer=None):
        _need_file(path, "checkpoint")
        with h5py.File(path, "r") as f:
            a = f.attrs
            if "deck" not in a:
                raise InputError("%s: root attribute 'deck' is missing" % path)
            fmt = _attr_str(a.get("format", ""))
            if fmt and fmt != "trident.checkpoint":
                raise InputError("%s: format is %r, expected 'trident.checkpoint'" % (path, fmt))
            model = _attr_str(a.get("model", "gpt"))
            if model != "gpt":
                raise InputError("%s: model is %r, expected 'gpt'" % (path, model))
            self.deck_text = _attr_str(a["deck"])
            self.iteration = int(a.get("iteration", 0))
            self.consumed_samples = int(a.get("consumed_samples", 0))
            self.format_version = int(a.get("format_version", 0))
            # Adam's step count (fewer than the iterations when fp16 steps were skipped)
            self.optimizer_steps = int(a.get("optimizer_steps", self.iteration))
            cp = parse_deck(self.deck_text)

            # Shapes needed to size the model are read first (layer 0's MLP: dense, or MoE experts).
            for n in ("model/embedding/word_embeddings", "model/layers/0/mlp/fc1/weight"):
                if n not in f and not (n.endswith("mlp/fc1/weight") and "model/layers/0/mlp/experts/0/fc1/weight" in f):
                    raise InputError("%s: dataset %r is missing" % (path, n))
            shapes = {n: tuple(f[n].shape) for n in
                      ("model/embedding/word_embeddings", "model/embedding/position_embeddings",
                       "model/layers/0/mlp/fc1/weight") if n in f}
            if "moe" in cp:  # the shapes of every layer's MLP (which layers are MoE layers: the deck)
                f["model"].visititems(lambda n, d: shapes.__setitem__("model/" + n, tuple(d.shape))
                                      if isinstance(d, h5py.Dataset) and "/mlp/" in "model/" + n else None)
            self.config = Config(cp, shapes)
            L = self.config.num_layers
            if "model/layers/%d" % L in f:
                raise InputError("%s: has more layers than the deck's num_layers = %d" % (path, L))
            for i, moe in enumerate(moe_layer_flags(self.config)):
                if moe and "model/layers/%d/mlp/experts/%d" % (i, self.config.num_experts) in f:
                    raise InputError("%s: layer %d has more experts than the deck's num_experts = %d"
                                     % (path, i, self.config.num_experts))
                if moe and "model/layers/%d/mlp/fc1" % i in f:
                    raise InputError("%s: layer %d has a dense mlp/fc1, the deck's [moe] layer_freq %s makes it an MoE layer"
                                     % (path, i, self.config.moe_layer_freq))
                if not moe and "model/layers/%d/mlp/router" % i in f:
                    raise InputError("%s: layer %d has a router, the deck makes it a dense layer ([moe] num_experts %d, "
                                     "layer_freq %s)" % (path, i, self.config.num_experts, self.config.moe_layer_freq))

            exp = expected_shapes(self.config)
            self.names = param_names(self.config)
            self.params = {}  # the trained parameters (names) and the MoE expert biases (buffer_names)
            for n in self.names + buffer_names(self.config):
                arr = _read_dataset(f, n, path)
                if tuple(arr.shape) != exp[n]:
                    raise InputError("%s: %s has shape %s, expected %s"
                                     % (path, n, tuple(arr.shape), exp[n]))
                self.params[n] = np.asarray(arr, dtype=np.float64)

            # Optimizer state: required when resuming (iteration > 0), ignored at 0.
            if need_optimizer is None:
                need_optimizer = self.iteration > 0
            # fp32 master weights (16-bit runs: optimizer/master/...), when the checkpoint has them
            self.masters = None
            if "optimizer/master" in f:
                self.masters = {}
                for n in self.names:
                    arr = _read_dataset(f, "optimizer/master/" + n, path)
                    if tuple(arr.shape) != exp[n]:
                        raise InputError("%s: optimizer/master/%s has shape %s, expected %s"
                                         % (path, n, tuple(arr.shape), exp[n]))
                    self.masters[n] = np.asarray(arr, dtype=np.float64)
            self.exp_avg = self.exp_avg_sq = None
            if need_optimizer:
                self.exp_avg, self.exp_avg_sq = {}, {}
                for n in self.names:
                    for key, store in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)):
                        arr = _read_dataset(f, "optimizer/%s/%s" % (key, n), path)
                        if tuple(arr.shape) != exp[n]:
                            raise InputError("%s: optimizer/%s/%s has shape %s, expected %s"
                                             % (path, key, n, tuple(arr.shape), exp[n]))
                        store[n] = np.asarray(arr, dtype=np.float64)


# --------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------

def layer_spec(cfg):
    """The torch_reference.LayerSpec of a config (duck-typed test configs without the rotary or
    grouped-query keys are GPT-2's multi-head layer)."""
    nh, ng, d = attention_shape(cfg)
    rotary = None
    if cfg.position_embedding_type == "rope":
        scaling = ((cfg.rope_scaling_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor, cfg.rope_original_max)
                   if cfg.use_rope_scaling else None)
        rotary = tr.Rotary(cfg.rotary_dim, cfg.rotary_base, scaling)
    moe = None
    if is_moe(cfg):  # each micro-batch's tokens routed together
        moe = tr.MoESpec(cfg.num_experts, cfg.moe_router_topk, cfg.moe_router_score_function, cfg.moe_router_pre_softmax,
                         cfg.moe_expert_capacity_factor, cfg.moe_token_drop_policy, cfg.moe_router_enable_expert_bias,
                         group_rows=cfg.micro_batch_size)
    return tr.LayerSpec(nh, d, ng, cfg.normalization, cfg.layernorm_epsilon, rotary, cfg.swiglu,
                        getattr(cfg, "qk_layernorm", False), moe)


class GPTReference(tr.Transformer):
    """GPT as a plain function of a dict of leaf tensors (named as in the checkpoint): GPT-2's
    layer or its variants (layer_spec), torch_reference's math. MoE models: the expert biases
    (buffer_names) are plain tensors in `buffers`, and every MoE layer's router statistics of
    each micro-batch are kept in `moe_records` (moe_take hands them out)."""

    def __init__(self, cfg, params_np, dtype=torch.float64):
        self.cfg = cfg
        self.dtype = dtype
        self.names = param_names(cfg)
        super().__init__({n: torch.tensor(params_np[n], dtype=dtype).requires_grad_(True) for n in self.names},
                         layer_spec(cfg), {n: torch.tensor(params_np[n], dtype=dtype) for n in buffer_names(cfg)})
        self.tape = None  # a DropoutTape: Trident's masks applied where Trident applies them
        self.moe_records = []  # (layer prefix, record) of Transformer.moe, in call order

    def moe_record(self, prefix, record):
        self.moe_records.append((prefix, record))

    def moe_take(self):
        """The router statistics recorded since the last call (and forget them)."""
        out, self.moe_records = self.moe_records, []
        return out

    def drop(self, x, site, layer, which, shape):
        """x with Trident's recorded mask of this call applied and kept values scaled by 1/(1-p)
        (inverted dropout); x unchanged without dropout. `shape` is the mask's shape in the
        tape (Trident's layout of the call's elements), x is viewed as it for the product."""
        if self.tape is None:
            return x
        p = getattr(self.cfg, which)  # hidden_dropout or attention_dropout
        if p <= 0:
            return x
        return tr.apply_mask(x, self.tape.next(site, layer, p, shape), 1.0 / (1.0 - p), shape)

    def _output_weight(self):
        p = self.params
        return p["model/output_layer/weight"] if self.cfg.untied else p["model/embedding/word_embeddings"]

    def packing(self, inp, conv=None):
        """Megatron's masks and positions of packed documents (get_ltor_masks_and_position_ids) for
        a (B, T) tensor of input tokens: after each end-of-document token at i, the later tokens
        no longer attend to positions <= i (reset_attention_mask) and their positions restart at 0
        (reset_position_ids). With conv (B, T), instruction fine-tuning's conversation index of each
        position, the documents are the runs of equal conv instead. Returns (allowed (B, T, T) or
        None, positions (B, T) or None)."""
        cfg = self.cfg
        reset_positions = getattr(cfg, "reset_position_ids", False)  # (configs made elsewhere: off)
        reset_mask = getattr(cfg, "reset_attention_mask", False)
        if not (reset_positions or reset_mask):
            return None, None
        B, T = inp.shape
        allowed = torch.ones(B, T, T, dtype=torch.bool).tril()
        positions = torch.arange(T, dtype=torch.int64).repeat(B, 1)
        if conv is not None:
            for b in range(B):
                start = 0
                for t in range(T):
                    if t > 0 and int(conv[b, t]) != int(conv[b, t - 1]):
                        start = t
                    if reset_mask:
                        allowed[b, t, :start] = False
                    if reset_positions:
                        positions[b, t] = t - start
            return (allowed if reset_mask else None, positions if reset_positions else None)
        for b in range(B):
            prev = 0
            for i in (inp[b] == cfg.eod_id).nonzero().flatten().tolist():
                if reset_mask:
                    allowed[b, i + 1:, :i + 1] = False
                if reset_positions:
                    positions[b, i + 1:] -= i + 1 - prev
                    prev = i + 1
        return (allowed if reset_mask else None, positions if reset_positions else None)

    def _hidden(self, inp, dropout, conv=None):
        """The final norm's output (B, T, C) of a (B, T) int64 tensor of tokens."""
        cfg, p = self.cfg, self.params
        B, T = inp.shape
        allowed, positions = self.packing(inp, conv)
        x = p["model/embedding/word_embeddings"][inp]                           # (B, T, C)
        if cfg.learned_positions:
            wpe = p["model/embedding/position_embeddings"]
            x = x + (wpe[:T].unsqueeze(0) if positions is None else wpe[positions])
        if dropout:
            x = self.drop(x, "embedding", -1, "hidden_dropout", (B * T, cfg.hidden_size))
        for i in range(cfg.num_layers):
            x = self.layer(x, "model/layers/%d/" % i, i, causal=True, allowed=allowed, positions=positions)
        return self.store(self.norm(x, "model/final_layernorm"))

    def logits(self, inp):
        """Next-token logits (B, T, V) of a (B, T) int64 tensor of tokens (no dropout)."""
        return self.grad_store(F.linear(self._hidden(inp, False), self._output_weight()))

    def loss_sum(self, windows):
        """Sum of next-token cross-entropies over a (B, T+1) int64 tensor of windows (with
        eod_mask_loss: over the predictions made at inputs other than the end-of-document token)."""
        if getattr(self.cfg, "sft", False):  # instruction fine-tuning records: only targets >= 0 count
            S = self.cfg.seq_length
            inp, tgt, conv = windows[:, :S], windows[:, S:2 * S], windows[:, 2 * S:]
            B, T = inp.shape
            x = self._hidden(inp, True, conv)
            logits = self.grad_store(F.linear(x.reshape(B * T, self.cfg.hidden_size), self._output_weight()))
            return F.cross_entropy(logits, tgt.reshape(B * T), ignore_index=-1, reduction="sum")
        inp, tgt = windows[:, :-1], windows[:, 1:]
        B, T = inp.shape
        x = self._hidden(inp, True)
        logits = self.grad_store(F.linear(x.reshape(B * T, self.cfg.hidden_size), self._output_weight()))  # (B*T, V)
        losses = F.cross_entropy(logits, tgt.reshape(B * T), reduction="none")
        if getattr(self.cfg, "eod_mask_loss", False):
            losses = losses * (inp.reshape(B * T) != self.cfg.eod_id).to(losses.dtype)
        return losses.sum()

    def loss_count(self, windows):
        """The predictions the loss counts in windows (B, T+1)."""
        if getattr(self.cfg, "sft", False):
            S = self.cfg.seq_length
            return int((windows[:, S:2 * S] >= 0).sum())
        inp = windows[:, :-1]
        if getattr(self.cfg, "eod_mask_loss", False):
            return int((inp != self.cfg.eod_id).sum())
        return inp.numel()


# --------------------------------------------------------------------------------------
# 16-bit emulation (compare --emulate bf16 | fp16)
# --------------------------------------------------------------------------------------
#
# Trident's mixed precision (precision.dtype = bf16 or fp16) keeps the parameters, and every
# activation that feeds a GEMM, as 16-bit words; GEMMs take 16-bit inputs and accumulate in fp32;
# the residual stream, LayerNorm statistics, softmax, cross-entropy and all gradients are fp32,
# except that a gradient entering a GEMM is first packed into 16 bits; AdamW updates fp32 master
# weights and the 16-bit model is the rounded masters. GPTReference16 computes in float64 (for
# fp32 accumulation) and rounds to nearest even exactly where Trident does:
#
#   forward  (value rounded; the gradient passes through unchanged, as Trident's fp32 gradient
#            w.r.t. a stored activation does)
#     * LayerNorm outputs ln1, ln2, final LN          ops/layernorm.cpp layernorm_forward<Bf16Fmt>
#     * qkv = round(ln1 W^T + b)                      parallel_linear.cpp ColumnParallelLinear::forward
#                                                     (gemm_mixed, add_bias_pack_half)
#     * attention probabilities round(softmax)        ops/attention.cpp probs_half (pack_half att);
#       with dropout round(dropout(softmax))          (pack_half att_drop, from the unrounded p)
#     * attention output round(P V)                   ops/attention.cpp context_half
#     * fc1 output round(y + b), GELU round(gelu(.)) ops/fused.cpp bias_gelu<Bf16Fmt>
#     * parameters: the 16-bit model                  optim/adamw.cpp HalfCopy (step_mixed)
#   the variants (Trident's contract for them; torch_reference.Transformer's store points):
#     * RMSNorm outputs round(x rstd w), the product x rstd w not rounded in between
#     * a linear without bias: round(GEMM output) where Trident stores it (qkv, fc1); proj, fc2
#       and the output layer unrounded, their output gradient rounded as above
#     * q / k norms (qk_layernorm): from the stored qkv, computed wider, round(x^ w [+ b]) once
#     * rotary positions: the stored q and k turned with the fp32 cos / sin table (computed in
#       double), round(x cos + rotate_half(x) sin) once; the gradient turned back unrounded
#     * SwiGLU: fc1's 2F outputs round(y [+ b]) kept, round(silu(gate) up) from them
#     * grouped-query attention: as multi-head, query head h with its group's stored k and v
#     * the untied output layer: the tied head's logits with model/output_layer/weight
#   MoE layers (torch_reference.Transformer.moe; layers/moe_mlp.cpp), with no hook of their own:
#     * the router: logits = x W_r^T of the stored 16-bit x and the 16-bit router weight in fp32,
#       not rounded (moe_tokens' plain F.linear); routing, probabilities, aux and z losses and the
#       router's backward (d x, d W_r) fp32
#     * each expert is the dense MLP on its rows (Transformer.mlp under experts/<j>/, the hooks
#       above): fc1 round(y [+ b]) kept, round(act(.)), fc2's output fp32 with its bias; the
#       gradient entering fc2 (p * d out) and fc1's (d pre) rounded; d p = d out . y_j fp32
#     * the weighted combination sum_j p y_j and the shared expert (a dense MLP) added in fp32
#     * the MoE terms of the objective weighted by Trident's fp32 float(loss_scale / micro-batches)
#       (Trainer._step16)
#   backward (the gradient rounded before it enters a GEMM; identity forward)
#     * d logits -> dlogits16                         models/gpt_model.cpp GptModel::head
#     * d(GEMM output) of qkv, proj, fc1, fc2         parallel_linear.cpp *ParallelLinear::backward
#       (the bias gradient sums the unrounded fp32     (pack_half dy16; bias_backward on fp32 dy)
#       gradient)
#     * d attention output (dy16), d scores (ds16)    ops/attention.cpp backward_half
#     * the softmax backward uses the STORED (rounded) probabilities (backward_half: att32)
#   optimizer: fp32 masters and moments, the update in fp32 arithmetic in the kernel's order
#     (optim/adamw.cpp adamw_kernel), the gradient read as its fp32 main gradient; fp16: the loss
#     gradient scaled by Trident's loss scale of the iteration (metrics CSV), unscaled before
#     the update, steps with non-finite gradients skipped.
#
# What remains between Trident and this emulation is fp32 against float64 arithmetic before each
# rounding point (summation order of GEMMs and reductions, Trident's polynomial exp and tanh): an
# fp32 result that lies within its own rounding error of a 16-bit tie rounds the other way, one
# 16-bit unit in one element.

EMULATE_CHOICES = ("auto", "none", "bf16", "fp16")


def round16(x, fmt):
    """x rounded as Trident stores a float in 16 bits (common/half.hpp): to fp32 first (the value
    Trident holds, which the reference's float64 stands for), then to the nearest bf16 or fp16
    value, ties to even (torch's conversions round so: fp16 with subnormals and overflow to
    infinity, bf16 with overflow to infinity, as float_to_fp16 / float_to_bf16 do; checked
    bitwise against half.hpp's bf16 formula on random values and on every kind of tie). Same
    dtype as x."""
    f = x.detach().to(torch.float32)
    if fmt == "bf16":
        return f.to(torch.bfloat16).to(x.dtype)
    if fmt == "fp16":
        return f.to(torch.float16).to(x.dtype)
    raise ValueError("round16: unknown 16-bit format %r" % fmt)


class _Round(torch.autograd.Function):
    """A 16-bit store of an activation: the value is rounded; the gradient passes unchanged."""

    @staticmethod
    def forward(ctx, x, fmt):
        return round16(x, fmt)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _RoundGrad(torch.autograd.Function):
    """Identity; the gradient is rounded to 16 bits on its way back (Trident packs it into 16
    bits before the GEMMs that consume it)."""

    @staticmethod
    def forward(ctx, x, fmt):
        ctx.fmt = fmt
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return round16(g, ctx.fmt), None


class _RoundBoth(torch.autograd.Function):
    """Rounded forward and backward (the attention output: stored in 16 bits, and its gradient
    packed into 16 bits before the attention's GEMMs)."""

    @staticmethod
    def forward(ctx, x, fmt):
        ctx.fmt = fmt
        return round16(x, fmt)

    @staticmethod
    def backward(ctx, g):
        return round16(g, ctx.fmt), None


class _StoredSoftmax(torch.autograd.Function):
    """Attention probabilities as Trident's 16-bit path stores them: softmax over the last axis of
    the (scaled, masked) scores, rounded; with dropout (keep = mask / (1 - p), or None) the
    probabilities the context GEMM reads are round(keep * softmax) of the unrounded softmax. The
    backward pass is the softmax backward evaluated with the stored, rounded probabilities (not
    with the exact softmax), as ops/attention.cpp backward_half does."""

    @staticmethod
    def forward(ctx, s, fmt, keep):
        p = torch.softmax(s, dim=-1)
        p16 = round16(p, fmt)
        ctx.save_for_backward(p16, keep)
        return p16 if keep is None else round16(p * keep, fmt)

    @staticmethod
    def backward(ctx, g):
        p16, keep = ctx.saved_tensors
        if keep is not None:
            g = g * keep
        return p16 * (g - (g * p16).sum(dim=-1, keepdim=True)), None, None


class GPTReference16(GPTReference):
    """GPTReference with Trident's 16-bit rounding points (see above): torch_reference's layer with
    its hooks as Trident's 16-bit stores. Its leaf tensors hold the 16-bit model (float64 tensors
    of bf16 / fp16 values): their gradients are Trident's main gradients; MasterAdamW keeps the
    fp32 masters and writes the rounded masters back. MoE layers need no hook of their own: the
    router is an fp32 linear of the stored input, each expert and the shared expert the dense
    MLP's call (see above)."""

    def __init__(self, cfg, params_np, fmt, dtype=torch.float64):
        super().__init__(cfg, params_np, dtype)
        self.fmt = fmt

    def store(self, x):
        return _Round.apply(x, self.fmt)

    def grad_store(self, x):
        return _RoundGrad.apply(x, self.fmt)

    def store_both(self, x):
        return _RoundBoth.apply(x, self.fmt)

    def linear(self, a, name):
        """A linear layer: the GEMM output's gradient enters the GEMMs rounded, the bias
        gradient is the sum of the unrounded one; the layer rounds the value where Trident
        stores it in 16 bits (qkv, fc1) and keeps it fp32 where it joins the residual stream."""
        y = self.grad_store(F.linear(a, self.params[name + "/weight"]))
        b = self.params.get(name + "/bias")
        return y if b is None else y + b

    def rotary_tables(self, T, dtype):
        """Trident's table: cos and sin computed in double, kept in fp32."""
        cos, sin = self.spec.rotary.tables(T)
        return cos.float().to(dtype), sin.float().to(dtype)

    @staticmethod
    def _keep_scale(p):
        """Trident's dropout scale, fp32: 1.f / (1.f - p) with p the float of the deck's value."""
        one = np.float32(1.0)
        return float(one / (one - np.float32(p)))

    def drop(self, x, site, layer, which, shape):
        """As GPTReference.drop, with Trident's fp32 scale of the kept values."""
        if self.tape is None:
            return x
        p = getattr(self.cfg, which)
        if p <= 0:
            return x
        return tr.apply_mask(x, self.tape.next(site, layer, p, shape), self._keep_scale(p), shape)

    def softmax_probs(self, s, site, layer):
        keep = None
        pd = self.cfg.attention_dropout
        if self.tape is not None and pd > 0:
            k = self.tape.next(site, layer, pd, tuple(s.shape))
            keep = (torch.as_tensor(k, dtype=s.dtype) * self._keep_scale(pd)).reshape(s.shape)
        return _StoredSoftmax.apply(s, self.fmt, keep)


# --------------------------------------------------------------------------------------
# Schedule and optimizer
# --------------------------------------------------------------------------------------

def lr_at(cfg, i):
    """Learning rate of iteration i (1-based), Megatron-style warmup + decay."""
    if cfg.warmup_iters > 0 and i <= cfg.warmup_iters:
        return cfg.lr * i / cfg.warmup_iters
    if cfg.decay_style == "constant":
        return cfg.lr
    D = cfg.decay_iters if cfg.decay_iters > 0 else cfg.train_iters
    if i > D:
        return cfg.min_lr
    r = (i - cfg.warmup_iters) / (D - cfg.warmup_iters)
    if cfg.decay_style == "cosine":
        return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * r)) * (cfg.lr - cfg.min_lr)
    return cfg.min_lr + (1.0 - r) * (cfg.lr - cfg.min_lr)


class AdamW:
    """torch.optim.AdamW's single-tensor update, written out so that the state (step, moments)
    can be loaded from a Trident checkpoint:
        p *= 1 - lr*wd ; m = b1 m + (1-b1) g ; v = b2 v + (1-b2) g^2
        p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
    Weight decay only on parameters with >= 2 dimensions."""

    def __init__(self, params, cfg, step=0, exp_avg=None, exp_avg_sq=None):
        self.params, self.cfg, self.step_count = params, cfg, step
        self.m, self.v = {}, {}
        for n, p in params.items():
            self.m[n] = (torch.tensor(exp_avg[n], dtype=p.dtype) if exp_avg is not None
                         else torch.zeros_like(p, requires_grad=False))
            self.v[n] = (torch.tensor(exp_avg_sq[n], dtype=p.dtype) if exp_avg_sq is not None
                         else torch.zeros_like(p, requires_grad=False))

    @torch.no_grad()
    def step(self, lr):
        c = self.cfg
        self.step_count += 1
        t = self.step_count
        bc1 = 1.0 - c.beta1 ** t
        bc2 = 1.0 - c.beta2 ** t
        for n, p in self.params.items():
            g = p.grad
            if p.dim() >= 2 and c.weight_decay != 0.0:
                p.mul_(1.0 - lr * c.weight_decay)
            m, v = self.m[n], self.v[n]
            m.mul_(c.beta1).add_(g, alpha=1.0 - c.beta1)
            v.mul_(c.beta2).addcmul_(g, g, value=1.0 - c.beta2)
            denom = (v.sqrt() / math.sqrt(bc2)).add_(c.eps)
            p.addcdiv_(m, denom, value=-lr / bc1)


def fma32(a, b, c):
    """a * b + c for float32 tensors, rounded once to float32 (a fused multiply-add): the product
    is exact in float64 and the float64 sum rounds to float32 correctly unless it lies exactly
    halfway between two floats (or is tiny); there the float64 sum's own rounding error (TwoSum)
    decides the direction."""
    p = a.double() * b.double()
    cd = c.double()
    s = p + cd
    r = s.float()
    # float32 midpoints among normal float64 values: the 29 low mantissa bits are 1 << 28
    suspect = ((s.view(torch.int64) & 0x1FFFFFFF) == 0x10000000) | (s.abs() < 2.0 ** -125)
    if bool(suspect.any()):
        i = suspect.nonzero(as_tuple=True)
        ps, cs, ss, rs = p[i], cd[i], s[i], r[i]
        bb = ss - ps
        err = (ps - (ss - bb)) + (cs - bb)  # exact: ss + err == ps + cs
        rd = rs.double()
        other = torch.nextafter(rs, torch.where(ss > rd, torch.full_like(rs, math.inf), torch.full_like(rs, -math.inf)))
        tie = (ss != rd) & (ss == (rd + other.double()) * 0.5) & (err != 0)
        r[i] = torch.where(tie & ((err > 0) == (other.double() > ss)), other, rs)
    return r


class MasterAdamW:
    """Trident's mixed-precision AdamW (optim/adamw.cpp, AdamW::step_mixed): fp32 master weights
    and moments; each step computes, per element and in fp32 arithmetic in the kernel's order,
        g = g32 * clip ; w = master * decay (>= 2-D tensors) ;
        m = fma(b1, m, (1-b1) g) ; v = fma(b2, v, ((1-b2) g) g) ;
        master = w - (step_size m) / (sqrt(v) / sqrt_bc2 + eps)
    with the kernel's fp32 constants (step_size = float(lr) / float(1 - b1^t), sqrt_bc2 =
    float(sqrt(1 - b2^t)), decay = float(1 - lr wd) with 1 - lr wd one fused multiply-add in
    double) and g32 the gradient as an fp32 main gradient; then the 16-bit model (the
    reference's leaf tensors) = round16(master). The two moment updates are fused multiply-adds
    as the compiler contracts them in the host build (GCC -march=native: vfmadd231ss; checked in
    the object code); with Trident's gradients as input the update reproduces its masters, moments
    and 16-bit model bit for bit."""

    def __init__(self, params, masters, cfg, fmt, step=0, exp_avg=None, exp_avg_sq=None):
        self.params, self.cfg, self.fmt, self.step_count = params, cfg, fmt, step
        f32 = lambda a: torch.tensor(np.asarray(a, dtype=np.float32))  # noqa: E731
        self.master = {n: f32(masters[n]) for n in params}
        self.m = {n: f32(exp_avg[n]) if exp_avg is not None else torch.zeros(p.shape, dtype=torch.float32)
                  for n, p in params.items()}
        self.v = {n: f32(exp_avg_sq[n]) if exp_avg_sq is not None else torch.zeros(p.shape, dtype=torch.float32)
                  for n, p in params.items()}

    @torch.no_grad()
    def step(self, lr, clip=1.0):
        c = self.cfg
        self.step_count += 1
        t = self.step_count
        k = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731  (an fp32 constant)
        b1, b2, eps = k(c.beta1), k(c.beta2), k(c.eps)
        one_b1, one_b2 = k(1.0) - b1, k(1.0) - b2
        bc1 = k(1.0 - c.beta1 ** t)
        sqrt_bc2 = k(math.sqrt(1.0 - c.beta2 ** t))
        step_size = k(lr) / bc1
        decay = k(float(Fraction(1) - Fraction(lr) * Fraction(c.weight_decay)))
        scale = k(clip)
        for n, p in self.params.items():
            g = p.grad.to(torch.float32) * scale
            w = self.master[n] * decay if p.dim() >= 2 else self.master[n]
            m = fma32(b1.expand_as(g), self.m[n], one_b1 * g)
            v = fma32(b2.expand_as(g), self.v[n], one_b2 * g * g)
            w = w - step_size * m / (torch.sqrt(v) / sqrt_bc2 + eps)
            self.master[n], self.m[n], self.v[n] = w, m, v
            p.copy_(round16(w, self.fmt))


class DropoutTape:
    """Trident's dropout masks (debug.dump_dropout): datasets /NNNNNNN in call order, uint8 keep
    flags with attributes site, layer, iteration and p. next() hands them out in order and checks
    that each is the one the reference's forward pass asks for: same iteration, site, layer,
    probability and shape."""

    def __init__(self, path):
        _need_file(path, "dropout tape")
        self.f = h5py.File(path, "r")
        self.n = len(self.f)
        self.pos = 0
        self.iteration = 0
        self.masks = []  # (site, layer, kept fraction) of the calls read

    def next(self, site, layer, p, shape):
        name = "%07d" % self.pos
        if name not in self.f:
            raise InputError("dropout tape: no mask %s (the reference asks for %s of layer %d at iteration %d; "
                             "the tape holds %d masks)" % (name, site, layer, self.iteration, self.n))
        d = self.f[name]
        a = d.attrs
        got = (_attr_str(a["site"]), int(a["layer"]), int(a["iteration"]))
        want = (site, layer, self.iteration)
        if got != want:
            raise InputError("dropout tape: mask %s is %s of layer %d at iteration %d, but the reference's forward pass "
                             "asks for %s of layer %d at iteration %d" % ((name,) + got + want))
        if abs(float(a["p"]) - p) > 1e-7 or tuple(d.shape) != tuple(shape):
            raise InputError("dropout tape: mask %s has p %g and shape %s, expected p %g and shape %s"
                             % (name, float(a["p"]), tuple(d.shape), p, tuple(shape)))
        keep = np.asarray(d[...], dtype=np.float64)
        self.masks.append((site, layer, float(keep.mean())))
        self.pos += 1
        return keep


MOE_METRICS = ("moe_aux_loss", "moe_z_loss", "moe_max_load", "moe_dropped")


def moe_objective(cfg, records, n_micro):
    """The MoE part of the training objective of the micro-batches whose router statistics are
    `records` ([(prefix, record)] of Transformer.moe): sum over them of (aux_loss_coeff * aux +
    z_loss_coeff * z) / n_micro (n_micro = global_batch_size / micro_batch_size: the mean over the
    iteration's micro-batches, summed over the MoE layers); a term whose coefficient is 0 is left
    out (it adds nothing). A 0-d tensor, or None when nothing is left."""
    terms = []
    for _, r in records:
        if cfg.moe_aux_loss_coeff != 0.0:
            terms.append(cfg.moe_aux_loss_coeff * r["aux"])
        if cfg.moe_z_loss_coeff != 0.0:
            terms.append(cfg.moe_z_loss_coeff * r["z"])
    if not terms:
        return None
    return torch.stack(terms).sum() / n_micro


class MoEStats:
    """An iteration's router statistics (all micro-batches, all MoE layers) and what is made of them:
      moe_aux_loss  the mean over MoE layers and micro-batches of the unscaled aux loss;
      moe_z_loss    the same of the unscaled z loss;
      moe_max_load  the mean over MoE layers of max_e c_e / mean_e c_e, c_e the selections of expert e
                    by the actual routing (with the expert bias, before capacity drops) summed over
                    the iteration's micro-batches;
      moe_dropped   the (token, expert) selections dropped by capacity / all selections, over the
                    iteration's micro-batches and the MoE layers (0 dropless);
    and the aux-loss-free update of the expert biases from the same c_e (update_expert_bias)."""

    def __init__(self):
        self.aux, self.z = [], []
        self.counts = {}  # layer prefix -> (E,) int64 selections summed over micro-batches
        self.dropped = self.selections = 0

    def add(self, records):
        for prefix, r in records:
            self.aux.append(float(r["aux"]))
            self.z.append(float(r["z"]))
            c = r["counts"].detach().to(torch.int64)
            self.counts[prefix] = self.counts[prefix] + c if prefix in self.counts else c.clone()
            self.dropped += int(r["dropped"])
            self.selections += int(r["selections"])

    def metrics(self):
        loads = [float(c.max()) / (float(c.sum()) / c.numel()) for c in self.counts.values()]
        return {"moe_aux_loss": sum(self.aux) / len(self.aux), "moe_z_loss": sum(self.z) / len(self.z),
                "moe_max_load": sum(loads) / len(loads), "moe_dropped": self.dropped / self.selections}

    def update_expert_bias(self, buffers, rate):
        """bias_e += rate * sign(mean(c) - c_e) of each MoE layer that has an expert bias."""
        for prefix, c in self.counts.items():
            b = buffers.get(prefix + "router/expert_bias")
            if b is not None:
                tr.expert_bias_update(b, c, rate)


class Trainer:
    """One reference training step = grads of the global-batch mean loss (accumulated over
    memory-bounded chunks of rows), global norm, clipping, schedule, AdamW. MoE models: one
    micro-batch per chunk, the objective adds moe_objective, the expert biases are updated after
    the optimizer step, and step() returns the iteration's MoEStats metrics under "moe" and the
    whole objective (the loss plus the MoE terms) under "objective"."""

    LOGITS_BYTES = 256 << 20

    def __init__(self, ckpt, dtype=torch.float64, tape=None, emulate=None):
        self.cfg = ckpt.config
        self.emulate = emulate  # None, or "bf16" / "fp16": Trident's 16-bit rounding points
        self.iteration = ckpt.iteration
        self.initial = ckpt.params  # the model of the checkpoint (parameter changes are measured from it)
        self.matches_checkpoint = True
        if emulate is None:
            self.model = GPTReference(self.cfg, ckpt.params, dtype)
            self.opt = AdamW(self.model.params, self.cfg, step=ckpt.iteration,
                             exp_avg=ckpt.exp_avg, exp_avg_sq=ckpt.exp_avg_sq)
        else:
            # Trident's masters: the checkpoint's optimizer/master (a 16-bit run's, at iteration 0
            # the widened 16-bit initial weights), else (an fp32 checkpoint resumed in 16 bits)
            # its fp32 values; the 16-bit model is the rounded masters
            masters = ckpt.masters if ckpt.masters is not None else ckpt.params
            self.initial = {n: round16(torch.from_numpy(np.asarray(masters[n], dtype=np.float32)), emulate)
                            .double().numpy() for n in ckpt.names}
            off = []
            if ckpt.masters is not None:
                off = [n for n in ckpt.names if not np.array_equal(self.initial[n], ckpt.params[n])]
                if off:
                    print("note: the checkpoint's model/ differs from its rounded masters in %d tensors (%s, ...);"
                          " the reference starts from the rounded masters" % (len(off), off[0]))
            self.matches_checkpoint = ckpt.masters is not None and not off  # starts from Trident's own 16-bit model
            self.initial.update({n: ckpt.params[n] for n in buffer_names(self.cfg)})  # MoE expert biases: as read
            self.model = GPTReference16(self.cfg, self.initial, emulate, dtype)
            self.opt = MasterAdamW(self.model.params, masters, self.cfg, emulate, step=ckpt.optimizer_steps,
                                   exp_avg=ckpt.exp_avg, exp_avg_sq=ckpt.exp_avg_sq)
        self.model.tape = tape

    def step(self, batch, keep_grads=False, loss_scale=1.0):
        """batch: (global_batch_size, seq_length+1) integer array. Returns a dict. loss_scale:
        (16-bit emulation) Trident's loss scale of the iteration, 1 for bf16."""
        if self.emulate is not None:
            return self._step16(batch, keep_grads, loss_scale)
        cfg, params = self.cfg, self.model.params
        self.iteration += 1
        it = self.iteration
        for p in params.values():
            p.grad = None
        windows = torch.as_tensor(np.asarray(batch, dtype=np.int64))
        n_tokens = windows.shape[0] * (windows.shape[1] - 1)
        total = 0.0
        # The split into chunks is only a memory bound (the mean is over the whole global batch
        # either way): as many rows at once as keep the (rows*T, V) logits under ~LOGITS_BYTES.
        T = windows.shape[1] - 1
        per_row = T * cfg.vocab_size * torch.tensor([], dtype=self.model.dtype).element_size()
        rows = max(1, min(windows.shape[0], self.LOGITS_BYTES // per_row))
        if self.model.tape is not None:
            # Trident's masks belong to its micro-batches: the same rows, in the same order
            self.model.tape.iteration = it
            rows = cfg.micro_batch_size
        if cfg.eod_mask_loss or getattr(cfg, "sft", False):
            # Megatron's normalisation of a masked loss: each micro-batch's mean over its counted
            # predictions, averaged over the iteration's micro-batches (consecutive rows)
            rows = cfg.micro_batch_size
            n_micro = windows.shape[0] // rows
        moe = MoEStats() if is_moe(cfg) else None
        if moe is not None:  # the router statistics belong to micro-batches: one per chunk
            rows = cfg.micro_batch_size
            self.model.moe_take()
            objective = 0.0  # the cross-entropy plus the MoE terms (reported apart from the loss)
        for s in range(0, windows.shape[0], rows):
            chunk = windows[s:s + rows]
            norm = n_micro * max(self.model.loss_count(chunk), 1) if cfg.eod_mask_loss or getattr(cfg, "sft", False) else n_tokens
            loss = self.model.loss_sum(chunk) / norm
            if moe is not None:
                records = self.model.moe_take()
                extra = moe_objective(cfg, records, windows.shape[0] // cfg.micro_batch_size)
                (loss if extra is None else loss + extra).backward()
                moe.add(records)
                objective += loss.item() + (0.0 if extra is None else extra.item())
            else:
                loss.backward()
            total += loss.item()
        if moe is not None:  # an expert that no token reached this iteration: a zero gradient (AdamW still steps it)
            for p in params.values():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        with torch.no_grad():
            sq = sum(float((p.grad.double() ** 2).sum()) for p in params.values())
            gnorm = math.sqrt(sq)
            grads = ({n: p.grad.detach().double().numpy().copy() for n, p in params.items()}
                     if keep_grads else None)
            if cfg.clip_grad > 0.0:
                coeff = cfg.clip_grad / (gnorm + 1e-6)
                if coeff < 1.0:
                    for p in params.values():
                        p.grad.mul_(coeff)
        lr = lr_at(cfg, it)
        self.opt.step(lr)
        if moe is not None:
            moe.update_expert_bias(self.model.buffers, cfg.moe_router_bias_update_rate)
            return {"iteration": it, "loss": total, "lr": lr, "grad_norm": gnorm, "grads": grads, "moe": moe.metrics(),
                    "objective": objective}
        return {"iteration": it, "loss": total, "lr": lr, "grad_norm": gnorm, "grads": grads}

    def _step16(self, batch, keep_grads, loss_scale):
        """One step of the 16-bit emulation: as step(), with the loss gradient scaled as Trident
        scales it (dscale = float(loss_scale / tokens), the same fp32 factor), the gradients
        unscaled by float(1 / loss_scale), the step skipped when they are not finite (fp16
        overflow), clipping by Trident's fp32 factor and MasterAdamW. MoE models: as step(), one
        micro-batch per chunk, the MoE terms of each micro-batch (sum over its MoE layers of
        aux_loss_coeff aux + z_loss_coeff z) in the objective with the fp32 weight
        float(loss_scale / micro-batches) (the loss-scaled form of step()'s 1 / micro-batches, as
        Megatron's MoEAuxLossAutoScaler scales them), an expert without tokens a zero gradient,
        the expert biases updated after the step, and "moe" / "objective" returned as step() does
        (the objective unscaled)."""
        cfg, params = self.cfg, self.model.params
        self.iteration += 1
        it = self.iteration
        for p in params.values():
            p.grad = None
        windows = torch.as_tensor(np.asarray(batch, dtype=np.int64))
        n_tokens = windows.shape[0] * (windows.shape[1] - 1)
        dscale = float(np.float32((1.0 / n_tokens) * loss_scale))
        T = windows.shape[1] - 1
        per_row = T * cfg.vocab_size * torch.tensor([], dtype=self.model.dtype).element_size()
        rows = max(1, min(windows.shape[0], self.LOGITS_BYTES // per_row))
        if self.model.tape is not None:
            self.model.tape.iteration = it
            rows = cfg.micro_batch_size
        if cfg.eod_mask_loss or getattr(cfg, "sft", False):  # as step(): Trident's per-micro-batch factor, float(float(scale / n) / count)
            rows = cfg.micro_batch_size
            n_micro = windows.shape[0] // rows
            dscale_micro = float(np.float32((1.0 / n_micro) * loss_scale))
        moe = MoEStats() if is_moe(cfg) else None
        if moe is not None:  # the router statistics belong to micro-batches: one per chunk (as step())
            rows = cfg.micro_batch_size
            self.model.moe_take()
            n_moe = windows.shape[0] // cfg.micro_batch_size
            moe_scale = float(np.float32(loss_scale / n_moe))  # the MoE terms' weight, fp32 (unscaled: 1 / n_moe)
            objective = 0.0
        total = 0.0
        for s in range(0, windows.shape[0], rows):
            chunk = windows[s:s + rows]
            loss = self.model.loss_sum(chunk)
            if cfg.eod_mask_loss or getattr(cfg, "sft", False):
                count = max(self.model.loss_count(chunk), 1)
                scaled = loss * float(np.float32(dscale_micro * (1.0 / count)))
                part = loss.item() / count / n_micro
            else:
                scaled = loss * dscale
                part = loss.item() / n_tokens
            if moe is not None:
                records = self.model.moe_take()
                extra = moe_objective(cfg, records, 1)  # this micro-batch's MoE terms, summed over its MoE layers
                if extra is not None:
                    scaled = scaled + extra * moe_scale
                moe.add(records)
                objective += part + (0.0 if extra is None else extra.item() / n_moe)
            scaled.backward()
            total += part
        if moe is not None:  # an expert that no token reached this iteration: a zero gradient (as step())
            for p in params.values():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        with torch.no_grad():
            if loss_scale != 1.0:
                unscale = float(np.float32(1.0 / loss_scale))
                for p in params.values():
                    p.grad.mul_(unscale)
            sq = sum(float((p.grad.double() ** 2).sum()) for p in params.values())
            gnorm = math.sqrt(sq)
            grads = ({n: p.grad.detach().double().numpy().copy() for n, p in params.items()}
                     if keep_grads else None)
        lr = lr_at(cfg, it)
        skipped = not math.isfinite(gnorm)
        if not skipped:
            clip = 1.0
            if cfg.clip_grad > 0.0:
                coeff = cfg.clip_grad / (gnorm + 1e-6)
                if coeff < 1.0:
                    clip = float(np.float32(coeff))
            self.opt.step(lr, clip)
        out = {"iteration": it, "loss": total, "lr": lr, "grad_norm": gnorm if not skipped else float("nan"),
               "grads": grads, "skipped": skipped}
        if moe is not None:
            moe.update_expert_bias(self.model.buffers, cfg.moe_router_bias_update_rate)
            out.update({"moe": moe.metrics(), "objective": objective})
        return out


# --------------------------------------------------------------------------------------
# Inputs written by Trident
# --------------------------------------------------------------------------------------

METRICS_COLUMNS = ["iteration", "consumed_samples", "loss", "lr", "grad_norm", "loss_scale",
                   "skipped", "ms_per_iter", "tokens_per_s", "tflops_per_rank", "mfu"]


def read_metrics(path):
    """Rows of Trident's metrics CSV keyed by iteration (float values)."""
    _need_file(path, "metrics")
    rows = {}
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None:
            raise InputError("%s: empty metrics file" % path)
        cols = [c.strip() for c in reader.fieldnames]
        for need in ("iteration", "loss", "lr", "grad_norm"):
            if need not in cols:
                raise InputError("%s: column %r is missing (header: %s)" % (path, need, ",".join(cols)))
        for lineno, r in enumerate(reader, start=2):
            r = {k.strip(): (v.strip() if isinstance(v, str) else v) for k, v in r.items() if k}
            try:
                it = int(float(r["iteration"]))
                row = {k: float(v) for k, v in r.items() if v not in (None, "")}
            except ValueError as e:
                raise InputError("%s line %d: %s" % (path, lineno, e))
            rows[it] = row
    if not rows:
        raise InputError("%s: no data rows" % path)
    return rows


def batch_name(i):
    return "iter_%07d" % i


def available_batches(f, start):
    """Number of consecutive /iter_NNNNNNN datasets from iteration start+1 on."""
    n = 0
    while batch_name(start + n + 1) in f:
        n += 1
    return n


def read_batch(f, i, cfg, fname):
    arr = _read_dataset(f, batch_name(i), fname)
    sft = getattr(cfg, "sft", False)
    want = (cfg.global_batch_size, 3 * cfg.seq_length if sft else cfg.seq_length + 1)
    if tuple(arr.shape) != want:
        raise InputError("%s: %s has shape %s, expected [global_batch_size, %s] = %s"
                         % (fname, batch_name(i), tuple(arr.shape),
                            "3 x seq_length (instruction fine-tuning)" if sft else "seq_length+1", want))
    if sft:
        S = cfg.seq_length
        tok, tgt = arr[:, :S], arr[:, S:2 * S]
        if arr.size and (tok.min() < 0 or tok.max() >= cfg.vocab_size or tgt.min() < -1 or tgt.max() >= cfg.vocab_size):
            raise InputError("%s: %s has token ids outside [0, %d)" % (fname, batch_name(i), cfg.vocab_size))
        return arr
    if arr.size and (arr.min() < 0 or arr.max() >= cfg.vocab_size):
        raise InputError("%s: %s has token ids outside [0, %d)" % (fname, batch_name(i), cfg.vocab_size))
    return arr


def read_grads(path, cfg):
    _need_file(path, "grads")
    exp = expected_shapes(cfg)
    out = {}
    with h5py.File(path, "r") as f:
        it = int(f.attrs.get("iteration", 1))
        for n in param_names(cfg):
            arr = _read_dataset(f, n, path)
            if tuple(arr.shape) != exp[n]:
                raise InputError("%s: %s has shape %s, expected %s" % (path, n, tuple(arr.shape), exp[n]))
            out[n] = np.asarray(arr, dtype=np.float64)
    return it, out


def params_file(directory, i):
    """Trident's parameter dump of iteration i (debug.dump_params), or None when it has none."""
    if not directory:
        return None
    path = os.path.join(directory, "iter_%07d.h5" % i)
    return path if os.path.exists(path) else None


def compare_params(path, params, initial, rtol, leave_out=None):
    """Trident's parameters after an iteration (a debug.dump_params file) against the reference's
    (name -> tensor). The error of each tensor is measured against the size of the reference's
    own change since the checkpoint, ||p_t - p_r|| / ||p_r - p_0||: the initial weights are common
    to both, so a relative error of the whole parameter would hide a wrong update behind them.
    leave_out: {name: index along the first axis} of elements left out of the comparison (the
    16-bit emulation's key bias, key_bias_block). Returns (worst error, [(name, error)], failure
    messages)."""
    rows, failures, worst = [], [], 0.0
    with h5py.File(path, "r") as f:
        for n, t in params.items():
            if n not in f:
                failures.append("%s: parameter %s is missing" % (path, n))
                continue
            got = np.asarray(f[n][...], dtype=np.float64)
            ref = t.detach().double().numpy()
            if got.shape != ref.shape:
                failures.append("%s: %s has shape %s, expected %s" % (path, n, got.shape, ref.shape))
                continue
            ini = initial[n]
            if leave_out and n in leave_out:
                keep = np.ones(ref.shape[0], dtype=bool)
                keep[leave_out[n]] = False
                got, ref, ini = got[keep], ref[keep], ini[keep]
            change = float(np.linalg.norm(ref - ini))
            err = float(np.linalg.norm(got - ref))
            rel = err / change if change > 0 else (0.0 if err == 0 else float("inf"))
            rows.append((n, rel))
            if not rel <= worst and worst == worst:  # NaN, once seen, stays
                worst = rel
            if not rel <= rtol:
                failures.append("%s: parameter %s differs by %.2e of its change (> %.1e)" % (path, n, rel, rtol))
    return worst, rows, failures


def key_bias_block(cfg):
    """{qkv bias name: the key block's indices}. The key bias has no gradient in exact arithmetic
    (the softmax over keys is invariant to adding q.b_k to a row of scores); in Trident's 16-bit
    path its gradient is what is left of sum_j ds_ij = dot_i (1 - sum_j round(p_ij)), a residual
    of the rounded probabilities of about Adam's eps (1e-8), so its Adam update (~ +-lr times
    m / (sqrt(v) + eps)) follows the sign of rounding noise in both programs and is not
    comparable. The 16-bit emulation compares the query and value blocks of the qkv bias and
    reports the key block's error apart (the fp32 reference's residual is ~1e-17, far below eps:
    its default comparison keeps it). The key block is the ng d rows after the nh d query rows;
    {} where that gradient is not 0 (rotary positions turn b_k differently at each key position, a
    k norm makes it non-linear) or there is no qkv bias."""
    nh, ng, d = attention_shape(cfg)
    if not (cfg.add_bias_linear or cfg.add_qkv_bias) or cfg.position_embedding_type == "rope" \
            or getattr(cfg, "qk_layernorm", False):
        return {}
    return {"model/layers/%d/self_attention/qkv/bias" % i: np.arange(nh * d, (nh + ng) * d)
            for i in range(cfg.num_layers)}


def _param_error(got, ref, ini):
    change = float(np.linalg.norm(ref - ini))
    err = float(np.linalg.norm(got - ref))
    return err / change if change > 0 else (0.0 if err == 0 else float("inf"))


def _read_param_dump(path, cfg):
    exp = expected_shapes(cfg)
    out = {}
    with h5py.File(path, "r") as f:
        for n in param_names(cfg):
            arr = _read_dataset(f, n, path)
            if tuple(arr.shape) != exp[n]:
                raise InputError("%s: %s has shape %s, expected %s" % (path, n, tuple(arr.shape), exp[n]))
            out[n] = np.asarray(arr, dtype=np.float64)
    return out


def forced_forward(bf, fname, params_dir, metrics, cfg, emulate, first, last):
    """16-bit emulation, the forward pass alone: for every parameter dump of an iteration k in
    [first, last) with a logged iteration k + 1, the loss of batch k + 1 computed by the
    reference's forward from TRIDENT's 16-bit parameters after k (no trajectory of its own).
    MoE models: each micro-batch routed on its own, as in training; with expert biases, only the
    dumps that hold them (their values after k are Trident's state too). Returns [(k + 1,
    loss_ref, loss_trident, relative error)]."""
    rows = []
    buffers = buffer_names(cfg)
    for k in range(first, last):
        pf = params_file(params_dir, k)
        if not pf or (k + 1) not in metrics or metrics[k + 1].get("skipped", 0.0) != 0.0:
            continue
        P = _read_param_dump(pf, cfg)
        off = [n for n in P if not np.array_equal(P[n], round16(torch.from_numpy(P[n]), emulate).numpy())]
        if off:
            raise InputError("%s: %s holds values that are not %s (not a 16-bit model's dump)" % (pf, off[0], emulate))
        if buffers:
            with h5py.File(pf, "r") as f:
                if not all(n in f for n in buffers):
                    continue
                P.update({n: np.asarray(f[n][...], dtype=np.float64) for n in buffers})
        model = GPTReference16(cfg, P, emulate)
        windows = torch.as_tensor(np.asarray(read_batch(bf, k + 1, cfg, fname), dtype=np.int64))
        n_tokens = windows.shape[0] * (windows.shape[1] - 1)
        per_row = (windows.shape[1] - 1) * cfg.vocab_size * 8
        rows_at_once = max(1, min(windows.shape[0], Trainer.LOGITS_BYTES // per_row))
        n_micro = 1
        if cfg.eod_mask_loss or getattr(cfg, "sft", False):  # the mean over micro-batches of each one's mean (Trainer.step)
            rows_at_once = cfg.micro_batch_size
            n_micro = windows.shape[0] // rows_at_once
        if is_moe(cfg):  # one micro-batch per call (the router's unit), as Trainer.step
            rows_at_once = cfg.micro_batch_size
        total = 0.0
        with torch.no_grad():
            for s0 in range(0, windows.shape[0], rows_at_once):
                chunk = windows[s0:s0 + rows_at_once]
                norm = n_micro * max(model.loss_count(chunk), 1) if cfg.eod_mask_loss or getattr(cfg, "sft", False) else n_tokens
                total += float(model.loss_sum(chunk)) / norm
                model.moe_take()  # (the router statistics are not compared here)
        lt = metrics[k + 1]["loss"]
        rows.append((k + 1, total, lt, _rel(lt, total)))
    return rows


def forced_update(ckpt, grads_it, grads_t, metrics, params_dir, emulate):
    """16-bit emulation, the optimizer alone: MasterAdamW applied to the checkpoint's masters and
    moments with TRIDENT's gradients of iteration grads_it (the first after the checkpoint; clipped
    by the factor Trident's logged grad norm gives), rounded to 16 bits, against Trident's 16-bit
    model after that iteration. Returns (elements that differ, elements, largest difference) or
    None when the inputs for it are missing."""
    cfg = ckpt.config
    pf = params_file(params_dir, grads_it)
    if grads_t is None or pf is None or grads_it != ckpt.iteration + 1 or grads_it not in metrics \
            or metrics[grads_it].get("skipped", 0.0) != 0.0:
        return None
    masters = ckpt.masters if ckpt.masters is not None else ckpt.params
    params = {}
    for n in ckpt.names:
        t = round16(torch.from_numpy(np.asarray(masters[n], dtype=np.float32)), emulate).double()
        t.grad = torch.from_numpy(grads_t[n])
        params[n] = t
    opt = MasterAdamW(params, masters, cfg, emulate, step=ckpt.optimizer_steps, exp_avg=ckpt.exp_avg,
                      exp_avg_sq=ckpt.exp_avg_sq)
    clip = 1.0
    if cfg.clip_grad > 0.0:
        coeff = cfg.clip_grad / (metrics[grads_it]["grad_norm"] + 1e-6)
        if coeff < 1.0:
            clip = float(np.float32(coeff))
    opt.step(lr_at(cfg, grads_it), clip)
    got = _read_param_dump(pf, cfg)
    differ = total = 0
    largest = 0.0
    for n in ckpt.names:
        d = np.abs(got[n] - params[n].numpy())
        differ += int(np.count_nonzero(d))
        total += d.size
        largest = max(largest, float(d.max()) if d.size else 0.0)
    return differ, total, largest


# --------------------------------------------------------------------------------------
# compare
# --------------------------------------------------------------------------------------

# Default tolerances (see validation/README.md).
#
# Loss (relative, per step): Trident computes in fp32, the reference in fp64. At step 1 the two
#   losses differ by ~1e-8..1e-7 relative (fp32 rounding of reductions over C, F and V). Over
#   20 AdamW steps the fp32 rounding of the gradients perturbs the trajectory only slightly:
#   make_fake_case.py (the reference itself in fp32 vs fp64; 2 layers, C=64, V=50257, T=32,
#   B=4, lr 1e-3) measures <= 1e-7 relative at every step. A different fp32 summation order
#   (GPU kernels, other reductions) is noise of the same size. 1e-4 therefore leaves three
#   orders of magnitude of headroom (room for longer runs, where Adam amplifies tiny differences
#   in near-zero gradient elements) while any real bug in the forward pass, the loss, the
#   schedule or the update (wrong mask, scale, clipping, lr) moves the loss by far more than 1e-4
#   within a few steps. Cases may tighten it (e.g. 1e-5) on the command line.
DEFAULT_LOSS_RTOL = 1e-4
# Gradients (relative L2 error per tensor, iteration 1): an fp32 result of a reduction of length
#   K carries a relative error of at most ~eps32 * sqrt(K) ~ 6e-8 * sqrt(K) (random-walk
#   rounding); for K up to ~1e4-1e5 (B*T tokens, C, F, V) that is <= ~2e-5 per tensor; measured
#   on the fake case: 2e-7..4e-7. 1e-4 keeps a wide margin for larger cases and other fp32
#   summation orders; real bugs (a transposed weight, a missing bias gradient, a wrong head split,
#   a missing 1/N) give errors of order 1e-3..1 (the self-test shows a 0.1 % scaling of one
#   tensor, rel. error 1e-3, and one zeroed row of a qkv gradient both fail).
DEFAULT_GRAD_RTOL = 1e-4
# Tensors whose true gradient is (nearly) zero have meaningless relative errors: e.g. the
#   key part of the qkv bias has an exactly zero gradient (softmax is invariant to adding
#   q.b_k to a whole row), position embeddings beyond seq_length never get any gradient. The
#   error is therefore measured against max(||g_ref||, floor), floor = GRAD_FLOOR_FRAC times
#   the global reference gradient norm: an error smaller than rtol * 1e-3 * global norm cannot
#   matter to training.
DEFAULT_GRAD_FLOOR_FRAC = 1e-3
# Grad norm (relative, per step): fp32 vs fp64 agree to ~1e-7 (measured <= 6e-8 over 20 steps);
#   1e-3 is loose on purpose (it is a summary, the per-tensor check is the sharp one), but it
#   catches a norm taken after clipping, or a tied embedding counted twice.
DEFAULT_GNORM_RTOL = 1e-3
# Learning rate (relative): the schedule is exact arithmetic on both sides; the only error is
#   the CSV's printed precision. 1e-4 allows 5 significant digits; an off-by-one in warmup
#   changes the lr by 1/i >= 1/warmup_iters, one in mid cosine decay by ~pi/(2 (D - warmup)).
DEFAULT_LR_RTOL = 1e-4
# Parameters after an iteration (per tensor, relative L2 error of the parameter against the norm
#   of the reference's change since the checkpoint): the update inherits the gradients' fp32
#   error, and Adam's normalisation amplifies it in elements whose gradient is near zero; 1e-3
#   for users' cases, tightened in CTest to about 10x the measured worst.
DEFAULT_PARAM_RTOL = 1e-3
# 16-bit emulation, the forward pass from Trident's own 16-bit parameters (forced_forward): fp32
#   against float64 arithmetic between identical rounding points; measured <= 1.7e-7 (fp16 from
#   the initial checkpoint; bf16 <= 1.4e-7, with dropout 1.1e-7).
DEFAULT_FORWARD_RTOL = 1.5e-6


def _rel(a, b):
    if a == b:
        return 0.0
    den = abs(b)
    return abs(a - b) / den if den > 0 else float("inf")


def resolve_emulate(choice, cfg):
    """The 16-bit format to emulate (None: the plain reference) for --emulate CHOICE and a run of
    precision cfg.precision (the checkpoint's deck)."""
    if choice == "none":
        return None
    if choice == "auto":
        if cfg.precision in ("bf16", "fp16"):
            return cfg.precision
        if cfg.precision not in ("fp32", ""):
            raise InputError("deck key [precision] dtype: unknown value %r" % cfg.precision)
        return None
    return choice



# --------------------------------------------------------------------------------------
# Trajectory cache (compare --cache DIR)
# --------------------------------------------------------------------------------------

def _validation_sources():
    """The reference's code: every module loaded from this directory (the references, the shared
    layer math, the training loop) and the script that runs, as (name, bytes), sorted by name."""
    here = os.path.dirname(os.path.abspath(__file__))
    paths = {os.path.abspath(sys.argv[0])} if sys.argv and sys.argv[0].endswith(".py") else set()
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if f and os.path.dirname(os.path.abspath(f)) == here and f.endswith(".py"):
            paths.add(os.path.abspath(f))
    paths |= {os.path.join(here, n) for n in ("gpt_reference.py", "torch_reference.py")}
    return [(os.path.basename(p), open(p, "rb").read()) for p in sorted(paths, key=os.path.basename)]


def _platform_text():
    """What else decides a float64 trajectory's bits: the Python, torch and numpy builds (torch's
    configuration names its BLAS and the CPU capability its kernels use), the thread count and
    the CPU."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("vendor_id", "cpu family", "model", "flags")):
                    cpu += line
                elif line.strip() == "" and cpu:
                    break
    except OSError:
        pass
    return "\n".join([sys.version, "torch " + torch.__version__, torch.__config__.show(), "numpy " + np.__version__,
                      "threads %d/%d" % (torch.get_num_threads(), torch.get_num_interop_threads()), cpu])


class TrajectoryDigest:
    """The sha256 a TrajectoryCache key is: tagged parts (bytes, text or arrays) added in order,
    starting with the reference's code (every module of this directory it loaded, by content) and
    the platform (_platform_text), so that a change to either is a change of every trajectory."""

    def __init__(self):
        import hashlib
        self.h = hashlib.sha256()
        for name, data in _validation_sources():
            self.add("source " + name, data)
        self.add("platform", _platform_text())

    def add(self, tag, data):
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data)
            data = data.dtype.str.encode() + repr(data.shape).encode() + b"\0" + data.tobytes()
        self.h.update(tag.encode() + b"\0" + (data if isinstance(data, bytes) else str(data).encode()) + b"\0")

    def add_config(self, cfg):
        self.add("config", repr(sorted((k, repr(v)) for k, v in vars(cfg).items())))

    def add_tape(self, tape):
        """A dropout tape's every mask: its name, attributes and bits."""
        if tape is None:
            self.add("tape", "none")
            return
        for name in sorted(tape.f):
            d = tape.f[name]
            self.add("tape " + name, repr(sorted((k, repr(v)) for k, v in d.attrs.items())))
            self.add("tape " + name, np.asarray(d[()]))

    def hexdigest(self):
        return self.h.hexdigest()


def trajectory_key(cfg, ckpt, bf, start, steps, grads_it, param_iters, dtype, tape=None, emulate=None,
                   loss_scales=None):
    """sha256 over everything the reference's trajectory depends on: its code and platform, the
    configuration it read from the deck (no parallel layout enters it), the checkpoint's tensors
    and counters, the batches of the compared iterations, the iteration of the kept gradients,
    the iterations whose parameters are compared, the dropout masks applied, the 16-bit
    emulation and Trident's loss scales (fp16). Two runs with one key train the same reference
    on the same numbers."""
    d = TrajectoryDigest()
    d.add_config(cfg)
    d.add("counters", (ckpt.iteration, ckpt.consumed_samples, ckpt.optimizer_steps, start, steps, grads_it,
                       tuple(param_iters), str(dtype)))
    d.add("emulate", repr((emulate, sorted((loss_scales or {}).items()))))
    for group, tensors in (("params", ckpt.params), ("exp_avg", ckpt.exp_avg), ("exp_avg_sq", ckpt.exp_avg_sq)):
        for n in sorted(tensors or {}):
            d.add(group + "/" + n, tensors[n])
    for i in range(start + 1, start + steps + 1):
        d.add(batch_name(i), np.asarray(bf[batch_name(i)][...]))
    d.add_tape(tape)
    return d.hexdigest()


REFERENCE_CACHE_GB = 10.0  # default size of the cache: the least recently used records go beyond it


class TrajectoryCache:
    """The reference's steps (loss, lr, grad norm, MoE metrics, the kept gradients), its parameters
    after the compared iterations and what it read of a dropout tape, recorded under the inputs'
    trajectory_key and replayed by a later compare with the same key: the layouts of one case,
    and every later run on this machine, train the reference once. Only the reference's own
    numbers are stored, never Trident's; the comparison runs afresh every time. Written whole to
    a temporary file and renamed, so that concurrent runs (CTest in parallel) see a complete
    record or none. A replayed record's time stamp is renewed; records beyond the cache's size
    ($TRIDENT_REFERENCE_CACHE_GB, default 10) are removed, least recently used first."""

    def __init__(self, directory, key):
        self.path = os.path.join(directory, key + ".pt")
        self.directory = directory
        self.steps, self.params, self.tape = {}, {}, None

    def load(self):
        if not os.path.exists(self.path):
            return False
        try:
            rec = torch.load(self.path, weights_only=False)
            self.steps, self.params, self.tape = rec["steps"], rec["params"], rec.get("tape")
            try:
                os.utime(self.path)  # used now: the last to be pruned
            except OSError:
                pass
            return True
        except Exception as e:  # a damaged record is recomputed
            print("note: %s unreadable (%s): the reference trains" % (self.path, e))
            self.steps, self.params, self.tape = {}, {}, None
            return False

    def record(self, i, res, model, keep_params):
        self.steps[i] = res
        if keep_params:
            self.params[i] = {n: t.detach().clone() for n, t in list(model.params.items()) + list(model.buffers.items())}

    def replay(self, i, model):
        """The recorded step i; its parameters (when recorded) are put into model."""
        if i in self.params:
            with torch.no_grad():
                for n, t in list(model.params.items()) + list(model.buffers.items()):
                    t.copy_(self.params[i][n])
        return self.steps[i]

    def record_tape(self, tape):
        if tape is not None:
            self.tape = {"pos": tape.pos, "masks": list(tape.masks)}

    def replay_tape(self, tape):
        """What training read of the tape (the masks' count and kept fractions)."""
        if tape is not None and self.tape is not None:
            tape.pos, tape.masks = self.tape["pos"], list(self.tape["masks"])

    def save(self):
        os.makedirs(self.directory, exist_ok=True)
        tmp = "%s.%d.tmp" % (self.path, os.getpid())
        torch.save({"steps": self.steps, "params": self.params, "tape": self.tape}, tmp)
        os.replace(tmp, self.path)
        self.prune()

    def prune(self):
        try:
            cap = float(os.environ.get("TRIDENT_REFERENCE_CACHE_GB", REFERENCE_CACHE_GB)) * 2**30
        except ValueError:
            cap = REFERENCE_CACHE_GB * 2**30
        records = []
        for name in os.listdir(self.directory):
            p = os.path.join(self.directory, name)
            try:
                st = os.stat(p)
            except OSError:
                continue  # removed by a concurrent run
            if name.endswith(".pt"):
                records.append((st.st_mtime, st.st_size, p))
            elif name.endswith(".tmp") and st.st_mtime < time.time() - 3600:
                records.append((0.0, st.st_size, p))  # left by a killed run
        total = sum(r[1] for r in records)
        for mtime, size, p in sorted(records):
            if total <= cap:
                break
            if p == self.path:
                continue
            try:
                os.remove(p)
                total -= size
            except OSError:
                pass


def cmd_compare(args):
    torch.set_num_threads(args.threads)
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    ckpt = Checkpoint(args.checkpoint)
    cfg = ckpt.config
    if (cfg.reset_position_ids or cfg.reset_attention_mask or cfg.eod_mask_loss) and not getattr(cfg, "sft", False):
        if args.eod_id is None:
            raise InputError("the run packs documents (data.reset_position_ids %s, reset_attention_mask %s, "
                             "eod_mask_loss %s): give the corpus's end-of-document id with --eod-id"
                             % (cfg.reset_position_ids, cfg.reset_attention_mask, cfg.eod_mask_loss))
        cfg.eod_id = args.eod_id
    tape = None
    if cfg.hidden_dropout > 0 or cfg.attention_dropout > 0:
        if not args.dropout_tape:
            raise InputError("the run used dropout (hidden %g, attention %g): give its masks with --dropout-tape "
                             "(Trident's debug.dump_dropout), or train the case with model.hidden_dropout = "
                             "model.attention_dropout = 0" % (cfg.hidden_dropout, cfg.attention_dropout))
        tape = DropoutTape(args.dropout_tape)
    emulate = resolve_emulate(args.emulate, cfg)
    metrics = read_metrics(args.metrics)
    start = ckpt.iteration

    _need_file(args.batches, "batches")
    bf = h5py.File(args.batches, "r")
    n_avail = available_batches(bf, start)
    if n_avail == 0:
        raise InputError("%s: no dataset %s (first iteration after the checkpoint at %d)"
                         % (args.batches, batch_name(start + 1), start))
    last_metric = max(metrics)
    if args.steps is None:
        steps = min(n_avail, last_metric - start)
        if steps <= 0:
            raise InputError("%s: no rows after the checkpoint's iteration %d" % (args.metrics, start))
    else:
        steps = args.steps
        if steps > n_avail:
            raise InputError("%s: --steps %d but only %d batches after iteration %d"
                             % (args.batches, steps, n_avail, start))
    compared = [i for i in range(start + 1, start + steps + 1) if i in metrics]
    if not compared:
        raise InputError("%s: no rows for iterations %d..%d" % (args.metrics, start + 1, start + steps))
    for i in compared:
        if metrics[i].get("skipped", 0.0) != 0.0 and emulate is None:
            raise InputError("%s: iteration %d was skipped by Trident (loss-scale overflow); "
                             "compare only fp32 runs without skipped steps, or emulate the run's fp16 "
                             "(--emulate fp16)" % (args.metrics, i))
    loss_scales = {}
    if emulate == "fp16":  # Trident's loss scale of every iteration (an input, like the batches)
        for i in range(start + 1, start + steps + 1):
            if i not in metrics or "loss_scale" not in metrics[i]:
                raise InputError("%s: --emulate fp16 needs the loss scale of every iteration (log.interval = 1); "
                                 "iteration %d has none" % (args.metrics, i))
            loss_scales[i] = metrics[i]["loss_scale"]

    grads_it, grads_t = None, None
    if args.grads:
        grads_it, grads_t = read_grads(args.grads, cfg)
        if not (start + 1 <= grads_it <= start + steps):
            raise InputError("%s: gradients are of iteration %d, outside the compared range %d..%d"
                             % (args.grads, grads_it, start + 1, start + steps))

    if cfg.precision != "fp32" and emulate is None:
        print("note: the run's precision is %s; the default tolerances assume fp32" % cfg.precision)
    elif emulate is not None and emulate != cfg.precision:
        print("note: emulating %s rounding, but the run's precision is %s" % (emulate, cfg.precision))
    print("reference: %d layers, C=%d, heads=%d%s, F=%d, V=%d, T=%d, global batch %d (micro %d), %s%s, "
          "%d threads; iterations %d..%d"
          % (cfg.num_layers, cfg.hidden_size, cfg.num_heads,
             "" if (cfg.num_query_groups, cfg.head_dim, cfg.qk_layernorm) == (cfg.num_heads, cfg.hidden_size // cfg.num_heads,
                                                                             False)
             else " (%d key/value groups, head dim %d%s)" % (cfg.num_query_groups, cfg.head_dim,
                                                             ", q/k norms" if cfg.qk_layernorm else ""),
             cfg.ffn_hidden_size, cfg.vocab_size,
             cfg.seq_length, cfg.global_batch_size, cfg.micro_batch_size, args.dtype,
             "" if emulate is None else " emulating Trident's %s rounding points (fp32 masters)" % emulate,
             args.threads, start + 1, start + steps))

    trainer = Trainer(ckpt, dtype, tape, emulate)
    cache, replaying = None, False
    if args.cache:
        param_iters = [i for i in range(start + 1, start + steps + 1) if params_file(args.params, i)]
        cache = TrajectoryCache(args.cache, trajectory_key(cfg, ckpt, bf, start, steps, grads_it, param_iters,
                                                           dtype, tape, emulate, loss_scales))
        replaying = cache.load()
        if replaying:
            cache.replay_tape(tape)
        print("reference trajectory: %s %s" % ("replayed from" if replaying else "trained, recorded in", cache.path))
    failures = []
    step_rows = []
    moe = is_moe(cfg)
    moe_present = []  # the moe_* columns Trident's CSV has (compared per step, as the loss)
    moe_tol = {c: (args.loss_rtol if t is None else t) for c, t in
               (("moe_aux_loss", args.moe_rtol), ("moe_z_loss", args.moe_rtol),
                ("moe_max_load", args.moe_load_rtol), ("moe_dropped", args.moe_load_rtol))}
    if moe:
        moe_present = [c for c in MOE_METRICS if any(c in metrics[i] for i in compared)]
        print("MoE: layers %s, %d experts of width %d, top-%d %s%s, shared expert %d, capacity factor %g%s, "
              "aux_loss_coeff %g, z_loss_coeff %g%s; routed per micro-batch of %d x %d tokens"
              % ([i for i, f in enumerate(moe_layer_flags(cfg)) if f], cfg.num_experts, cfg.moe_ffn_hidden_size,
                 cfg.moe_router_topk, cfg.moe_router_score_function,
                 " (pre-softmax)" if cfg.moe_router_pre_softmax and cfg.moe_router_score_function == "softmax" else "",
                 cfg.moe_shared_expert_intermediate_size, cfg.moe_expert_capacity_factor,
                 " (drop policy %s)" % cfg.moe_token_drop_policy if cfg.moe_expert_capacity_factor > 0 else " (dropless)",
                 cfg.moe_aux_loss_coeff, cfg.moe_z_loss_coeff,
                 ", expert bias (update rate %g)" % cfg.moe_router_bias_update_rate
                 if cfg.moe_router_enable_expert_bias else "", cfg.micro_batch_size, cfg.seq_length))
        if args.moe_rtol is not None or args.moe_load_rtol is not None:
            print("MoE metrics: aux and z losses within %.1e, max load and dropped share within %.1e (relative)"
                  % (moe_tol["moe_aux_loss"], moe_tol["moe_max_load"]))
        absent = [c for c in MOE_METRICS if c not in moe_present]
        if absent:
            print("note: Trident's metrics have no column %s: not compared (the reference's values are printed)"
                  % ", ".join(absent))
    moe_bias_note = False
    hdr = ("%6s %15s %15s %9s %11s %11s %9s %12s %12s %9s  %s"
           % ("iter", "loss_trident", "loss_ref", "rel", "lr_trident", "lr_ref", "lr_rel",
              "gnorm_trid", "gnorm_ref", "gn_rel", "status"))
    print(hdr)
    ref_grads, grads_skipped = None, False
    if args.params and not os.path.isdir(args.params):
        raise InputError("--params: %s is not a directory" % args.params)
    param_rows, worst_param = [], 0.0
    key_bias = emulate is not None and bool(key_bias_block(cfg))  # its update is rounding noise in 16 bits: apart
    forced_rows = []  # 16-bit emulation: losses the reference's forward computes from Trident's own parameters
    t0 = time.time()
    for i in range(start + 1, start + steps + 1):
        batch = read_batch(bf, i, cfg, args.batches)
        if replaying:
            res = cache.replay(i, trainer.model)
        else:
            if emulate is None:
                res = trainer.step(batch, keep_grads=(i == grads_it))
            else:
                res = trainer.step(batch, keep_grads=(i == grads_it), loss_scale=loss_scales.get(i, 1.0))
            if cache is not None:
                cache.record(i, res, trainer.model, keep_params=params_file(args.params, i) is not None)
        if i == grads_it:
            ref_grads = res["grads"]
            grads_skipped = bool(res.get("skipped"))
        pf = params_file(args.params, i)
        if pf:
            w, rows_p, bad_p = compare_params(pf, trainer.model.params, trainer.initial, args.param_rtol,
                                              leave_out=key_bias and key_bias_block(cfg))
            worst_param = max(worst_param, w) if w == w else w
            failures += bad_p
            param_rows.append({"iteration": i, "worst": w, "tensors": len(rows_p)})
            print("  parameters after iteration %d: %d tensors, worst error %.2e of the change since the "
                  "checkpoint (tolerance %.1e)%s" % (i, len(rows_p), w, args.param_rtol, "" if not bad_p else " FAIL"))
            if key_bias:
                got = _read_param_dump(pf, cfg)
                kb = [(n, _param_error(got[n][ix], trainer.model.params[n].detach().numpy()[ix],
                                       trainer.initial[n][ix])) for n, ix in key_bias_block(cfg).items()]
                param_rows[-1]["key_bias"] = {n: e for n, e in kb}
                print("    worst tensor %s; key bias (not compared, see key_bias_block): %s"
                      % (max(rows_p, key=lambda r: r[1])[0], ", ".join("%.2e" % e for _, e in kb)))
            if trainer.model.buffers:  # the MoE expert biases, when the dump holds them
                with h5py.File(pf, "r") as f:
                    held = {n: b for n, b in trainer.model.buffers.items() if n in f}
                if held:
                    wb, rows_b, bad_b = compare_params(pf, held, trainer.initial, args.param_rtol)
                    worst_param = max(worst_param, wb) if wb == wb else wb
                    failures += bad_b
                    param_rows[-1]["expert_bias"] = {"worst": wb, "tensors": len(rows_b)}
                    print("  expert biases after iteration %d: %d tensors, worst error %.2e of the change since the "
                          "checkpoint (tolerance %.1e)%s" % (i, len(rows_b), wb, args.param_rtol,
                                                              "" if not bad_b else " FAIL"))
                elif not moe_bias_note:
                    moe_bias_note = True
                    print("  note: %s holds no router/expert_bias: the expert biases are not compared" % pf)
        row = {"iteration": i, "loss_ref": res["loss"], "lr_ref": res["lr"],
               "grad_norm_ref": res["grad_norm"]}
        if i in metrics:
            m = metrics[i]
            lt, lrt, gt = m["loss"], m["lr"], m["grad_norm"]
            lrel = _rel(lt, res["loss"])
            rrel = _rel(lrt, res["lr"]) if res["lr"] != 0 else abs(lrt)
            grel = _rel(gt, res["grad_norm"])
            bad = []
            if res.get("skipped") is not None:  # 16-bit emulation: both skip (fp16 overflow) or neither
                if res["skipped"] != (m.get("skipped", 0.0) != 0.0):
                    bad.append("skipped")
                if res["skipped"] and gt != gt:
                    grel = 0.0  # both overflowed: no norm to compare
            if not (lrel <= args.loss_rtol):
                bad.append("loss")
            if not (rrel <= args.lr_rtol):
                bad.append("lr")
            if not (grel <= args.gnorm_rtol):
                bad.append("grad_norm")
            if "consumed_samples" in m:
                want = ckpt.consumed_samples + (i - start) * cfg.global_batch_size
                if int(m["consumed_samples"]) != want:
                    print("  warning: iteration %d consumed_samples %d, expected %d"
                          % (i, int(m["consumed_samples"]), want))
            for b in bad:
                failures.append("iteration %d: %s differs" % (i, b))
            if emulate is not None and i == start + 1 and not res.get("skipped") and trainer.matches_checkpoint:
                forced_rows.append((i, res["loss"], lt, lrel))  # from the checkpoint's 16-bit model
            row.update({"loss_trident": lt, "loss_rel": lrel, "lr_trident": lrt, "lr_rel": rrel,
                        "grad_norm_trident": gt, "grad_norm_rel": grel, "ok": not bad})
            print("%6d %15.9g %15.9g %9.2e %11.5g %11.5g %9.2e %12.7g %12.7g %9.2e  %s"
                  % (i, lt, res["loss"], lrel, lrt, res["lr"], rrel, gt, res["grad_norm"], grel,
                     "ok" if not bad else "FAIL(" + ",".join(bad) + ")"))
            if moe:
                # the unscaled aux and z losses, the max load and the dropped fraction: relative, as the loss
                # (--moe-rtol, --moe-load-rtol when given)
                parts, moe_bad = [], []
                row["moe_ref"] = res["moe"]
                row["moe_trident"] = {c: m[c] for c in MOE_METRICS if c in m}
                for c in MOE_METRICS:
                    if c not in m:
                        parts.append("%s - %.9g" % (c[4:], res["moe"][c]))
                        continue
                    r_ = _rel(m[c], res["moe"][c])
                    row[c + "_rel"] = r_
                    parts.append("%s %.9g %.9g %.2e" % (c[4:], m[c], res["moe"][c], r_))
                    if not (r_ <= moe_tol[c]):
                        moe_bad.append(c)
                        failures.append("iteration %d: %s differs" % (i, c))
                row["ok"] = row["ok"] and not moe_bad
                row["objective_ref"] = res["objective"]
                print("%6s moe (trident ref rel): %s | objective (ref) %.9g  %s"
                      % ("", " | ".join(parts), res["objective"], "ok" if not moe_bad else "FAIL(" + ",".join(moe_bad) + ")"))
        else:
            print("%6d %15s %15.9g %9s %11s %11.5g %9s %12s %12.7g %9s  %s"
                  % (i, "-", res["loss"], "-", "-", res["lr"], "-", "-", res["grad_norm"], "-",
                     "not logged"))
            if moe:
                row["moe_ref"], row["objective_ref"] = res["moe"], res["objective"]
                print("%6s moe (ref): %s | objective %.9g" % ("", " | ".join("%s %.9g" % (c[4:], res["moe"][c])
                                                                            for c in MOE_METRICS), res["objective"]))
        step_rows.append(row)
    if cache is not None and not replaying:
        cache.record_tape(tape)
        cache.save()
    forced_upd = None
    if emulate is not None and args.params:
        # the forward pass and the optimizer alone, each from Trident's own state (no trajectory)
        if tape is None:
            forced_rows += forced_forward(bf, args.batches, args.params, metrics, cfg, emulate, start + 1,
                                          start + steps)
        if grads_t is not None:
            forced_upd = forced_update(ckpt, grads_it, grads_t, metrics, args.params, emulate)
    bf.close()
    elapsed = time.time() - t0
    if forced_rows:
        print("\nforward from Trident's %s parameters (the checkpoint's, dumps after iterations %s): loss of the next "
              "iteration, tolerance %.1e" % (emulate, ", ".join(str(r[0] - 1) for r in forced_rows), args.forward_rtol))
        print("%6s %17s %17s %9s" % ("iter", "loss_trident", "loss_ref", "rel"))
        for it, lr_, lt_, rel in forced_rows:
            ok = rel <= args.forward_rtol
            print("%6d %17.12g %17.12g %9.2e  %s" % (it, lt_, lr_, rel, "ok" if ok else "FAIL"))
            if not ok:
                failures.append("iteration %d: the loss from Trident's parameters differs by %.2e (> %.1e)"
                                % (it, rel, args.forward_rtol))
    if forced_upd is not None:
        differ, total, largest = forced_upd
        ok = differ <= args.update_tol * total
        print("update from Trident's gradients of iteration %d (MasterAdamW on the checkpoint's masters): "
              "%d of %d 16-bit parameters differ from Trident's (largest difference %.3g; allowed fraction %g)  %s"
              % (grads_it, differ, total, largest, args.update_tol, "ok" if ok else "FAIL"))
        if not ok:
            failures.append("iteration %d: the update of Trident's gradients differs in %d of %d parameters"
                            % (grads_it, differ, total))

    grad_rows = []
    if grads_t is not None and grads_skipped and grads_it in metrics and metrics[grads_it].get("skipped", 0.0) != 0.0:
        # fp16: the iteration overflowed in both (the skip verdicts are compared above)
        print("\ngradients of iteration %d not compared: the iteration overflowed (skipped) in Trident and in "
              "the reference" % grads_it)
        grads_t = None
    if grads_t is not None:
        gref_global = math.sqrt(sum(float((g ** 2).sum()) for g in ref_grads.values()))
        floor = args.grad_floor_frac * gref_global
        print("\ngradients of iteration %d: relative L2 error ||g_t - g_r|| / max(||g_r||, %.3g)"
              " (floor = %.0e x global norm %.6g), tolerance %.1e"
              % (grads_it, floor, args.grad_floor_frac, gref_global, args.grad_rtol))
        print("%-52s %12s %12s %10s %10s  %s" % ("tensor", "||g_ref||", "||g_trid||", "rel_l2",
                                                   "max_abs", "status"))
        worst = 0.0
        for n in param_names(cfg):
            gr, gt = ref_grads[n], grads_t[n]
            nr = float(np.linalg.norm(gr))
            nt = float(np.linalg.norm(gt))
            diff = gt - gr
            err = float(np.linalg.norm(diff))
            rel = err / max(nr, floor) if max(nr, floor) > 0 else (0.0 if err == 0 else float("inf"))
            mx = float(np.abs(diff).max()) if diff.size else 0.0
            ok = bool(rel <= args.grad_rtol)  # NaN fails
            if worst == worst and not (rel <= worst):  # a NaN, once seen, stays
                worst = rel
            if not ok:
                failures.append("gradient %s: relative error %.3e" % (n, rel))
            grad_rows.append({"name": n, "norm_ref": nr, "norm_trident": nt, "rel_l2": rel,
                              "max_abs": mx, "ok": ok})
            print("%-52s %12.6g %12.6g %10.2e %10.2e  %s" % (n, nr, nt, rel, mx, "ok" if ok else "FAIL"))
        print("worst gradient relative error: %.3e" % worst)

    if tape is not None:
        if tape.pos != tape.n:
            failures.append("dropout tape: %d masks recorded, the reference used %d" % (tape.n, tape.pos))
        kept = [k for _, _, k in tape.masks]
        print("dropout: %d of Trident's masks applied; kept fraction per mask %.4f .. %.4f (mean %.4f; p hidden %g, "
              "attention %g)" % (tape.pos, min(kept), max(kept), sum(kept) / len(kept), cfg.hidden_dropout,
                                 cfg.attention_dropout))
    if args.params and not param_rows:
        failures.append("%s: no parameter dump for iterations %d..%d" % (args.params, start + 1, start + steps))
    if param_rows:
        print("worst parameter error: %.3e (iterations %s)" % (worst_param, ", ".join(str(r["iteration"]) for r in param_rows)))
    ok = not failures
    print("\nreference time %.1f s for %d steps" % (elapsed, steps))
    if ok:
        print("PASS: %d logged steps within loss rtol %.1e, lr rtol %.1e, grad-norm rtol %.1e%s"
              % (len(compared), args.loss_rtol, args.lr_rtol, args.gnorm_rtol,
                 (", %d gradient tensors within %.1e" % (len(grad_rows), args.grad_rtol))
                 if grad_rows else " (no gradient file)"))
    else:
        print("FAIL: %d problem(s):" % len(failures))
        for msg in failures[:50]:
            print("  " + msg)
    if args.report:
        rep = {"pass": ok, "failures": failures, "dtype": args.dtype, "emulate": emulate or "none",
               "tolerances": {"loss_rtol": args.loss_rtol, "grad_rtol": args.grad_rtol, "param_rtol": args.param_rtol,
                              "grad_floor_frac": args.grad_floor_frac,
                              "grad_norm_rtol": args.gnorm_rtol, "lr_rtol": args.lr_rtol},
               "checkpoint_iteration": start, "steps": step_rows, "gradients_iteration": grads_it,
               "gradients": grad_rows, "parameters": param_rows, "worst_parameter": worst_param,
               "forward_from_trident": [{"iteration": r[0], "loss_ref": r[1], "loss_trident": r[2], "loss_rel": r[3]}
                                        for r in forced_rows],
               "update_from_trident": (None if forced_upd is None else
                                       {"iteration": grads_it, "differ": forced_upd[0], "elements": forced_upd[1],
                                        "largest": forced_upd[2]}),
               "seconds": elapsed}
        if moe:
            if args.moe_rtol is not None or args.moe_load_rtol is not None:
                rep["tolerances"]["moe_rtol"] = moe_tol["moe_aux_loss"]
                rep["tolerances"]["moe_load_rtol"] = moe_tol["moe_max_load"]
            rep["moe_columns_compared"] = moe_present
            rep["moe_columns_absent"] = [c for c in MOE_METRICS if c not in moe_present]
        with open(args.report, "w") as fh:
            json.dump(rep, fh, indent=1)
    return 0 if ok else 1


# --------------------------------------------------------------------------------------
# eval
# --------------------------------------------------------------------------------------

def eval_windows_loss(model, tokens, S, n_windows, chunk=8):
    """Mean next-token cross-entropy over windows tokens[k*S : k*S+S+1], k < n_windows."""
    need = n_windows * S + 1
    if tokens.shape[0] < need:
        raise InputError("shard has %d tokens, %d windows of seq_length %d need %d"
                         % (tokens.shape[0], n_windows, S, need))
    total = 0.0
    with torch.no_grad():
        for k0 in range(0, n_windows, chunk):
            k1 = min(n_windows, k0 + chunk)
            w = np.stack([np.asarray(tokens[k * S:k * S + S + 1], dtype=np.int64)
                          for k in range(k0, k1)])
            if w.min() < 0 or w.max() >= model.cfg.vocab_size:
                raise InputError("shard has token ids outside [0, %d)" % model.cfg.vocab_size)
            total += float(model.loss_sum(torch.from_numpy(w)))
            model.moe_take()  # (MoE: the router statistics are not needed here)
    return total / (n_windows * S)


def cmd_eval(args):
    torch.set_num_threads(args.threads)
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    ckpt = Checkpoint(args.checkpoint, need_optimizer=False)
    _need_file(args.shard, "shard")
    with h5py.File(args.shard, "r") as f:
        if "tokens" not in f:
            raise InputError("%s: dataset /tokens is missing" % args.shard)
        ds = f["tokens"]
        if ds.ndim != 1:
            raise InputError("%s: /tokens must be 1-D, has shape %s" % (args.shard, ds.shape))
        S = ckpt.config.seq_length
        need = args.windows * S + 1
        if ds.shape[0] < need:
            raise InputError("%s: %d tokens, %d windows of seq_length %d need %d"
                             % (args.shard, ds.shape[0], args.windows, S, need))
        tokens = ds[:need]
    model = GPTReference(ckpt.config, ckpt.params, dtype)
    # MoE: the windows go through in micro-batches (the router's unit, which capacity depends on)
    loss = eval_windows_loss(model, tokens, S, args.windows,
                             ckpt.config.micro_batch_size if is_moe(ckpt.config) else 8)
    print("eval loss: %.9g" % loss)
    return 0


# --------------------------------------------------------------------------------------

def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd")

    c = sub.add_parser("compare", help="train from a checkpoint and compare with Trident's metrics/grads")
    c.add_argument("--checkpoint", required=True, help="Trident checkpoint.h5 (e.g. iter_0000000)")
    c.add_argument("--batches", required=True, help="batches.h5 with /iter_NNNNNNN datasets")
    c.add_argument("--metrics", required=True, help="Trident's metrics CSV")
    c.add_argument("--grads", help="Trident's grads.h5 (gradients of one iteration, usually 1)")
    c.add_argument("--steps", type=int, help="steps to train (default: all batches/metrics rows)")
    c.add_argument("--loss-rtol", type=float, default=DEFAULT_LOSS_RTOL)
    c.add_argument("--grad-rtol", type=float, default=DEFAULT_GRAD_RTOL)
    c.add_argument("--grad-floor-frac", type=float, default=DEFAULT_GRAD_FLOOR_FRAC,
                   help="per-tensor norm floor as a fraction of the global grad norm")
    c.add_argument("--gnorm-rtol", type=float, default=DEFAULT_GNORM_RTOL)
    c.add_argument("--lr-rtol", type=float, default=DEFAULT_LR_RTOL)
    c.add_argument("--moe-rtol", type=float,
                   help="MoE: relative tolerance of the metrics' moe_aux_loss and moe_z_loss (default: --loss-rtol)")
    c.add_argument("--moe-load-rtol", type=float,
                   help="MoE: relative tolerance of moe_max_load and moe_dropped, which count routing selections "
                        "(default: --loss-rtol)")
    c.add_argument("--params", help="Trident's debug.dump_params directory: the parameters after the iterations "
                   "it holds are compared with the reference's")
    c.add_argument("--param-rtol", type=float, default=DEFAULT_PARAM_RTOL,
                   help="per tensor, relative to the reference's change since the checkpoint")
    c.add_argument("--dropout-tape", help="Trident's debug.dump_dropout file: the masks of a run with dropout")
    c.add_argument("--eod-id", type=int,
                   help="the corpus's end-of-document token id (runs with data.reset_position_ids, "
                        "reset_attention_mask or eod_mask_loss: the documents' boundaries)")
    c.add_argument("--forward-rtol", type=float, default=DEFAULT_FORWARD_RTOL,
                   help="16-bit emulation: loss of iteration k+1 from Trident's parameters after k (--params dumps)")
    c.add_argument("--update-tol", type=float, default=0.0,
                   help="16-bit emulation: fraction of the 16-bit parameters allowed to differ after the update of "
                        "Trident's own step gradients (default 0: bit for bit)")
    c.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    c.add_argument("--emulate", choices=EMULATE_CHOICES, default="auto",
                   help="round to 16 bits where Trident's mixed precision does (bf16 / fp16; fp32 masters); "
                        "auto (default): as the checkpoint's deck precision.dtype says; none: the plain reference")
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--cache", metavar="DIR",
                   help="replay the reference's trajectory recorded in DIR by an earlier compare of the same inputs "
                        "(code, platform, deck configuration, checkpoint, batches, dropout masks, 16-bit emulation), "
                        "else train it and record it there (run_case.py's default: ~/.cache/trident/reference)")
    c.add_argument("--report", help="write a JSON report here")

    e = sub.add_parser("eval", help="recompute Trident's eval mode on a token shard")
    e.add_argument("--checkpoint", required=True)
    e.add_argument("--shard", required=True, help="token shard .h5 with /tokens")
    e.add_argument("--windows", type=int, required=True)
    e.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    e.add_argument("--threads", type=int, default=2)
    return ap


def main(argv=None):
    tune_malloc()
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.cmd is None:
        ap.print_help()
        return 2
    try:
        if args.cmd == "compare":
            if args.steps is not None and args.steps <= 0:
                raise InputError("--steps must be positive")
            return cmd_compare(args)
        if args.windows <= 0:
            raise InputError("--windows must be positive")
        return cmd_eval(args)
    except InputError as e:
        print("error: %s" % e, file=sys.stderr)
        return 2
    except OSError as e:  # unreadable / not HDF5
        print("error: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
