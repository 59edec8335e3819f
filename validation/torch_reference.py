"""The transformer layer's math, written once for the float64 PyTorch references (gpt_reference.py,
bert_reference.py, t5_reference.py; hf_models.py uses its functions under its own Hugging Face
names). Run with Debian's /usr/bin/python3. Written from the published definitions:

  * LayerNorm (Ba et al. 2016) with weight and bias; RMSNorm (Zhang & Sennrich 2019)
    x / sqrt(mean(x^2) + eps) * w, over the last dimension;
  * linear layers y = x W^T (+ b), W (out, in) as Trident and torch.nn.Linear store it;
  * scaled dot-product attention (Vaswani et al. 2017), softmax(q k^T / sqrt(d)) v per head,
    under a causal mask (key j > query t masked) and / or a key-padding mask; multi-head, or
    grouped-query (Ainslie et al. 2023): ng key/value groups, query head h reads group
    h // (nh / ng), as Hugging Face's repeat_kv expands them; cross-attention (T5's decoder):
    queries from the layer, keys and values from the encoder's output;
  * rotary positions (Su et al. 2021) in Hugging Face Llama's rotate-half form, with Llama 3.1's
    "llama3" frequency scaling;
  * per-head q / k norms (Qwen 3): a norm over each head's d channels of the queries and of the
    keys, one weight (and bias, LayerNorm) of d shared by all heads, before the rotary positions;
  * MLP: GELU in its tanh form (Hendrycks & Gimpel), or SwiGLU (Shazeer 2020) silu(gate) * up
    with fc1's rows gate then up.

Layer (the pre-LN layer of GPT-2, BERT's Megatron form, T5 and the Llama family):
    x = x + drop(proj(attention(norm1(x))));  [T5 decoder: x = x + drop(cproj(cross(normx(x), e)))]
    x = x + drop(fc2(act(fc1(norm2(x)))))

`Transformer` holds the parameters (name -> tensor, Trident's checkpoint names under a layer's
prefix) and a `LayerSpec`. Its hooks are identities here: `drop` (a dropout mask, applied by the
references that replay Trident's recorded masks), and the points where Trident's mixed precision
stores a value or a gradient in 16 bits (`store`, `grad_store`, `store_both`, `softmax_probs`,
`linear`, `rotary_tables`), which gpt_reference.GPTReference16 overrides. Nothing here imports
Trident.
"""
import math

import torch
import torch.nn.functional as F


# --------------------------------------------------------------------------------------
# Functions
# --------------------------------------------------------------------------------------

def layer_norm(x, weight, bias, eps):
    """LayerNorm over the last dimension: (x - mean) / sqrt(var + eps) * weight + bias."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def rms_norm(x, weight, eps):
    """RMSNorm over the last dimension: x / sqrt(mean(x^2) + eps) * weight (no bias)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def norm(x, kind, weight, bias, eps):
    """The norm `kind` ("LayerNorm" or "RMSNorm") of x over its last dimension."""
    if kind == "RMSNorm":
        return rms_norm(x, weight, eps)
    if kind == "LayerNorm":
        return layer_norm(x, weight, bias, eps)
    raise ValueError("unknown normalization %r" % kind)


def linear(x, weight, bias=None):
    """x W^T (+ b), W of shape (out, in)."""
    return F.linear(x, weight, bias)


def gelu_tanh(x):
    """GELU in its tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return F.gelu(x, approximate="tanh")


def swiglu(h):
    """SwiGLU of fc1's output, its halves gate then up: silu(gate) * up."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def split_heads(t, heads, d):
    """(B, T, heads * d), head-major channels -> (B, heads, T, d)."""
    B, T = t.shape[0], t.shape[1]
    return t.reshape(B, T, heads, d).transpose(1, 2)


def merge_heads(y):
    """(B, heads, T, d) -> (B, T, heads * d)."""
    B, H, T, D = y.shape
    return y.transpose(1, 2).reshape(B, T, H * D)


def repeat_kv(t, rep):
    """(B, ng, T, d) -> (B, ng * rep, T, d): key/value group g serves the query heads
    g * rep .. g * rep + rep - 1 (Hugging Face's repeat_kv)."""
    return t if rep == 1 else torch.repeat_interleave(t, rep, dim=1)


def mask_scores(s, causal=False, key_valid=None, allowed=None):
    """Scores (B, H, Tq, Tk) with the masked entries -inf: keys j > t under `causal`, keys whose
    key_valid (B, Tk) is false, and entries whose allowed (B, Tq, Tk) is false."""
    if allowed is not None:
        s = s.masked_fill(~allowed[:, None, :, :], float("-inf"))
    if key_valid is not None:
        s = s.masked_fill(~key_valid[:, None, None, :], float("-inf"))
    if causal:
        Tq, Tk = s.shape[-2], s.shape[-1]
        s = s.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool).triu(1), float("-inf"))
    return s


class Rotary:
    """Rotary positions in Hugging Face Llama's form: the first `dim` channels of each head turned,
    inv_freq_j = base^(-2j/dim), angle(t, j) = t inv_freq_j, both halves of the channels sharing the
    angles (emb = cat(freqs, freqs)). scaling: None, or Llama 3.1's (factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings): wavelengths above original / low divided by
    factor, below original / high kept, the ones between blended smoothly."""

    def __init__(self, dim, base, scaling=None):
        self.dim, self.base, self.scaling = dim, base, scaling

    def inv_freq(self):
        rot = self.dim
        inv = 1.0 / (self.base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
        if self.scaling is not None:
            fac, lo, hi, old = self.scaling
            wavelen = 2 * math.pi / inv
            scaled = torch.where(wavelen > old / lo, inv / fac, inv)
            smooth = (old / wavelen - lo) / (hi - lo)
            blended = (1 - smooth) * scaled / fac + smooth * scaled
            medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
            inv = torch.where(medium, blended, scaled)
        return inv

    def tables(self, T):
        """cos, sin (T, dim) in float64 of the positions 0 .. T-1."""
        freqs = torch.outer(torch.arange(T, dtype=torch.float64), self.inv_freq())
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def rope(x, cos, sin):
    """x (..., T, d): its first rot = cos.shape[-1] channels turned, x cos + rotate_half(x) sin with
    rotate_half(x) = cat(-x2, x1) of the halves; the other channels passed through."""
    rot = cos.shape[-1]
    xr, xp = x[..., :rot], x[..., rot:]
    x1, x2 = xr[..., :rot // 2], xr[..., rot // 2:]
    return torch.cat((xr * cos + torch.cat((-x2, x1), dim=-1) * sin, xp), dim=-1)


# --------------------------------------------------------------------------------------
# The layer
# --------------------------------------------------------------------------------------

class LayerSpec:
    """What the layer's math needs of the architecture: num_heads query heads of head_dim
    channels, num_query_groups key/value groups (None: num_heads, multi-head), the norm
    ("LayerNorm" / "RMSNorm") and its eps, rotary (a Rotary, or None: positions elsewhere or
    none), swiglu (else GELU), qk_layernorm (per-head norms of q and k). The defaults are
    GPT-2's layer."""

    def __init__(self, num_heads, head_dim, num_query_groups=None, normalization="LayerNorm", eps=1e-5,
                 rotary=None, swiglu=False, qk_layernorm=False):
        self.num_heads, self.head_dim = num_heads, head_dim
        self.num_query_groups = num_query_groups or num_heads
        if num_heads % self.num_query_groups:
            raise ValueError("num_heads %d is not a multiple of num_query_groups %d" % (num_heads, self.num_query_groups))
        if normalization not in ("LayerNorm", "RMSNorm"):
            raise ValueError("unknown normalization %r" % normalization)
        self.normalization, self.eps = normalization, eps
        self.rotary, self.swiglu, self.qk_layernorm = rotary, swiglu, qk_layernorm


class Transformer:
    """The layer's math over named parameters (`params`: name -> tensor) with a LayerSpec.
    Sub-module names under a layer's prefix are Trident's: input_layernorm, self_attention/{qkv,
    q_layernorm, k_layernorm, proj}, cross_attention_layernorm, cross_attention/{q, kv, proj},
    post_attention_layernorm, mlp/{fc1, fc2}; a linear's bias is used when params has one.

    Hooks (identities here): drop(x, site, layer, which, shape) applies a dropout mask (`which`
    names the config's probability, hidden_dropout or attention_dropout; `shape` the mask's
    layout); store(x) marks an activation Trident keeps in 16 bits, grad_store(x) a GEMM output
    whose gradient Trident packs into 16 bits, store_both(x) both; softmax_probs(s, site, layer)
    the attention probabilities (with their dropout); rotary_tables(T, dtype) the cos / sin table.
    """

    def __init__(self, params=None, spec=None):
        self.params = {} if params is None else params
        self.spec = spec

    # hooks ---------------------------------------------------------------------------
    def drop(self, x, site, layer, which, shape):
        return x

    def store(self, x):
        return x

    def grad_store(self, x):
        return x

    def store_both(self, x):
        return x

    def softmax_probs(self, s, site, layer):
        return self.drop(torch.softmax(s, dim=-1), site, layer, "attention_dropout", tuple(s.shape))

    def rotary_tables(self, T, dtype):
        cos, sin = self.spec.rotary.tables(T)
        return cos.to(dtype), sin.to(dtype)

    def linear(self, x, name):
        """The linear layer `name`, with its bias when params has one."""
        return F.linear(x, self.params[name + "/weight"], self.params.get(name + "/bias"))

    # math ----------------------------------------------------------------------------
    def norm(self, x, name):
        """The spec's norm with the parameters `name`/weight (and `name`/bias, LayerNorm) over the
        last dimension of x."""
        p, sp = self.params, self.spec
        if sp.normalization == "RMSNorm":
            return rms_norm(x, p[name + "/weight"], sp.eps)
        return layer_norm(x, p[name + "/weight"], p[name + "/bias"], sp.eps)

    def rope(self, x, cos, sin):
        return rope(x, cos, sin)

    def activation(self, h):
        return swiglu(h) if self.spec.swiglu else gelu_tanh(h)

    def attention(self, q, k, v, causal=False, key_valid=None, site="attention_probs", layer=-1, allowed=None):
        """q (B, nh, Tq, d), k and v (B, ng, Tk, d) -> (B, nh, Tq, d): query head h attends with
        key/value group h // (nh / ng); scale 1/sqrt(d); allowed (B, Tq, Tk): an extra mask."""
        rep = q.shape[1] // k.shape[1]
        k, v = repeat_kv(k, rep), repeat_kv(v, rep)
        s = self.grad_store(torch.matmul(q, k.transpose(-1, -2))) * (1.0 / math.sqrt(q.shape[-1]))
        att = self.softmax_probs(mask_scores(s, causal, key_valid, allowed), site, layer)
        return self.store_both(torch.matmul(att, v))

    def self_attention(self, a, prefix, layer, causal=True, key_valid=None, allowed=None, positions=None):
        """Self-attention of the normed input a (B, T, C) with the parameters under `prefix`
        (".../self_attention/"): qkv rows q heads (nh d) | k groups (ng d) | v groups (ng d), each
        head a block of d rows; the per-head q / k norms, then the rotary positions (of the tokens'
        positions (B, T) when given, else 0 .. T-1); proj. allowed (B, T, T): an extra mask."""
        sp = self.spec
        H, G, D = sp.num_heads, sp.num_query_groups, sp.head_dim
        qkv = self.store(self.linear(a, prefix + "qkv"))
        q, k, v = qkv.split((H * D, G * D, G * D), dim=-1)
        q, k, v = split_heads(q, H, D), split_heads(k, G, D), split_heads(v, G, D)
        if sp.qk_layernorm:
            q = self.store(self.norm(q, prefix + "q_layernorm"))
            k = self.store(self.norm(k, prefix + "k_layernorm"))
        if sp.rotary is not None:
            cos, sin = self.rotary_tables(a.shape[1], q.dtype)
            if positions is not None:  # (B, 1, T, rot): each token's own angle, shared by the heads
                cos, sin = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
            q, k = self.store(self.rope(q, cos, sin)), self.store(self.rope(k, cos, sin))
        y = self.attention(q, k, v, causal, key_valid, "attention_probs", layer, allowed)
        return self.linear(merge_heads(y), prefix + "proj")

    def cross_attention(self, a, enc, prefix, layer, key_valid=None):
        """Cross-attention (T5's decoder): queries from a (B, T, C) with `prefix`q, keys and values
        from the encoder output enc (B, Te, C) with `prefix`kv (rows k | v), the encoder's padded
        keys masked; `prefix`proj."""
        sp = self.spec
        H, G, D = sp.num_heads, sp.num_query_groups, sp.head_dim
        q = split_heads(self.store(self.linear(a, prefix + "q")), H, D)
        k, v = self.store(self.linear(enc, prefix + "kv")).split((G * D, G * D), dim=-1)
        y = self.attention(q, split_heads(k, G, D), split_heads(v, G, D), False, key_valid, "cross_probs", layer)
        return self.linear(merge_heads(y), prefix + "proj")

    def mlp(self, a, prefix):
        """fc2(act(fc1(a))) with the parameters under `prefix` (".../mlp/")."""
        h = self.store(self.linear(a, prefix + "fc1"))
        return self.linear(self.store(self.activation(h)), prefix + "fc2")

    def layer(self, x, prefix, index, causal=True, key_valid=None, enc=None, enc_valid=None, allowed=None,
              positions=None):
        """One pre-LN layer on the residual stream x (B, T, C); `index` is the layer's number in
        Trident's dropout records. enc (the encoder's output) adds the cross-attention sub-layer.
        allowed (B, T, T) and positions (B, T): packed documents' attention mask and positions."""
        B, T, C = x.shape

        def hidden(y, site):
            return self.drop(y, site, index, "hidden_dropout", (B * T, C))

        a = self.store(self.norm(x, prefix + "input_layernorm"))
        x = x + hidden(self.self_attention(a, prefix + "self_attention/", index, causal, key_valid, allowed, positions),
                       "after_proj")
        if enc is not None:
            a = self.store(self.norm(x, prefix + "cross_attention_layernorm"))
            x = x + hidden(self.cross_attention(a, enc, prefix + "cross_attention/", index, enc_valid),
                           "after_cross_proj")
        a = self.store(self.norm(x, prefix + "post_attention_layernorm"))
        return x + hidden(self.mlp(a, prefix + "mlp/"), "after_fc2")


_PLAIN = Transformer()


def attention(q, k, v, causal=False, key_valid=None):
    """Plain scaled dot-product attention: q (B, nh, Tq, d), k and v (B, ng, Tk, d)."""
    return _PLAIN.attention(q, k, v, causal, key_valid)


def apply_mask(x, keep, scale, shape):
    """x with a dropout mask applied: x viewed as `shape` (the mask's layout) times keep (0 / 1)
    times scale (1 / (1 - p), inverted dropout)."""
    return (x.reshape(shape) * torch.as_tensor(keep, dtype=x.dtype) * scale).reshape(x.shape)
