#!/usr/bin/env python3
"""Writes and scores Hugging Face Llama-family model directories, independently of Trident.

Llama, Mistral, Qwen2 and Qwen3 causal LMs (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM) and the mixtures of experts Mixtral and Qwen3-MoE (MixtralForCausalLM,
Qwen3MoeForCausalLM) written here in PyTorch float64 from the published architecture (transformers'
modeling_llama / modeling_mistral / modeling_qwen2 / modeling_qwen3 / modeling_mixtral /
modeling_qwen3_moe and their config.json conventions): RMSNorm, rotate-half rotary embeddings (with
Llama 3's frequency scaling), grouped-query causal attention (Qwen3, Qwen3-MoE: per-head RMSNorm of
q and k before the rotation), the SiLU-gated MLP; the sparse MoE block (MixtralSparseMoeBlock,
Qwen3MoeSparseMoeBlock): router logits x W_gate^T, softmax over all experts, the top k of those
probabilities (equal ones: the lower expert index first), renormalised over the k (Mixtral always,
Qwen3-MoE when norm_topk_prob), each token's output the sum of its k experts' SiLU-gated MLPs
weighted by them (Mixtral expert: w2(silu(w1 x) * w3 x); Qwen3-MoE: down(silu(gate x) * up x)).
Qwen3-MoE layers in mlp_only_layers, or with (i + 1) % decoder_sparse_step != 0, have a dense MLP
of intermediate_size; the experts' width is moe_intermediate_size (Mixtral: intermediate_size).
Nothing here comes from Trident's C++ sources or from gpt_reference.py / torch_reference.py; from
hf_models.py it takes the safetensors parser and the scoring of a shard's windows. The writer of
the safetensors format (8-byte little-endian header length, JSON header padded with spaces to a
multiple of 8, raw little-endian data; bf16 rounded to nearest even by integer arithmetic) is this
file's own.

usage:
  hf_llama.py write --family {llama,mistral,qwen2,qwen3,mixtral,qwen3_moe} --out DIR --seed N
        [--layers 2] [--hidden 64] [--heads 4] [--kv-heads 2] [--head-dim 0] [--ffn 96] [--vocab 50257]
        [--max-pos 64] [--rope-theta 10000 (mixtral, qwen3_moe: 1e6)] [--rms-eps 1e-5]
        [--rope-scaling none|llama3:FACTOR,LOW,HIGH,ORIGMAX]
        [--tie|--no-tie] [--attention-bias] [--mlp-bias] [--dtype f32|bf16|f16] [--init-std 0.02]
        [--shard-size BYTES] [--permute-qk none|meta]
        mixtral, qwen3_moe: [--experts 4] [--topk 2] [--expert-ffn 0]
        qwen3_moe only: [--norm-topk-prob|--no-norm-topk-prob] [--mlp-only-layers I,J,..]
        [--decoder-sparse-step 1]
      a random model directory laid out as save_pretrained lays it out: config.json (indent 2, sorted
      keys) and model.safetensors, or with --shard-size > 0 and more than one shard
      model-0000i-of-0000K.safetensors plus model.safetensors.index.json. Tensors are generated and
      written one at a time in float32 chunks from numpy Generators seeded by (seed, crc32 of the
      name): matrices N(0, init-std), norm weights 1 + N(0, 0.1), biases N(0, 0.02). --head-dim 0 is
      hidden / heads. --attention-bias: llama, qwen3 and qwen3_moe only (q, k, v, o biases; qwen2
      always has q, k, v biases); --mlp-bias: llama only; --rope-scaling: not mistral or mixtral.
      --permute-qk meta stores q_proj and k_proj (weights and biases) in Meta's interleaved rotary
      row order, the inverse of convert_llama_weights_to_hf's permute: within each head of d rows,
      Meta row 2j + c holds the Hugging Face row c*d/2 + j (j < d/2, c in {0, 1}); a model loaded
      from it scores differently.
      MoE families: --experts E experts in each sparse layer, the top --topk of them per token, each
      of width --expert-ffn (0: --ffn); Mixtral's intermediate_size is that width, Qwen3-MoE's is
      --ffn, the width of its dense layers (those in --mlp-only-layers, and every layer i with
      (i + 1) % --decoder-sparse-step != 0); --norm-topk-prob (the default, as released)
      renormalises the k probabilities. Router weights are matrices like the others, N(0, init-std).
      Prints `wrote DIR: <family>, <n> tensors, <tensor bytes> bytes in <k> file(s)`
  hf_llama.py eval --model DIR --shard FILE --windows N --seq S [--stride s] [--transformers] [--device D]
      hf_models.py gpt-eval's score of a token shard (windows tokens[k*s : k*s + S + 1], k < N; s = S
      disjoint, s < S: each later window scores only its last s targets), with this file's model of
      DIR (config.json and model.safetensors or model.safetensors.index.json and its shards; every
      tensor the config implies must be there and no other); prints `eval tokens:`, `eval loss:`,
      `eval perplexity:`
  hf_llama.py generate --model DIR --prompt 5,17,42 --tokens N [--transformers] [--device D]
      greedy decoding; prints `tokens: <id> ...`, the N generated ids
  hf_llama.py selftest
      checks of this file's pieces (RoPE, Llama 3 scaling, GQA, the safetensors writer, --permute-qk,
      the MoE block: top-k = E is the dense mixture, renormalisation, ties, Qwen3-MoE's dense layers)
  --transformers  load DIR with transformers' AutoModelForCausalLM in float32 instead (exit 77 when
                  transformers is not installed); --device cuda runs on a GPU (TF32 off)
Not implemented (exit 2): rope_scaling types other than llama3, an active sliding window, hidden_act
other than silu. OMP_NUM_THREADS sets torch's threads (default 1).
Exit: 0, 1 when selftest fails, 2 on bad input, 77 when --transformers is asked for and missing.
"""
import argparse
import json
import math
import os
import re
import struct
import sys
import tempfile
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_models  # noqa: E402
from hf_models import InputError, read_safetensors  # noqa: E402

# architectures entry and the family's real bos/eos ids (Llama 3, Mistral 7B v0.3, Qwen2, Qwen3)
FAMILIES = {
    "llama": ("LlamaForCausalLM", 128000, 128001),
    "mistral": ("MistralForCausalLM", 1, 2),
    "qwen2": ("Qwen2ForCausalLM", 151643, 151643),
    "qwen3": ("Qwen3ForCausalLM", 151643, 151645),
    "mixtral": ("MixtralForCausalLM", 1, 2),  # Mixtral 8x7B v0.1
    "qwen3_moe": ("Qwen3MoeForCausalLM", 151643, 151645),  # Qwen3-30B-A3B
}
MOE_FAMILIES = ("mixtral", "qwen3_moe")
# router_aux_loss_coef of the released configs (training only: it does not change the forward)
AUX_LOSS_COEF = {"mixtral": 0.02, "qwen3_moe": 0.001}
# --dtype: (safetensors dtype, config.json torch_dtype)
DTYPES = {"f32": ("F32", "float32"), "bf16": ("BF16", "bfloat16"), "f16": ("F16", "float16")}
ITEMSIZE = {"F32": 4, "BF16": 2, "F16": 2}
CHUNK = 1 << 22  # float32 values generated and encoded at a time


# ---------------------------------------------------------------- the architecture a config.json describes

class Spec:
    """What this reference reads from a config.json; InputError for what it does not implement."""

    def __init__(self, cfg):
        self.family = cfg.get("model_type")
        if self.family not in FAMILIES:
            raise InputError(f"model_type {self.family!r}: not one of {', '.join(FAMILIES)}")
        if cfg.get("hidden_act", "silu") != "silu":
            raise InputError(f"hidden_act {cfg['hidden_act']!r}: only silu is implemented")
        if (self.family in ("mistral", "mixtral") and cfg.get("sliding_window") is not None) or \
                (self.family in ("qwen2", "qwen3", "qwen3_moe") and cfg.get("use_sliding_window")):
            raise InputError("an active sliding window: not implemented")
        self.hidden = cfg["hidden_size"]
        self.layers = cfg["num_hidden_layers"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads") or self.heads
        self.head_dim = cfg.get("head_dim") or self.hidden // self.heads
        self.ffn = cfg["intermediate_size"]
        self.vocab = cfg["vocab_size"]
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.tie = cfg.get("tie_word_embeddings", False)
        # transformers 5 writes rope_parameters in place of rope_theta and rope_scaling
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        self.rope_theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind == "llama3":
            self.llama3 = (rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"],
                           rope["original_max_position_embeddings"])
        elif kind == "default":
            self.llama3 = None
        else:
            raise InputError(f"rope_scaling type {kind!r}: only llama3 is implemented")
        if self.heads % self.kv_heads or self.head_dim % 2 or min(self.hidden, self.layers, self.heads,
                                                                  self.ffn, self.vocab) < 1:
            raise InputError("config.json: sizes must be positive, heads a multiple of num_key_value_heads, "
                             "head_dim even")
        bias = cfg.get("attention_bias", False)
        self.qkv_bias = {"llama": bias, "mistral": False, "qwen2": True, "qwen3": bias, "mixtral": False,
                         "qwen3_moe": bias}[self.family]
        self.o_bias = self.qkv_bias and self.family != "qwen2"
        self.mlp_bias = self.family == "llama" and cfg.get("mlp_bias", False)
        self.qk_norm = self.family in ("qwen3", "qwen3_moe")
        # mixtures of experts: E experts of width expert_ffn in the layers of moe_layers, top-k routing
        self.experts, self.topk, self.expert_ffn, self.norm_topk, self.moe_layers = 0, 0, 0, False, ()
        # (a key left out: the default of transformers' MixtralConfig / Qwen3MoeConfig)
        if self.family == "mixtral":  # every layer sparse; intermediate_size is the experts' width
            self.experts, self.topk = cfg.get("num_local_experts", 8), cfg.get("num_experts_per_tok", 2)
            self.expert_ffn, self.norm_topk = self.ffn, True
            self.moe_layers = tuple(range(self.layers))
        elif self.family == "qwen3_moe":  # Qwen3MoeDecoderLayer's choice of Qwen3MoeSparseMoeBlock
            self.experts, self.topk = cfg.get("num_experts", 128), cfg.get("num_experts_per_tok", 8)
            self.expert_ffn = cfg.get("moe_intermediate_size", 768)
            self.norm_topk = cfg.get("norm_topk_prob", False)  # not renormalised unless asked for
            step, dense = cfg.get("decoder_sparse_step", 1), cfg.get("mlp_only_layers") or []
            if not isinstance(step, int) or step < 1 or not all(isinstance(i, int) for i in dense):
                raise InputError("config.json: decoder_sparse_step must be a positive integer, mlp_only_layers "
                                 "a list of layer indices")
            self.moe_layers = tuple(i for i in range(self.layers)
                                    if i not in dense and self.experts > 0 and (i + 1) % step == 0)
        if self.moe_layers and not (1 <= self.topk <= self.experts and self.expert_ffn >= 1):
            raise InputError("config.json: the experts per token must lie in 1 .. the experts, their width positive")

    def tensors(self):
        """[(name, shape)] in Hugging Face's state_dict order (the modules' registration order)."""
        H, d, F = self.hidden, self.head_dim, self.ffn

        def linear(name, out, inp, bias):
            return [(name + ".weight", (out, inp))] + ([(name + ".bias", (out,))] if bias else [])

        out = [("model.embed_tokens.weight", (self.vocab, H))]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            out += linear(a + "q_proj", self.heads * d, H, self.qkv_bias)
            out += linear(a + "k_proj", self.kv_heads * d, H, self.qkv_bias)
            out += linear(a + "v_proj", self.kv_heads * d, H, self.qkv_bias)
            out += linear(a + "o_proj", H, self.heads * d, self.o_bias)
            if self.qk_norm:
                out += [(a + "q_norm.weight", (d,)), (a + "k_norm.weight", (d,))]
            if i in self.moe_layers:  # the router (gate), then the experts
                m, (g, u, dn) = self.moe_names(i)
                out.append((m + "gate.weight", (self.experts, H)))
                for j in range(self.experts):
                    e = f"{m}experts.{j}."
                    for name in (g, u, dn) if self.family == "qwen3_moe" else (g, dn, u):  # registration order
                        out.append((e + name + ".weight", (H, self.expert_ffn) if name == dn else (self.expert_ffn, H)))
            else:
                out += linear(p + "mlp.gate_proj", F, H, self.mlp_bias)
                out += linear(p + "mlp.up_proj", F, H, self.mlp_bias)
                out += linear(p + "mlp.down_proj", H, F, self.mlp_bias)
            out += [(p + "input_layernorm.weight", (H,)), (p + "post_attention_layernorm.weight", (H,))]
        out.append(("model.norm.weight", (H,)))
        if not self.tie:
            out.append(("lm_head.weight", (self.vocab, H)))
        return out

    def moe_names(self, i):
        """(prefix of layer i's sparse MoE block, its experts' (gated, up, down) projection names)."""
        if self.family == "mixtral":  # MixtralBlockSparseTop2MLP: w2(silu(w1 x) * w3 x)
            return f"model.layers.{i}.block_sparse_moe.", ("w1", "w3", "w2")
        return f"model.layers.{i}.mlp.", ("gate_proj", "up_proj", "down_proj")


def make_config(a):
    """config.json of `write`, mirroring the released configs of each family."""
    arch, bos, eos = FAMILIES[a.family]
    d = a.head_dim or a.hidden // a.heads
    cfg = {
        "architectures": [arch], "model_type": a.family, "hidden_size": a.hidden,
        "intermediate_size": a.expert_ffn if a.family == "mixtral" else a.ffn,
        "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
        "hidden_act": "silu", "max_position_embeddings": a.max_pos, "rms_norm_eps": a.rms_eps,
        "rope_theta": a.rope_theta, "tie_word_embeddings": a.tie, "vocab_size": a.vocab,
        "torch_dtype": DTYPES[a.dtype][1], "initializer_range": a.init_std, "attention_dropout": 0.0,
        "use_cache": True,
        # the family's own ids where the vocabulary holds them, else its last id (GPT-2's <|endoftext|>)
        "bos_token_id": bos if bos < a.vocab else a.vocab - 1, "eos_token_id": eos if eos < a.vocab else a.vocab - 1,
    }
    if a.family not in ("mistral", "mixtral"):
        cfg["rope_scaling"] = a.rope_scaling
    if a.family in ("qwen3", "qwen3_moe") or d != a.hidden // a.heads or a.hidden % a.heads:
        cfg["head_dim"] = d
    if a.family == "llama":
        cfg.update(attention_bias=a.attention_bias, mlp_bias=a.mlp_bias, pretraining_tp=1)
    elif a.family == "mistral":
        cfg["sliding_window"] = None
    elif a.family == "qwen2":
        cfg.update(use_sliding_window=False, sliding_window=4096, max_window_layers=a.layers)
    elif a.family == "mixtral":  # Mixtral 8x7B v0.1's keys (router_jitter_noise: later transformers)
        cfg.update(num_local_experts=a.experts, num_experts_per_tok=a.topk, sliding_window=None,
                   router_aux_loss_coef=AUX_LOSS_COEF["mixtral"], output_router_logits=False, router_jitter_noise=0.0)
    else:
        cfg.update(attention_bias=a.attention_bias, use_sliding_window=False, sliding_window=None,
                   max_window_layers=a.layers)
        if a.family == "qwen3_moe":  # Qwen3-30B-A3B's keys
            cfg.update(num_experts=a.experts, num_experts_per_tok=a.topk, moe_intermediate_size=a.expert_ffn,
                       norm_topk_prob=a.norm_topk_prob, decoder_sparse_step=a.decoder_sparse_step,
                       mlp_only_layers=a.mlp_only_layers, router_aux_loss_coef=AUX_LOSS_COEF["qwen3_moe"],
                       output_router_logits=False)
    return cfg


# ---------------------------------------------------------------- the safetensors writer

def bf16_bits(x, work=None):
    """bfloat16 bit patterns of float32 values: the upper 16 bits rounded to nearest, ties to even
    (adding 0x7FFF plus the lowest kept bit carries into the kept bits exactly when the dropped half
    exceeds half an ulp, or equals it and the kept part is odd); NaNs stay (quiet) NaNs. work: None
    (a new array is returned, of x's shape) or (uint32, uint16) arrays of at least x.size values,
    reused from call to call (flat: a view of the uint16 one is returned, valid until the next call
    with them), which spares the page faults of new memory for each chunk of a large model."""
    f = np.ascontiguousarray(x, dtype="<f4")
    u = f.view("<u4")
    if work is None:
        r = u >> np.uint32(16)
    else:
        u = u.reshape(-1)
        r = np.right_shift(u, np.uint32(16), out=work[0][:u.size])
    r &= np.uint32(1)  # in place from here on: this runs over every value of a large model
    r += np.uint32(0x7FFF)
    r += u
    r >>= np.uint32(16)
    if f.size and np.isnan(f.max()):  # max is NaN exactly when a value is
        nan = np.isnan(f.reshape(r.shape))
        r[nan] = (u[nan] >> np.uint32(16)) | np.uint32(0x40)
    if work is None:
        return r.astype("<u2")
    out = work[1][:u.size]
    np.copyto(out, r, casting="unsafe")
    return out


def encode(x, dtype, work=None):
    """Little-endian bytes of float32 values in a safetensors dtype (work: bf16_bits')."""
    if dtype == "F32":
        return np.ascontiguousarray(x, dtype="<f4")
    if dtype == "F16":
        with np.errstate(over="ignore"):
            return x.astype("<f2")
    return bf16_bits(x, work)


def write_safetensors(path, entries, dtype, values):
    """Writes the tensors [(name, shape)] in this order; values(name, shape) yields each one's float32
    values, row-major, in chunks."""
    size = ITEMSIZE[dtype]
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in entries:
        n = math.prod(shape) * size
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    work = None  # bf16_bits' arrays, as large as the largest chunk so far
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, shape in entries:
            for chunk in values(name, shape):
                if dtype == "BF16" and (work is None or work[0].size < chunk.size):
                    work = (np.empty(chunk.size, "<u4"), np.empty(chunk.size, "<u2"))
                f.write(encode(chunk, dtype, work).data)
    return offset


def shard_plan(entries, itemsize, limit):
    """Tensors grouped into shards in order: a new shard starts when the next tensor would take the
    current (non-empty) one past `limit` bytes; one shard when limit is 0."""
    shards, size = [[]], 0
    for name, shape in entries:
        n = math.prod(shape) * itemsize
        if limit and shards[-1] and size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += n
    return shards


def hf_to_meta_rows(w, heads):
    """Meta's interleaved rotary row order of a q_proj / k_proj weight or bias in Hugging Face's
    rotate-half order: per head of d rows, Meta row 2j + c = HF row c*d/2 + j (j < d/2, c in {0, 1})."""
    d = w.shape[0] // heads
    return w.reshape(heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def meta_to_hf_rows(w, heads):
    """The inverse: convert_llama_weights_to_hf's permute (view (heads, d/2, 2, ...), swap the two
    middle axes)."""
    d = w.shape[0] // heads
    return w.reshape(heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_values(seed, init_std, chunk=CHUNK, reuse=False):
    """values(name, shape) for write_safetensors: one numpy Generator per tensor, seeded by (seed,
    crc32 of the name), so a tensor's values do not depend on which other tensors exist (nor on
    chunk or reuse). reuse: every chunk is drawn into one array, valid only until the next chunk is
    asked for (for a consumer that writes each chunk before the next, as write_safetensors does;
    new memory for each chunk costs, in page faults, about as much as drawing its values)."""
    buf = np.empty(chunk, np.float32) if reuse else None

    def values(name, shape):
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        mean, std = (1.0, 0.1) if name.endswith("norm.weight") else (0.0, 0.02) if name.endswith(".bias") \
            else (0.0, init_std)
        n = math.prod(shape)
        for b in range(0, n, chunk):
            k = min(chunk, n - b)
            x = rng.standard_normal(k, dtype=np.float32) if buf is None else \
                rng.standard_normal(dtype=np.float32, out=buf[:k])
            x *= np.float32(std)
            x += np.float32(mean)
            yield x
    return values


def meta_permuted(values, spec):
    """values with q_proj and k_proj (weights and biases) moved to Meta's row order."""
    def permuted(name, shape):
        heads = spec.heads if ".q_proj." in name else spec.kv_heads if ".k_proj." in name else 0
        if not heads:
            yield from values(name, shape)
            return
        w = np.concatenate([np.array(c) for c in values(name, shape)]).reshape(shape)  # chunks may share an array
        yield hf_to_meta_rows(w, heads).ravel()
    return permuted


def write_model(out, cfg, dtype, shard_size, values):
    """Writes config.json and the weights as save_pretrained does (sorted, indented JSON; one shard is
    model.safetensors without an index), after removing weight files of an earlier save there.
    Returns (tensors, tensor bytes, files)."""
    spec = Spec(cfg)
    entries = spec.tensors()
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if re.fullmatch(r"model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json", f):
            os.remove(os.path.join(out, f))
    with open(os.path.join(out, "config.json"), "w") as f:
        f.write(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    shards = shard_plan(entries, ITEMSIZE[dtype], shard_size)
    if len(shards) == 1:
        return len(entries), write_safetensors(os.path.join(out, "model.safetensors"), entries, dtype, values), 1
    total, weight_map = 0, {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_safetensors(os.path.join(out, name), shard, dtype, values)
        weight_map.update((t, name) for t, _ in shard)
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2,
                           sort_keys=True) + "\n")
    return len(entries), total, len(shards)


def cmd_write(a):
    moe = a.family in MOE_FAMILIES
    moe_given = a.experts is not None or a.topk is not None or a.expert_ffn != 0
    qwen_moe_given = not a.norm_topk_prob or a.mlp_only_layers.strip() != "" or a.decoder_sparse_step is not None
    if a.rope_theta is None:  # the released configs': Mixtral 8x7B and Qwen3-MoE 1e6
        a.rope_theta = 1e6 if moe else 10000.0
    if moe:
        a.experts = 4 if a.experts is None else a.experts
        a.topk = 2 if a.topk is None else a.topk
        a.expert_ffn = a.expert_ffn or a.ffn
        a.decoder_sparse_step = 1 if a.decoder_sparse_step is None else a.decoder_sparse_step
        try:
            a.mlp_only_layers = sorted({int(v) for v in a.mlp_only_layers.split(",") if v.strip()})
        except ValueError:
            raise InputError(f"--mlp-only-layers {a.mlp_only_layers!r}: expected comma-separated layer indices")
    checks = [(a.seed >= 0, "--seed must be >= 0"),
              (min(a.layers, a.hidden, a.heads, a.kv_heads, a.ffn, a.vocab, a.max_pos) >= 1,
               "sizes must be positive"),
              (a.heads % a.kv_heads == 0, "--heads must be a multiple of --kv-heads"),
              (a.head_dim > 0 or a.hidden % a.heads == 0,
               "--hidden must be a multiple of --heads (or give --head-dim)"),
              ((a.head_dim or a.hidden // a.heads) % 2 == 0, "the head dimension must be even"),
              (a.rope_theta > 0 and a.rms_eps > 0 and a.init_std >= 0 and a.shard_size >= 0,
               "--rope-theta and --rms-eps must be positive, --init-std and --shard-size not negative"),
              (not a.attention_bias or a.family in ("llama", "qwen3", "qwen3_moe"),
               "--attention-bias: llama, qwen3 and qwen3_moe only (qwen2 always has q, k, v biases)"),
              (not a.mlp_bias or a.family == "llama", "--mlp-bias: llama only"),
              (a.rope_scaling == "none" or a.family not in ("mistral", "mixtral"),
               "--rope-scaling: Mistral and Mixtral configs have none"),
              (moe or not moe_given, "--experts, --topk, --expert-ffn: mixtral and qwen3_moe only"),
              (a.family == "qwen3_moe" or not qwen_moe_given,
               "--no-norm-topk-prob, --mlp-only-layers, --decoder-sparse-step: qwen3_moe only (Mixtral "
               "renormalises, every layer sparse)")]
    if moe:
        checks += [(a.experts >= 1 and 1 <= a.topk <= a.experts, "--topk must lie in 1 .. --experts"),
                   (a.expert_ffn >= 1 and a.decoder_sparse_step >= 1,
                    "--expert-ffn and --decoder-sparse-step must be positive"),
                   (all(0 <= i < a.layers for i in a.mlp_only_layers), "--mlp-only-layers: indices of layers")]
    for ok, message in checks:
        if not ok:
            raise InputError(message)
    if a.rope_scaling == "none":
        a.rope_scaling = None
    else:
        kind, _, rest = a.rope_scaling.partition(":")
        try:
            factor, lo, hi, orig = (float(v) for v in rest.split(","))
        except ValueError:
            raise InputError(f"--rope-scaling {a.rope_scaling!r}: expected llama3:FACTOR,LOW,HIGH,ORIGMAX")
        if kind != "llama3" or not (factor > 0 and 0 < lo < hi and orig >= 1 and orig == int(orig)):
            raise InputError(f"--rope-scaling {a.rope_scaling!r}: expected llama3:FACTOR,LOW,HIGH,ORIGMAX "
                             "with 0 < LOW < HIGH")
        a.rope_scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": lo,
                          "high_freq_factor": hi, "original_max_position_embeddings": int(orig)}
    cfg = make_config(a)
    values = random_values(a.seed, a.init_std, reuse=True)
    if a.permute_qk == "meta":
        values = meta_permuted(values, Spec(cfg))
    n, nbytes, files = write_model(a.out, cfg, DTYPES[a.dtype][0], a.shard_size, values)
    print(f"wrote {a.out}: {a.family}, {n} tensors, {nbytes} bytes in {files} file(s)")
    return 0


# ---------------------------------------------------------------- the model

def load_model(model_dir):
    """(Spec, {name: float64 numpy array}) of a model directory; InputError unless it holds exactly
    the tensors its config implies, with their shapes."""
    with open(os.path.join(model_dir, "config.json")) as f:
        spec = Spec(json.load(f))
    single = os.path.join(model_dir, "model.safetensors")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(single):
        w = read_safetensors(single)
    elif os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        w = {}
        for file in sorted(set(weight_map.values())):
            part = read_safetensors(os.path.join(model_dir, file))
            stray = [t for t in part if weight_map.get(t) != file]
            if stray:
                raise InputError(f"{file}: {stray[0]} is not mapped to it by the index")
            w.update(part)
        if set(weight_map) - set(w):
            raise InputError(f"{min(set(weight_map) - set(w))}: in the index but in no shard")
    else:
        raise InputError(f"{model_dir}: needs model.safetensors or model.safetensors.index.json")
    expected = dict(spec.tensors())
    for problem, names in (("missing", set(expected) - set(w)), ("not used by " + spec.family, set(w) - set(expected))):
        if names:
            raise InputError(f"{model_dir}: {len(names)} tensor(s) {problem}, e.g. {min(names)}")
    for name, shape in expected.items():
        if tuple(w[name].shape) != shape:
            raise InputError(f"{name}: shape {list(w[name].shape)}, the config implies {list(shape)}")
    return spec, w


def rms_norm(x, weight, eps):
    import torch
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_inv_freq(d, theta, llama3=None):
    """inv_freq[i] = theta^(-2i/d), i < d/2, in float64; with llama3 = (factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings), Llama 3's rescaling: wavelengths
    2 pi / inv_freq shorter than L / high are kept, those longer than L / low divided by the factor,
    those between interpolated by smooth = (L / wavelength - low) / (high - low)."""
    import torch
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    if llama3 is None:
        return inv
    factor, lo, hi, L = llama3
    wavelen = 2 * math.pi / inv
    smooth = (L / wavelen - lo) / (hi - lo)
    between = (1 - smooth) * inv / factor + smooth * inv
    return torch.where(wavelen < L / hi, inv, torch.where(wavelen > L / lo, inv / factor, between))


def rope_cos_sin(T, inv_freq):
    """cos and sin [T, d] of position * inv_freq, the d/2 frequencies repeated for both halves."""
    import torch
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None]
    angles = torch.cat([angles, angles], -1)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate-half RoPE on [..., T, d]: dimension i pairs with i + d/2, each pair turned by its angle."""
    import torch
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


def gqa_attention(q, k, v):
    """Causal softmax(q k^T / sqrt(d)) v for q [B, nh, T, d] and k, v [B, ng, T, d]: query head h reads
    key/value head h // (nh / ng), so the nh / ng query heads of a group share one axis."""
    import torch
    B, nh, T, d = q.shape
    ng = k.shape[1]
    q = q.reshape(B, ng, nh // ng, T, d)
    s = q @ k[:, :, None].transpose(-1, -2) / math.sqrt(d)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), -math.inf)
    return (torch.softmax(s, -1) @ v[:, :, None]).reshape(B, nh, T, d)


def linear(x, w, name):
    """nn.Linear, y = x W^T (+ b where the checkpoint has the bias; load_model checked which it has)."""
    y = x @ w[name + ".weight"].T
    return y + w[name + ".bias"] if name + ".bias" in w else y


def gated_mlp(x, w, prefix, names):
    """The SiLU-gated MLP down(silu(gate x) * up x) of the projections prefix + names (gate, up,
    down): LlamaMLP, Qwen3MoeMLP, MixtralBlockSparseTop2MLP with (w1, w3, w2)."""
    import torch
    g, u, dn = (prefix + n for n in names)
    return linear(torch.nn.functional.silu(linear(x, w, g)) * linear(x, w, u), w, dn)


def route(router_logits, k, renormalise):
    """(experts [N, k], weights [N, k]) of each row: softmax over all experts, the k largest
    probabilities (a stable descending sort: of equal ones the lower expert index first),
    renormalised to sum 1 over the k when asked (Mixtral; Qwen3-MoE's norm_topk_prob)."""
    import torch
    probs = torch.softmax(router_logits, -1)
    top, idx = torch.sort(probs, dim=-1, descending=True, stable=True)
    top, idx = top[:, :k], idx[:, :k]
    if renormalise:
        top = top / top.sum(-1, keepdim=True)
    return idx, top


def sparse_moe(h, w, prefix, names, experts, k, renormalise):
    """MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock on h [..., C]: each token's k experts (route of
    its router logits h W_gate^T), their SiLU-gated MLPs on the token, summed with the routing weights."""
    import torch
    x = h.reshape(-1, h.shape[-1])
    idx, weight = route(x @ w[prefix + "gate.weight"].T, k, renormalise)
    out = torch.zeros_like(x)
    for j in range(experts):
        rows, slot = (idx == j).nonzero(as_tuple=True)
        if rows.numel():  # an expert no token chose contributes nothing
            y = gated_mlp(x[rows], w, f"{prefix}experts.{j}.", names)
            out.index_add_(0, rows, weight[rows, slot, None] * y)
    return out.reshape(h.shape)


def logits(spec, w, ids):
    """The causal LM's logits [B, T, V] of token ids [B, T] (positions 0 .. T-1)."""
    B, T = ids.shape
    nh, ng, d = spec.heads, spec.kv_heads, spec.head_dim
    cos, sin = (t.to(w["model.norm.weight"].device) for t in
                rope_cos_sin(T, rope_inv_freq(d, spec.rope_theta, spec.llama3)))
    x = w["model.embed_tokens.weight"][ids]
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        h = rms_norm(x, w[p + "input_layernorm.weight"], spec.eps)
        q = linear(h, w, a + "q_proj").reshape(B, T, nh, d).transpose(1, 2)
        k = linear(h, w, a + "k_proj").reshape(B, T, ng, d).transpose(1, 2)
        v = linear(h, w, a + "v_proj").reshape(B, T, ng, d).transpose(1, 2)
        if spec.qk_norm:  # Qwen3: RMSNorm over each head's d dimensions, before the rotation
            q = rms_norm(q, w[a + "q_norm.weight"], spec.eps)
            k = rms_norm(k, w[a + "k_norm.weight"], spec.eps)
        y = gqa_attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
        x = x + linear(y.transpose(1, 2).reshape(B, T, nh * d), w, a + "o_proj")
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], spec.eps)
        if i in spec.moe_layers:
            prefix, names = spec.moe_names(i)
            x = x + sparse_moe(h, w, prefix, names, spec.experts, spec.topk, spec.norm_topk)
        else:
            x = x + gated_mlp(h, w, p + "mlp.", ("gate_proj", "up_proj", "down_proj"))
    x = rms_norm(x, w["model.norm.weight"], spec.eps)
    return x @ w["model.embed_tokens.weight" if spec.tie else "lm_head.weight"].T


def scorer(a):
    """(logits_of(ids [B, T]) -> float64 logits on the CPU, vocabulary size) of --model."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if a.transformers:
        try:
            import transformers
        except ImportError:
            print("hf_llama.py: transformers is not installed here: skipped")
            sys.exit(77)
        m = transformers.AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32,
                                                              attn_implementation="eager")
        m = m.float().to(a.device).eval()
        return (lambda ids: m(input_ids=ids.to(a.device)).logits.double().cpu()), m.config.vocab_size
    spec, raw = load_model(a.model)
    w = {k: torch.from_numpy(v).to(a.device) for k, v in raw.items()}
    return (lambda ids: logits(spec, w, ids.to(a.device)).cpu()), spec.vocab


def cmd_eval(a):
    """hf_models.py gpt-eval's windows and scoring (shard_windows, score_windows): every target
    1 .. (N - 1) * stride + S scored once, with the longest context its window allows."""
    stride = a.stride or a.seq
    t, x, y = hf_models.shard_windows(a.shard, a.windows, a.seq, stride)
    logits_of, vocab = scorer(a)
    if t.max() >= vocab:
        raise InputError(f"{a.shard}: token {t.max()} beyond the model's vocabulary of {vocab}")
    _, count = hf_models.score_windows(lambda ids: logits_of(ids), x, y, a.batch, a.shard, stride)
    assert count == len(t) - 1, (count, len(t) - 1)
    return 0


def cmd_generate(a):
    import torch
    try:
        ids = [int(v) for v in a.prompt.split(",")]
    except ValueError:
        raise InputError(f"--prompt {a.prompt!r}: expected comma-separated token ids")
    if a.tokens < 0:
        raise InputError("--tokens must not be negative")
    logits_of, vocab = scorer(a)
    if not all(0 <= i < vocab for i in ids):
        raise InputError(f"--prompt: token ids must lie in [0, {vocab})")
    prompt = len(ids)
    with torch.no_grad():
        for _ in range(a.tokens):
            ids.append(int(logits_of(torch.tensor([ids]))[0, -1].argmax()))
    print("tokens:", " ".join(str(i) for i in ids[prompt:]))
    return 0


# ---------------------------------------------------------------- selftest

def cmd_selftest():
    import torch
    torch.manual_seed(0)
    checks = []

    def check(ok, what):
        checks.append(what)
        if not ok:
            raise AssertionError(what)

    # RoPE: pairs (i, i + d/2) as complex numbers x_i + j x_{i+d/2}, multiplied by exp(j pos inv_freq_i)
    d, T = 8, 5
    inv = rope_inv_freq(d, 10000.0)
    x = torch.randn(T, d, dtype=torch.float64)
    z = torch.complex(x[:, :d // 2], x[:, d // 2:]) * \
        torch.polar(torch.ones(T, d // 2, dtype=torch.float64), torch.arange(T, dtype=torch.float64)[:, None] * inv)
    r = apply_rope(x, *rope_cos_sin(T, inv))
    check(torch.allclose(r, torch.cat([z.real, z.imag], -1), rtol=0, atol=1e-14),
          "rotate-half RoPE equals the complex rotation of pairs (i, i + d/2)")

    # Llama 3 scaling, d = 8, theta = 10^4: inv_freq 1, 0.1, 0.01, 0.001, wavelengths 2 pi, 20 pi, 200 pi,
    # 2000 pi; L = 1000, low 1, high 4: kept below 250, divided by 8 above 1000, 200 pi in between with
    # smooth = (5 / pi - 1) / 3 = 0.197183143639651, 0.01 * ((1 - smooth) / 8 + smooth) = 0.00297535250684695
    s = rope_inv_freq(8, 10000.0, (8.0, 1.0, 4.0, 1000))
    check(abs(s[0] - 1.0) < 1e-15 and abs(s[1] - 0.1) < 1e-15, "llama3 scaling keeps high frequencies")
    check(abs(s[3] - 0.000125) < 1e-18, "llama3 scaling divides low frequencies by the factor")
    check(abs(s[2] - 0.00297535250684695) < 1e-16, "llama3 scaling interpolates the frequencies between")

    # GQA: each key/value head repeated for its nh / ng query heads, then plain multi-head attention
    B, nh, ng, T, d = 2, 6, 2, 7, 4
    q, k, v = torch.randn(B, nh, T, d), torch.randn(B, ng, T, d), torch.randn(B, ng, T, d)
    kr, vr = k.repeat_interleave(nh // ng, 1), v.repeat_interleave(nh // ng, 1)
    sc = q @ kr.transpose(-1, -2) / math.sqrt(d) + torch.full((T, T), -math.inf).triu(1)
    check(torch.allclose(gqa_attention(q, k, v), torch.softmax(sc, -1) @ vr, rtol=0, atol=1e-14),
          "GQA equals multi-head attention with repeated key/value heads")

    # bf16 rounding against torch's on the edge cases: ties to even either way, overflow, NaN, subnormals
    edge = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8 + 2 ** -20), 3.4e38, -np.inf, np.nan,
                     1e-40, 2.0 ** -130 * 3, 0.0, -0.0, 65504.0, 70000.0], dtype=np.float32)
    want = torch.from_numpy(edge).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    got = bf16_bits(edge)
    nan = np.isnan(edge)  # torch's NaN pattern differs (0xffff); any NaN will do
    check(np.array_equal(got[~nan], want[~nan]) and np.all(got[nan] & 0x7F80 == 0x7F80) and np.all(got[nan] & 0x7F),
          "bf16 rounding equals torch's on edge cases")

    with tempfile.TemporaryDirectory() as tmp:
        # writer round trip, edge values included, read back by hf_models.py's parser
        rand = random_values(7, 0.02, chunk=100)

        def values(name, shape):
            yield edge
            yield from rand(name, (math.prod(shape) - edge.size,))
        entries = [("a", (3, 50)), ("b.bias", (40,)), ("c.norm.weight", (3, 4, 5))]
        for dtype, ref in (("F32", lambda x: x.astype(np.float64)),
                           ("F16", lambda x: x.astype(np.float16).astype(np.float64)),
                           ("BF16", lambda x: torch.from_numpy(x).to(torch.bfloat16).double().numpy())):
            path = os.path.join(tmp, dtype + ".safetensors")
            write_safetensors(path, entries, dtype, values)
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            got = read_safetensors(path)
            with np.errstate(over="ignore"):
                ok = all(np.array_equal(got[e].ravel(), ref(np.concatenate(list(values(e, s)))), equal_nan=True)
                         for e, s in entries)
            check(ok and n % 8 == 0 and header["__metadata__"] == {"format": "pt"} and
                  list(header)[1:] == [e for e, _ in entries],
                  f"{dtype} safetensors round trip (header padded, metadata, order, values)")

        # a sharded model and its index against the same model in one file; the Meta row order (head_dim 8:
        # with d/2 = 2 the permutation would be its own inverse)
        base = dict(family="qwen3", layers=2, hidden=32, heads=4, kv_heads=2, head_dim=0, ffn=24, vocab=101,
                    max_pos=32, rope_theta=10000.0, rms_eps=1e-6, rope_scaling=None, tie=False,
                    attention_bias=True, mlp_bias=False, dtype="f32", init_std=0.02)
        cfg = make_config(argparse.Namespace(**base))
        spec = Spec(cfg)
        one, sharded, meta = (os.path.join(tmp, m) for m in ("one", "sharded", "meta"))
        n1, b1, f1 = write_model(one, cfg, "F32", 0, random_values(3, 0.02))
        n2, b2, f2 = write_model(sharded, cfg, "F32", 4000, random_values(3, 0.02))
        write_model(meta, cfg, "F32", 0, meta_permuted(random_values(3, 0.02), spec))
        _, w1 = load_model(one)
        _, w2 = load_model(sharded)
        with open(os.path.join(sharded, "model.safetensors.index.json")) as f:
            index = json.load(f)
        sizes, counts = {}, {}
        for name, file in index["weight_map"].items():
            sizes[file] = sizes.get(file, 0) + w2[name].size * 4
            counts[file] = counts.get(file, 0) + 1
        check(n1 == n2 == len(spec.tensors()) and b1 == b2 == index["metadata"]["total_size"] and f1 == 1 and
              f2 == len(sizes) > 1 and all(sizes[f] <= 4000 or counts[f] == 1 for f in sizes) and
              sorted(sizes) == [f"model-{i:05d}-of-{f2:05d}.safetensors" for i in range(1, f2 + 1)] and
              all(np.array_equal(w1[t], w2[t]) for t in w1),
              "sharded write: shards within the size (or of one tensor), index total and map, same tensors as one file")
        _, wm = load_model(meta)
        qk = [t for t in w1 if ".q_proj." in t or ".k_proj." in t]
        heads = {t: spec.heads if ".q_proj." in t else spec.kv_heads for t in qk}
        check(all(np.array_equal(meta_to_hf_rows(wm[t], heads[t]), w1[t]) for t in qk) and
              not any(np.array_equal(wm[t], w1[t]) for t in qk) and
              all(np.array_equal(wm[t], w1[t]) for t in w1 if t not in heads),
              "--permute-qk meta, then convert_llama_weights_to_hf's permute, gives back the HF tensors")
        hd = spec.head_dim
        w = w1["model.layers.0.self_attn.q_proj.weight"]
        check(np.array_equal(wm["model.layers.0.self_attn.q_proj.weight"][hd + 2 * 1 + 1], w[hd + hd // 2 + 1]),
              "Meta row 2j + c of a head holds HF row c*d/2 + j")

        # a Mixtral of one expert, top-1, is the Mistral whose gate_proj, up_proj, down_proj are w1, w3, w2
        moe = dict(base, family="mixtral", vocab=97, experts=1, topk=1, expert_ffn=24, attention_bias=False)
        cfg = make_config(argparse.Namespace(**moe))
        write_model(os.path.join(tmp, "mixtral1"), cfg, "F32", 0, random_values(5, 0.2))
        spec_m, wmix = load_model(os.path.join(tmp, "mixtral1"))
        spec_d = Spec(dict(cfg, model_type="mistral"))
        rename = {"block_sparse_moe.experts.0.w1.": "mlp.gate_proj.", "block_sparse_moe.experts.0.w3.": "mlp.up_proj.",
                  "block_sparse_moe.experts.0.w2.": "mlp.down_proj."}
        wd = {}
        for name, v in wmix.items():
            for old, new in rename.items():
                name = name.replace(old, new)
            if not name.endswith("block_sparse_moe.gate.weight"):
                wd[name] = torch.from_numpy(v)
        ids = torch.randint(0, 97, (2, 9))
        check(sorted(wd) == sorted(n for n, _ in spec_d.tensors()) and spec_m.moe_layers == (0, 1) and
              torch.allclose(logits(spec_m, {k: torch.from_numpy(v) for k, v in wmix.items()}, ids),
                             logits(spec_d, wd, ids), rtol=0, atol=1e-12),
              "a written Mixtral of one expert (top-1) scores as the Mistral of its w1, w3, w2")

    # the MoE block on random experts: top-k = E (renormalised or not) is the dense mixture
    # sum_j softmax(x W_gate^T)_j expert_j(x)
    E, C, F, N = 4, 8, 6, 40
    names = ("gate_proj", "up_proj", "down_proj")
    wm = {"m.gate.weight": torch.randn(E, C)}
    for j in range(E):
        for n, shape in zip(names, ((F, C), (F, C), (C, F))):
            wm[f"m.experts.{j}.{n}.weight"] = torch.randn(*shape) * 0.5
    x = torch.randn(N, C)
    probs = torch.softmax(x @ wm["m.gate.weight"].T, -1)
    ys = [gated_mlp(x, wm, f"m.experts.{j}.", names) for j in range(E)]
    mixture = sum(probs[:, j, None] * ys[j] for j in range(E))
    check(all(torch.allclose(sparse_moe(x, wm, "m.", names, E, E, r), mixture, rtol=0, atol=1e-13)
              for r in (True, False)), "top-k = E is the dense mixture of all experts (renormalised or not)")
    # top-2: each token's two most probable experts, by an explicit loop over the tokens
    top = probs.argsort(-1, descending=True)[:, :2]
    explicit = torch.stack([sum(probs[t, e] * ys[e][t] for e in top[t].tolist()) for t in range(N)])
    s = probs.gather(1, top).sum(-1, keepdim=True)
    plain, renormalised = (sparse_moe(x, wm, "m.", names, E, 2, r) for r in (False, True))
    check(torch.allclose(plain, explicit, rtol=0, atol=1e-13) and
          torch.allclose(renormalised, explicit / s, rtol=0, atol=1e-13),
          "top-2: the two most probable experts weighted by their probabilities (renormalised: divided by their sum)")
    idx, wt = route(x @ wm["m.gate.weight"].T, 2, True)
    check(torch.allclose(wt, torch.softmax((x @ wm["m.gate.weight"].T).gather(1, idx), -1), rtol=0, atol=1e-15),
          "renormalised top-k probabilities = the softmax over the k largest logits (Megatron's top-k then softmax)")
    check(len(set(idx[:, 0].tolist())) > 1 and not torch.equal(plain, renormalised),
          "the random routing uses several experts and renormalisation changes the output")
    # equal probabilities: the lower expert index first
    tie = torch.tensor([[0.5, 2.0, -1.0, 2.0], [3.0, 3.0, 3.0, 3.0], [-1.0, 0.0, 0.0, 0.0]])
    check(route(tie, 1, True)[0].tolist() == [[1], [0], [1]] and
          route(tie, 3, False)[0].tolist() == [[1, 3, 0], [0, 1, 2], [1, 2, 3]],
          "routing ties go to the lower expert index")
    # Qwen3-MoE's dense layers: mlp_only_layers and (i + 1) % decoder_sparse_step
    q = dict(base, family="qwen3_moe", layers=6, experts=4, topk=2, expert_ffn=16, norm_topk_prob=False,
             decoder_sparse_step=2, mlp_only_layers=[3], attention_bias=False)
    spec_q = Spec(make_config(argparse.Namespace(**q)))
    shapes = dict(spec_q.tensors())
    check(spec_q.moe_layers == (1, 5) and not spec_q.norm_topk and
          shapes["model.layers.0.mlp.gate_proj.weight"] == (24, 32) and
          "model.layers.3.mlp.up_proj.weight" in shapes and
          shapes["model.layers.1.mlp.gate.weight"] == (4, 32) and
          shapes["model.layers.5.mlp.experts.3.down_proj.weight"] == (32, 16) and
          "model.layers.1.mlp.gate_proj.weight" not in shapes and "model.layers.3.mlp.gate.weight" not in shapes,
          "Qwen3-MoE: layers in mlp_only_layers or off the decoder_sparse_step are dense (intermediate_size)")
    print(f"selftest: {len(checks)} checks passed")
    return 0


# ---------------------------------------------------------------- command line

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--family", required=True, choices=sorted(FAMILIES))
    w.add_argument("--out", required=True)
    w.add_argument("--seed", type=int, required=True)
    for name, default in (("layers", 2), ("hidden", 64), ("heads", 4), ("kv-heads", 2), ("head-dim", 0),
                          ("ffn", 96), ("vocab", 50257), ("max-pos", 64), ("shard-size", 0)):
        w.add_argument("--" + name, type=int, default=default)
    for name, default in (("rope-theta", None), ("rms-eps", 1e-5), ("init-std", 0.02)):
        w.add_argument("--" + name, type=float, default=default)
    for name in ("experts", "topk", "decoder-sparse-step"):  # None: the family's default (MoE only)
        w.add_argument("--" + name, type=int, default=None)
    w.add_argument("--expert-ffn", type=int, default=0, help="each expert's width (0: --ffn)")
    w.add_argument("--norm-topk-prob", action=argparse.BooleanOptionalAction, default=True)
    w.add_argument("--mlp-only-layers", default="", help="qwen3_moe: comma-separated dense layers")
    w.add_argument("--rope-scaling", default="none", help="none or llama3:FACTOR,LOW,HIGH,ORIGMAX")
    w.add_argument("--tie", action=argparse.BooleanOptionalAction, default=False)
    w.add_argument("--attention-bias", action="store_true")
    w.add_argument("--mlp-bias", action="store_true")
    w.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    w.add_argument("--permute-qk", choices=["none", "meta"], default="none")
    e = sub.add_parser("eval")
    e.add_argument("--shard", required=True)
    e.add_argument("--windows", type=int, required=True)
    e.add_argument("--seq", type=int, required=True)
    e.add_argument("--stride", type=int, default=0, help="tokens between window starts (0: --seq, disjoint)")
    e.add_argument("--batch", type=int, default=8)
    g = sub.add_parser("generate")
    g.add_argument("--prompt", required=True, help="comma-separated token ids")
    g.add_argument("--tokens", type=int, required=True)
    for s in (e, g):
        s.add_argument("--model", required=True)
        s.add_argument("--transformers", action="store_true")
        s.add_argument("--device", default="cpu")
    sub.add_parser("selftest")
    a = p.parse_args(argv)
    if a.cmd != "write":
        import torch
        torch.set_default_dtype(torch.float64)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    try:
        if a.cmd == "selftest":
            try:
                return cmd_selftest()
            except AssertionError as err:
                print("selftest failed:", err)
                return 1
        return {"write": cmd_write, "eval": cmd_eval, "generate": cmd_generate}[a.cmd](a)
    except (InputError, OSError, KeyError, ValueError) as err:
        print("bad input:", err)
        return 2


if __name__ == "__main__":
    sys.exit(main())
