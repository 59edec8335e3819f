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
    with fc1's rows gate then up;
  * mixture of experts in the MLP slot (Shazeer et al. 2017; Switch Transformer, Fedus et al. 2021;
    ST-MoE, Zoph et al. 2022; Megatron-core's MoE router and its flag names): a linear router
    without bias, top-k routing (softmax after or before the top-k, or sigmoid scores with the
    aux-loss-free expert bias of DeepSeek-V3), optional expert capacity with token dropping,
    experts that are dense MLPs, an optional shared expert; the load-balancing (Switch) and z
    (ST-MoE) losses. See `moe_route` .. `Transformer.moe`.

Layer (the pre-LN layer of GPT-2, BERT's Megatron form, T5 and the Llama family):
    x = x + drop(proj(attention(norm1(x))));  [T5 decoder: x = x + drop(cproj(cross(normx(x), e)))]
    x = x + drop(fc2(act(fc1(norm2(x)))))     [an MoE layer: x = x + drop(moe(norm2(x)))]

`Transformer` holds the parameters (name -> tensor, Trident's checkpoint names under a layer's
prefix) and a `LayerSpec`. Its hooks are identities here: `drop` (a dropout mask, applied by the
references that replay Trident's recorded masks), and the points where Trident's mixed precision
stores a value or a gradient in 16 bits (`store`, `grad_store`, `store_both`, `softmax_probs`,
`linear`, `rotary_tables`), which gpt_reference.GPTReference16 overrides; `moe_record` receives
each MoE layer's router statistics of each micro-batch (its auxiliary losses, which the training
objective adds, and its expert loads). Nothing here imports Trident.
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
# Mixture of experts: routing, capacity, auxiliary losses (written from Megatron-core's MoE
# router, the Switch Transformer and ST-MoE papers; nothing from Trident)
# --------------------------------------------------------------------------------------

MOE_SCORE_FUNCTIONS = ("softmax", "sigmoid")
MOE_DROP_POLICIES = ("probs", "position")


def stable_topk(scores, k):
    """The k largest entries of each row of scores (N, E), largest first; equal scores: the lower
    column index first (so a tie at the k-th place selects the lower index). Returns (values,
    indices), both (N, k); the values carry the gradient of the selected entries."""
    _, order = torch.sort(scores.detach(), dim=-1, descending=True, stable=True)
    idx = order[:, :k]
    return scores.gather(-1, idx), idx


def moe_route(logits, topk, score_function="softmax", pre_softmax=False, expert_bias=None):
    """Top-k routing of router logits (N, E) (Megatron's topk_softmax_with_capacity without the
    capacity). Returns (probs (N, k), indices (N, k) int64), slot s of token t the expert
    indices[t, s] with weight probs[t, s], slots in the order of the scores (largest first):
      softmax, pre_softmax false: the top-k of the logits, probs = softmax over those k logits
        (Mixtral's softmax, top-k, renormalise);
      softmax, pre_softmax true: s = softmax(logits) over all E, probs = the k largest s (not
        renormalised);
      sigmoid: s = sigmoid(logits); the top-k of s + expert_bias (the bias only selects), probs =
        the selected s / (their sum + 1e-20) for k > 1, the s itself for k = 1.
    Ties in any top-k: the lower expert index wins (stable_topk). expert_bias (E,) or None."""
    if score_function == "softmax":
        if pre_softmax:
            return stable_topk(torch.softmax(logits, dim=-1), topk)
        top, idx = stable_topk(logits, topk)
        return torch.softmax(top, dim=-1), idx
    if score_function == "sigmoid":
        s = torch.sigmoid(logits)
        if expert_bias is not None:
            _, idx = stable_topk(s.detach() + expert_bias.detach().to(s.dtype), topk)
            sel = s.gather(-1, idx)
        else:
            sel, idx = stable_topk(s, topk)
        return (sel / (sel.sum(dim=-1, keepdim=True) + 1e-20) if topk > 1 else sel), idx
    raise ValueError("unknown router score function %r" % score_function)


def moe_aux_scores(logits, score_function="softmax"):
    """The per-token expert distribution p (N, E) of the load-balancing loss: softmax(logits), or
    sigmoid(logits) / (sum_e sigmoid(logits) + 1e-20) (Megatron's scores for the aux loss)."""
    if score_function == "softmax":
        return torch.softmax(logits, dim=-1)
    if score_function == "sigmoid":
        s = torch.sigmoid(logits)
        return s / (s.sum(dim=-1, keepdim=True) + 1e-20)
    raise ValueError("unknown router score function %r" % score_function)


def expert_counts(indices, num_experts, keep=None):
    """(E,) int64: how many (token, slot) selections of indices (N, k) go to each expert (only
    the kept ones when keep (N, k) bool is given)."""
    flat = indices.reshape(-1) if keep is None else indices[keep]
    return torch.bincount(flat, minlength=num_experts)


def moe_aux_loss(p, counts, topk):
    """Switch load-balancing loss (Megatron's switch_load_balancing_loss_func, unscaled):
    E / (k N^2) * sum_e (sum_t p_te) counts_e, p (N, E) the moe_aux_scores, counts (E,) the tokens
    whose top-k of p includes e (a constant: no gradient). Equals E * sum_e f_e P_e with f_e =
    counts_e / (k N), P_e = mean_t p_te."""
    N, E = p.shape
    return (p.sum(dim=0) * counts.to(p.dtype)).sum() * (E / (topk * N * N))


def moe_z_loss(logits):
    """ST-MoE router z-loss (unscaled): mean over tokens of logsumexp_e(logits)^2."""
    return torch.logsumexp(logits, dim=-1).square().mean()


def moe_capacity(num_tokens, topk, num_experts, factor):
    """Tokens an expert keeps: ceil(N k / E * factor) (Megatron's get_capacity of N k selections)."""
    return int(math.ceil(num_tokens * topk / num_experts * factor))


def moe_capacity_keep(probs, indices, num_experts, capacity, policy="probs"):
    """(N, k) bool: the (token, slot) selections each expert keeps when it takes at most `capacity`
    tokens. policy "probs": the `capacity` tokens routed to it with the largest probs (equal probs:
    the lower token index kept); "position": the first `capacity` tokens routed to it in token
    order."""
    if policy not in MOE_DROP_POLICIES:
        raise ValueError("unknown token drop policy %r" % policy)
    keep = torch.zeros(indices.shape, dtype=torch.bool)
    pd = probs.detach()
    for e in range(num_experts):
        tok, slot = (indices == e).nonzero(as_tuple=True)  # token order (row-major nonzero)
        if policy == "probs":
            _, order = torch.sort(pd[tok, slot], descending=True, stable=True)
            tok, slot = tok[order], slot[order]
        keep[tok[:capacity], slot[:capacity]] = True
    return keep


def expert_bias_update(bias, counts, rate):
    """Aux-loss-free balancing (DeepSeek-V3; Megatron's get_updated_expert_bias), in place:
    bias_e += rate * sign(mean(c) - c_e), c (E,) the iteration's selections of each expert."""
    with torch.no_grad():
        c = counts.to(bias.dtype)
        bias.add_(torch.sign(c.sum() / c.numel() - c) * rate)
    return bias


class MoESpec:
    """An MoE layer's routing: num_experts E, topk k, score_function ("softmax" / "sigmoid"),
    pre_softmax (softmax before the top-k), capacity_factor (0: dropless), drop_policy ("probs" /
    "position"), expert_bias (the router has an expert_bias buffer: sigmoid routing only), and
    group_rows: the rows (sequences) of one micro-batch (None: all rows of a call), the unit whose
    tokens are routed together (capacity, auxiliary losses, loads). Which layers are MoE layers is
    given by the parameters: a layer's mlp/ with a router/weight."""

    def __init__(self, num_experts, topk=2, score_function="softmax", pre_softmax=False, capacity_factor=0.0,
                 drop_policy="probs", expert_bias=False, group_rows=None):
        if num_experts < 1 or not 1 <= topk <= num_experts:
            raise ValueError("MoE with %d experts and top-%d routing" % (num_experts, topk))
        if score_function not in MOE_SCORE_FUNCTIONS:
            raise ValueError("unknown router score function %r" % score_function)
        if drop_policy not in MOE_DROP_POLICIES:
            raise ValueError("unknown token drop policy %r" % drop_policy)
        if expert_bias and score_function != "sigmoid":
            raise ValueError("the expert bias is defined for sigmoid routing only")
        self.num_experts, self.topk, self.score_function, self.pre_softmax = num_experts, topk, score_function, pre_softmax
        self.capacity_factor, self.drop_policy, self.expert_bias = capacity_factor, drop_policy, expert_bias
        self.group_rows = group_rows


# --------------------------------------------------------------------------------------
# The layer
# --------------------------------------------------------------------------------------

class LayerSpec:
    """What the layer's math needs of the architecture: num_heads query heads of head_dim
    channels, num_query_groups key/value groups (None: num_heads, multi-head), the norm
    ("LayerNorm" / "RMSNorm") and its eps, rotary (a Rotary, or None: positions elsewhere or
    none), swiglu (else GELU), qk_layernorm (per-head norms of q and k), moe (a MoESpec: the
    layers whose parameters have mlp/router/weight are MoE layers; None: all dense). The defaults
    are GPT-2's layer."""

    def __init__(self, num_heads, head_dim, num_query_groups=None, normalization="LayerNorm", eps=1e-5,
                 rotary=None, swiglu=False, qk_layernorm=False, moe=None):
        self.num_heads, self.head_dim = num_heads, head_dim
        self.num_query_groups = num_query_groups or num_heads
        if num_heads % self.num_query_groups:
            raise ValueError("num_heads %d is not a multiple of num_query_groups %d" % (num_heads, self.num_query_groups))
        if normalization not in ("LayerNorm", "RMSNorm"):
            raise ValueError("unknown normalization %r" % normalization)
        self.normalization, self.eps = normalization, eps
        self.rotary, self.swiglu, self.qk_layernorm = rotary, swiglu, qk_layernorm
        self.moe = moe


class Transformer:
    """The layer's math over named parameters (`params`: name -> tensor) with a LayerSpec.
    Sub-module names under a layer's prefix are Trident's: input_layernorm, self_attention/{qkv,
    q_layernorm, k_layernorm, proj}, cross_attention_layernorm, cross_attention/{q, kv, proj},
    post_attention_layernorm, mlp/{fc1, fc2}; a linear's bias is used when params has one. An MoE
    layer's mlp/ holds router/weight, experts/<j>/{fc1, fc2} and shared_experts/{fc1, fc2}; its
    router/expert_bias (not trained) is looked up in `buffers` (name -> tensor), then in params.

    Hooks (identities here): drop(x, site, layer, which, shape) applies a dropout mask (`which`
    names the config's probability, hidden_dropout or attention_dropout; `shape` the mask's
    layout); store(x) marks an activation Trident keeps in 16 bits, grad_store(x) a GEMM output
    whose gradient Trident packs into 16 bits, store_both(x) both; softmax_probs(s, site, layer)
    the attention probabilities (with their dropout); rotary_tables(T, dtype) the cos / sin table;
    moe_record(prefix, record) receives the router statistics of each MoE layer and micro-batch
    (see `moe`).
    """

    def __init__(self, params=None, spec=None, buffers=None):
        self.params = {} if params is None else params
        self.spec = spec
        self.buffers = {} if buffers is None else buffers

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

    def moe_record(self, prefix, record):
        pass

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
        """fc2(act(fc1(a))) with the parameters under `prefix` (".../mlp/"); an MoE layer's
        mixture of experts (`moe`) when the spec has one and prefix holds a router."""
        if self.is_moe(prefix):
            return self.moe(a, prefix)
        h = self.store(self.linear(a, prefix + "fc1"))
        return self.linear(self.store(self.activation(h)), prefix + "fc2")

    def is_moe(self, prefix):
        return getattr(self.spec, "moe", None) is not None and prefix + "router/weight" in self.params

    def moe(self, a, prefix):
        """The MoE layer under `prefix` (".../mlp/") on a (..., T, C), its rows (sequences) routed
        in groups of spec.moe.group_rows rows (one micro-batch each; the last group may be
        smaller), the tokens of a group in row-major order (row b, position t: token b T + t).
        Per group (N tokens x (N, C)), with E experts and top-k routing:
          logits = x W_r^T (N, E); probs, indices = moe_route(logits, ...) (with the expert bias);
          with capacity_factor > 0 each expert keeps moe_capacity(N, k, E, factor) of its tokens
          (moe_capacity_keep), the kept probs not renormalised;
          y_t = sum over t's kept selections (expert j, prob p) of p * expert_j(x_t)  [+ shared(x_t)],
          expert_j the dense MLP under experts/<j>/ (the model's activation and biases), summed in
          expert order, shared the dense MLP under shared_experts/ when the parameters have one.
        moe_record(prefix, record) gets, per group: aux = moe_aux_loss(p, counts of the top-k of p,
        k) and z = moe_z_loss(logits) (tensors with their gradients, unscaled), counts (E,) int64
        (the selections of the actual routing, kept or dropped), dropped (selections dropped by
        capacity), selections (N k), tokens N."""
        sp = self.spec.moe
        shape = a.shape
        C = shape[-1]
        rows = a.reshape(-1, shape[-2], C)
        per = sp.group_rows or rows.shape[0]
        outs = [self.moe_tokens(rows[s:s + per].reshape(-1, C), prefix) for s in range(0, rows.shape[0], per)]
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
        return y.reshape(shape)

    def moe_tokens(self, x, prefix):
        """One group's MoE output (N, C) of its tokens x (N, C) (see `moe`)."""
        sp = self.spec.moe
        E, k = sp.num_experts, sp.topk
        N = x.shape[0]
        logits = F.linear(x, self.params[prefix + "router/weight"])
        bias = None
        if sp.expert_bias:
            bias = self.buffers.get(prefix + "router/expert_bias", self.params.get(prefix + "router/expert_bias"))
        probs, idx = moe_route(logits, k, sp.score_function, sp.pre_softmax, bias)
        p = moe_aux_scores(logits, sp.score_function)
        with torch.no_grad():
            aux_counts = expert_counts(stable_topk(p, k)[1], E)
        record = {"aux": moe_aux_loss(p, aux_counts, k), "z": moe_z_loss(logits),
                  "counts": expert_counts(idx, E), "selections": N * k, "tokens": N}
        if sp.capacity_factor > 0:
            keep = moe_capacity_keep(probs, idx, E, moe_capacity(N, k, E, sp.capacity_factor), sp.drop_policy)
        else:
            keep = torch.ones(idx.shape, dtype=torch.bool)
        record["dropped"] = int((~keep).sum())
        y = torch.zeros(N, x.shape[1], dtype=x.dtype)
        for j in range(E):
            tok, slot = ((idx == j) & keep).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            h = self.mlp(x[tok], prefix + "experts/%d/" % j)
            y = y.index_add(0, tok, probs[tok, slot].unsqueeze(1) * h)
        if prefix + "shared_experts/fc1/weight" in self.params:
            y = y + self.mlp(x, prefix + "shared_experts/")
        self.moe_record(prefix, record)
        return y

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
