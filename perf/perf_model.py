#!/usr/bin/python3
"""Analytic model of a Trident / Megatron-style GPT training step: time and memory per GPU for any
model (dense or a mixture of experts), tensor (tp), pipeline (pp, vp), context (cp), data (dp) and expert
(ep) parallel layout, micro-batch, recomputation and precision on a named GPU and network; an advisor that ranks the
layouts that fit by predicted throughput; and checks of the model against measured runs (published
Megatron-LM throughputs, and Trident runs on this machine).

One file of about 1600 lines: the formulas, the device and network tables and the commands share
one set of definitions, read next to the papers they come from; it imports nothing
from the project, so a user can copy it to a login node alone.

  perf_model.py predict --gpu a100-80gb --layers 96 --hidden 12288 --heads 96 --seq 2048 \\
                        --vocab 51200 --tp 8 --pp 12 --dp 8 --micro 1 --global 1536 --recompute full
  perf_model.py advise  --gpu h100-sxm --gpus 1024 --layers 80 --hidden 8192 --heads 64 --seq 4096 \\
                        --vocab 131072 --global 1024
  perf_model.py fit                  # fit the non-vendor constants on the rows marked `fit` -> model/fitted.json
  perf_model.py published            # model and two naive baselines on the fit rows and the held-out rows
  perf_model.py published --check    # the CTest gate: exit 0 only if the model clearly beats both baselines
  perf_model.py local --build build  # Trident runs here (1 and 2 ranks): measured vs predicted
  perf_model.py deck inputs/llama3_8b.ini --gpus 8 [--gpu h100-sxm] [--check]
                                     # a Trident deck: memory per GPU, step time, MFU, rank among the advisor's
  perf_model.py advise --gpu h100-sxm --gpus 32 --layers 32 --hidden 4096 --heads 32 --query-groups 8 \
                       --seq 4096 --vocab 32000 --ffn 14336 --swiglu --untied --experts 8 --topk 2 \
                       --global 256 --flash --top 10 --check-layout tp=1,pp=4,ep=8
                                     # Mixtral 8x7B: Megatron's published layout against the advisor's

Inputs: vendor figures (GPUS below, each with its published source), and four constants that no
datasheet gives, FITTED by `fit` on the rows of model/published.csv whose `set` is `fit` and read
from model/fitted.json: per GPU the GEMM efficiency curve eff(K) = eff_max K / (K + k0) (K: the
GEMM's reduction length; k0: a fixed cost per output element, in steps of K), and, shared, the
fraction `link_eff` of a link's vendor bandwidth that collectives reach and a per-message latency.
The rows whose `set` is `heldout` are never fitted on. `fit --gemm-json` takes a GPU's curve from a
gemm_roofline measurement instead (none exists yet: no GPU was at hand). A row's micro-batch or
interleaving depth that its source does not state is `auto`: the model takes the fastest value that
fits in memory, as a tuned benchmark run would (`row_predict`).

The model (per iteration and GPU; b micro-batch, T = b s tokens, m = global / (b dp) micro-batches,
v model chunks per pipeline stage, t = tp, p = pp, d = dp, a query heads in ng key/value groups, d_h
channels per head, h / a and ng = a unless given):
  GEMMs       every GEMM of a layer on one tensor-parallel rank with its own (M, N, K): QKV ((a + 2 ng) d_h
              columns), projection (a d_h inputs), fc1 (F, or 2F gated), fc2 forward, their input- and
              weight-gradient GEMMs, and the attention core batched over b a / t heads: S = QK^T and dP
              reduce over the head dimension d_h (each S element then
              gets the softmax), PV, dV, dQ, dK over the sequence; time = 2 M N K / (peak eff(K)).
              Full recomputation repeats the forward, selective the attention core; fused (flash)
              attention skips the masked (causal) half and recomputes S in the backward pass
  memory ops  LayerNorms, bias-dropout-adds and masks (on T h / t values with sequence parallelism,
              T h without), bias + GeLU on T F / t, the softmax and dropout on a s^2 b / t scores (not
              with flash), Qwen 3's norms of q and k, at the HBM bandwidth
  tp comm     2 all-reduces (or all-gather + reduce-scatter with SP) of T h values per layer forward, 2
              backward, 2 more with full recomputation; ring cost 2 (t-1)/t bytes / (link_eff x
              bandwidth) + 2 (t-1) latencies, over NVLink inside a node. `tp_async_bwd` (Megatron since
              09/2021): the 2 backward ones run behind the column-parallel weight-gradient GEMMs;
              `tp_overlap` f (TE's --tp-comm-overlap): a fraction f is chunked behind the GEMMs, 1/t of
              it exposed and the rest as far as the GEMMs do not last
  pipeline    the last stage also runs the logit GEMMs and the fp32 cross entropy (~5 passes over the
              logits), so it sets the pace: m (T_stage + T_logits) + (p-1)/v T_stage; messages of
              T h / t values (scatter/gather or SP) 2 (v m + p - 1) times, over InfiniBand between
              nodes, all of them on the critical path (interleaving multiplies them by v; `pp_overlap`,
              --overlap-p2p-comm, is recorded but not credited: the fit rows do not support it)
  dp comm     the gradient all-reduce (ring; fp32 gradients with bf16, 16-bit with fp16: `grad_bytes`)
              or, with the distributed optimizer, a reduce-scatter of the gradients + an all-gather of
              the 16-bit parameters, of this GPU's parameters (the last stage's, with the output layer);
              over the NICs the data-parallel group has on a node (one per member; ranks are ordered
              tp, dp, pp), NVLink inside a node; with `dp_overlap` hidden behind the backward
              (gradients) and the forward (parameters) of one micro-batch as far as those last; with
              interleaving each model chunk's share behind the passes that follow that chunk's last
              backward (j p + 1 chunk steps for chunk j, Megatron's schedule) and before its first forward
  optimizer   the AdamW update at HBM bandwidth (~34 bytes per local parameter, / dp when sharded)
  memory      parameters + gradients + optimizer state at Megatron's bytes per parameter, activations by
              Korthikanti et al. 2022 on the first stage (p micro-batches in flight of l/p layers, x(1 +
              (p-1)/(p v)) when interleaved), the last stage's logits, and the framework's reserve

Context parallelism cp (Megatron's order tp-cp-dp-pp; dense models with flash attention, as Trident
requires): a rank holds T = b s / cp tokens of each sequence, and every per-token term above (GEMMs,
memory ops, tp collectives, pipeline messages, activations, logits) takes that T. The attention core:
p2p (ring attention) attends the rank's s / cp queries to cp key blocks of s / cp, the causal half of
each (the zig-zag split balances the mask); a2a (all-to-all over heads) attends all s queries of
heads / cp. cp comm, per layer and micro-batch: p2p sends cp - 1 key/value blocks of T 2 ng d / t values
forward, each behind the attention of the block before it (exposed: what the transfer lasts beyond
that), and backward the blocks again (overlapped the same way) and cp blocks of their fp32 gradients,
sent after each block's attention (exposed, as Trident does it); a2a runs all-to-alls of qkv and the
output forward and of qkv, the output, dy and dqkv (fp32) backward, on the critical path; the cp
group's ranks are t apart (NVLink while t cp fits a node). The gradients are reduced, and the
distributed optimizer shards, over the dp x cp ranks holding the same parameters. The advisor
enumerates cp in 1, 2, ..., 32 dividing s / 2.

Mixture of experts (Megatron-core's MoELayer; E experts of width Fe, gated as the dense MLP, top-k routing,
an optional shared expert of width Fs, in the layers moe_layer_freq names, n_moe of the l; E = 0 is the
dense model above, number for number). The MoE layers are taken as spread evenly over the stages.
Expert parallelism ep (dividing E and t d) is carved out of the t d ranks of a stage, Megatron's order
tp-ep-dp-pp with expert_tp 1 (an expert runs whole on one GPU): E / ep experts per GPU and MoE layer,
the expert-data-parallel group edp = t d / ep holds the same experts. Per MoE layer and micro-batch,
R = T / t the tokens a rank routes (sequence parallelism is required under tp > 1), rows = R k x
moe_imbalance the rows its experts receive (balanced dropless routing: each rank receives its own
share of all selections; the factor, default 1, stands for the busiest rank, which the others wait for):
  parameters  total: the dense layers + per MoE layer attention, norms, the router E h, the shared expert
              and E experts (h Fe1 + Fe h, Fe1 = 2 Fe gated); active: k experts instead of E (Mixtral
              8x7B: 46.70B and 12.88B, the published counts)
  FLOPs       Megatron's count on the active parameters: the MLP term of an MoE layer is (k Fe + Fs) / h
              (x 3/2 gated) instead of F / h; the router's 2 T h E per layer is left out (as Megatron
              leaves it out: 0.03% for Mixtral 8x7B), but timed below
  GEMMs       attention as a dense layer; the router (R x E, K = h); the experts' fc1 and fc2 on all rows
              of the rank's E / ep experts together (same K: h and Fe, so batching them changes nothing in
              eff(K)), their input gradients alike, and their weight gradients per expert with K = rows /
              (E / ep), the rows one expert gets: few rows per expert lower the efficiency only there (the
              curve has no term for a small M or N, so the forward GEMMs of a small expert batch, and the
              router's N = E, are counted at eff(K)); the shared expert as a dense MLP split over tp;
              forward, backward and recomputation as for the dense MLP
  memory ops  the dense layer's, with the experts' activation on rows (Fe1 + Fe) values and the token
              permutation and combination (2 passes over rows x h each way, twice more around the
              all-to-alls when ep > 1)
  tp comm     attention's pair only (and the shared expert's): with expert_tp 1 the routed experts take
              the rank's sequence-parallel rows and need no all-gather or reduce-scatter
  ep comm     per MoE layer and micro-batch 2 all-to-alls forward (dispatch, combine), 2 backward, 2 more
              with full recomputation, each of rows h bytes-per-value; Trident sends the dispatch in the
              activation type and the other three in fp32 (`moe_fp32_comm`; Megatron: all four in the
              activation type); cost (ep-1)/ep bytes / (link_eff NVLink) + (ep-1) latencies when the ep
              group (ep contiguous ranks) lies within a node, else (ep - node)/ep of the bytes over the
              NIC while (node-1)/ep go over NVLink; on the critical path (no overlap)
  dp comm     the dense gradients and parameters over dp as above; the experts' over edp (ranks ep apart:
              node / ep of them on a node), after them on the same links and behind the same passes
  optimizer   the dense parameters / dp, the experts' / edp when sharded
  memory      states: the dense part at Megatron's bytes per parameter over dp, the experts' (E / ep per
              MoE layer of the stage, whole) over edp; activations of an MoE layer: the dense layer's
              without its MLP (the shared expert's in its place), + per received row its input h, fc1
              output and fc2 input Fe1 + Fe in the activation type and the expert output h kept for the
              combination (fp32 in Trident), with ep > 1 also the received row h and the expert side's
              output h (fp32 in Trident; with ep 1 Trident gathers the rows again from the kept input),
              + the router's logits and the routing, E + 2 + 4 k fp32 values per token (the terms of
              Trident's own memory report)
"""
import argparse
import csv
import datetime
import hashlib
import inspect
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = os.path.join(HERE, "model", "published.csv")
FITTED = os.path.join(HERE, "model", "fitted.json")

# Vendor figures only (dense, no sparsity): peak TFLOP/s by precision, HBM capacity (GB) and bandwidth
# (TB/s), NVLink bandwidth per GPU and direction (GB/s), network bandwidth per GPU and direction (GB/s,
# one NIC per GPU), GPUs per node. Nothing here is fitted; `source` says where each figure is printed.
GPUS = {
    # NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), A100
    # 80GB SXM column: BF16/FP16 Tensor Core 312 TFLOP/s (624 with sparsity), TF32 156, FP32 19.5;
    # HBM2e 80 GB at 2,039 GB/s; NVLink 600 GB/s (both directions together: 300 per direction).
    # Network: a DGX A100 node (Selene) has eight 200 Gb/s HDR InfiniBand HCAs for its eight GPUs
    # (Narayanan et al. 2021, Section 5): 25 GB/s per GPU and direction.
    "a100-80gb": dict(name="a100-80gb", peak={"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
                      hbm_gb=80, hbm_tbps=2.039, nvlink_gbps=300.0, net_gbps=25.0, per_node=8,
                      source="NVIDIA A100 datasheet (A100 80GB SXM: 312 TFLOP/s dense BF16, 2,039 GB/s HBM2e, "
                             "600 GB/s NVLink); DGX A100: 8 x 200 Gb/s HDR InfiniBand per 8 GPUs"),
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: BF16/FP16 Tensor Core 1,979 TFLOP/s with
    # sparsity = 989 dense, TF32 989 with sparsity = 494 dense, FP32 67; HBM3 80 GB at 3.35 TB/s;
    # NVLink 900 GB/s (450 per direction). Network: DGX H100 datasheet, eight 400 Gb/s ConnectX-7 (NDR)
    # ports for the eight GPUs: 50 GB/s per GPU and direction.
    "h100-sxm": dict(name="h100-sxm", peak={"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0},
                     hbm_gb=80, hbm_tbps=3.35, nvlink_gbps=450.0, net_gbps=50.0, per_node=8,
                     source="NVIDIA H100 datasheet (H100 SXM: 1,979 TFLOP/s BF16 with sparsity = 989 dense, "
                            "3.35 TB/s HBM3, 900 GB/s NVLink); DGX H100: 8 x 400 Gb/s NDR per 8 GPUs"),
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: the H100's tensor-core rates (BF16 1,979
    # with sparsity = 989 dense), HBM3e 141 GB at 4.8 TB/s, NVLink 900 GB/s. Network assumed as DGX H100.
    "h200": dict(name="h200", peak={"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0},
                 hbm_gb=141, hbm_tbps=4.8, nvlink_gbps=450.0, net_gbps=50.0, per_node=8,
                 source="NVIDIA H200 datasheet (H200 SXM: 989 TFLOP/s dense BF16, 141 GB HBM3e at 4.8 TB/s, "
                        "900 GB/s NVLink); network assumed as DGX H100 (8 x 400 Gb/s NDR)"),
}

# Where a GPU has no fit rows of its own, the constants of another with the same SMs and clocks.
CONSTANTS_FROM = {"h200": "h100-sxm"}
FIT_KEYS_GPU = ("eff_max", "k0")
FIT_KEYS_SHARED = ("link_eff", "latency_us")
# Starting point and bounds of the fit (not results): eff_max in (0.3, 0.95), k0 in (1, 4096) elements,
# link_eff in (0.3, 1), latency in (1, 50) us.
FIT_BOUNDS = {"eff_max": (0.3, 0.95), "k0": (1.0, 4096.0), "link_eff": (0.3, 1.0), "latency_us": (1.0, 50.0)}
FIT_START = {"eff_max": 0.7, "k0": 128.0, "link_eff": 0.8, "latency_us": 8.0}


class InputError(Exception):
    """Bad or missing input: the data file, the fitted constants, an unknown GPU (exit status 2)."""


def load_fitted(path=FITTED):
    if not os.path.exists(path):
        raise InputError(f"{path} is missing: run `perf_model.py fit` first")
    try:
        with open(path) as f:
            fitted = json.load(f)
        for g, c in fitted["gpu"].items():
            for k in FIT_KEYS_GPU:
                float(c[k])
        for k in FIT_KEYS_SHARED:
            float(fitted["shared"][k])
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"{path}: not a fitted-constants file ({e})")
    return fitted


_FITTED = None


def constants(g, fitted=None):
    """The fitted constants for GPU record g: those it carries itself (a host 'GPU' for `local`), else
    model/fitted.json's for its name (or for CONSTANTS_FROM[name])."""
    if all(k in g for k in FIT_KEYS_GPU + FIT_KEYS_SHARED):
        return {k: g[k] for k in FIT_KEYS_GPU + FIT_KEYS_SHARED}
    global _FITTED
    if fitted is None:
        if _FITTED is None:
            _FITTED = load_fitted()
        fitted = _FITTED
    name = g.get("name")
    key = name if name in fitted["gpu"] else CONSTANTS_FROM.get(name)
    if key not in fitted["gpu"]:
        raise InputError(f"no fitted constants for GPU {name!r} in {FITTED}")
    c = dict(fitted["gpu"][key])
    c.update(fitted["shared"])
    c.update({k: g[k] for k in FIT_KEYS_GPU + FIT_KEYS_SHARED if k in g})
    return c


class Model:
    """GPT-2's layer, or with swiglu the Llama family's MLP: fc1 holds gate and up (2F rows; F each,
    default int(8h/3/64)*64 as Megatron), fc2 reads silu(gate) * up. Attention with ng key/value groups
    of d channels per head (Megatron's --num-query-groups, --kv-channels; defaults ng = a, d = h / a):
    the qkv projection has (a + 2 ng) d output columns, the output projection a d inputs, the core's
    GEMMs reduce over d; qk_layernorm (Qwen 3) adds a norm over each head's query and key channels.
    Biases, the norm (LayerNorm: weight and bias, RMSNorm: weight), the position table and an untied
    output layer change the parameters, not the FLOPs; by default they are GPT-2's (biases, LayerNorm,
    learned positions) without swiglu and the Llama family's (none, RMSNorm, rope) with it."""

    def __init__(self, layers, hidden, heads, seq, vocab, ffn=None, swiglu=False, untied=False, groups=None,
                 kv_channels=None, qk_layernorm=False, bias=None, qkv_bias=False, rmsnorm=None, learned_pos=None,
                 experts=0, topk=2, expert_ffn=None, shared_expert_ffn=0, moe_layer_freq=1):
        self.l, self.h, self.a, self.s, self.V = layers, hidden, heads, seq, vocab
        self.swiglu, self.untied = swiglu, untied
        self.F = ffn or ((8 * hidden // 3) // 64 * 64 if swiglu else 4 * hidden)
        self.F1 = 2 * self.F if swiglu else self.F  # fc1's rows
        self.ng = groups or heads  # key/value groups (ng = a: multi-head attention)
        self.d = kv_channels or hidden // heads  # channels per head
        self.qk_layernorm = qk_layernorm
        self.bias = (not swiglu) if bias is None else bias  # biases in every linear layer
        self.qkv_bias = self.bias or qkv_bias
        self.rmsnorm = swiglu if rmsnorm is None else rmsnorm
        self.learned_pos = (not swiglu) if learned_pos is None else learned_pos
        self.q = self.a * self.d  # query width: proj's input
        self.qkv = (self.a + 2 * self.ng) * self.d  # qkv's output columns
        # mixture of experts (Megatron-core's MoELayer): E experts of width Fe (gated as the dense MLP is) in
        # the layers moe_layer_freq names (N: layers 0, N, 2N, ...; or one 0/1 per layer), top-k routing, an
        # optional shared expert of width Fs; E = 0: every MLP dense
        self.E, self.k = experts, (topk if experts else 0)
        self.Fe = (expert_ffn or self.F) if experts else 0
        self.Fe1 = 2 * self.Fe if swiglu else self.Fe  # an expert's fc1 rows
        self.Fs = shared_expert_ffn if experts else 0
        self.Fs1 = 2 * self.Fs if swiglu else self.Fs
        if not experts:
            self.moe_flags = [0] * layers
        elif isinstance(moe_layer_freq, int):
            self.moe_flags = [1 if i % moe_layer_freq == 0 else 0 for i in range(layers)]
        else:
            self.moe_flags = [int(bool(x)) for x in moe_layer_freq]
            if len(self.moe_flags) != layers:
                raise InputError(f"moe layer_freq lists {len(self.moe_flags)} layers, the model has {layers}")
        if experts and not (0 < self.k <= experts):
            raise InputError(f"router top-k {topk} is not in 1..{experts} experts")
        self.n_moe = sum(self.moe_flags)  # MoE layers

    def gpt2_attention(self):
        return self.ng == self.a and self.q == self.h

    def gpt2_mlp(self):
        return not self.swiglu and self.F == 4 * self.h and not self.E

    def layer_params(self):  # GPT-2: 4h^2 + 2hF + 9h + F; the Llama family: 4h^2 + 3hF + 2h (with ng = a)
        h, norm = self.h, (1 if self.rmsnorm else 2)  # parameters per normalised channel
        n = h * self.qkv + self.q * h + h * self.F1 + self.F * h  # qkv, proj, fc1 (gate and up), fc2
        n += (self.qkv if self.qkv_bias else 0) + ((h + self.F1 + h) if self.bias else 0)
        return n + 2 * norm * h + (2 * norm * self.d if self.qk_layernorm else 0)

    def mlp_params(self, width):  # a dense MLP of this width (F, or gate and up 2F rows under swiglu), biases
        f1 = 2 * width if self.swiglu else width
        return self.h * f1 + width * self.h + ((f1 + self.h) if self.bias else 0)

    def expert_params(self):  # one routed expert
        return self.mlp_params(self.Fe)

    def moe_layer_dense_params(self):
        """An MoE layer without its routed experts: attention, norms, the router E h, the shared expert."""
        return (self.layer_params() - self.mlp_params(self.F) + self.E * self.h
                + (self.mlp_params(self.Fs) if self.Fs else 0))

    def params(self):
        h = self.h
        if self.E:  # every expert of every MoE layer
            layers = ((self.l - self.n_moe) * self.layer_params()
                      + self.n_moe * (self.moe_layer_dense_params() + self.E * self.expert_params()))
        else:
            layers = self.l * self.layer_params()
        return (layers + self.V * h * (2 if self.untied else 1)
                + (self.s * h if self.learned_pos else 0) + (1 if self.rmsnorm else 2) * h)

    def active_params(self):  # what one token sees: k routed experts per MoE layer (+ the shared one, router)
        return self.params() - self.n_moe * (self.E - self.k) * self.expert_params()

    def model_flops(self, B):  # Megatron's count for one iteration of B sequences (no recomputation)
        s, h, l, V = self.s, self.h, self.l, self.V
        if self.gpt2_mlp() and self.gpt2_attention():
            return 72.0 * B * s * l * h * h * (1 + s / (6.0 * h) + V / (12.0 * h * l))
        # num_floating_point_operations (megatron/training/training.py): attention (1 + ng/a + s/h) a d / h,
        # MLP F/h (x 3/2 gated), logits V / (2 l h), all x 12 B s l h^2
        gated = 1.5 if self.swiglu else 1.0
        attention = (1 + self.ng / self.a + s / h) * (self.q / h)
        if self.E:  # MoE layers: the active experts k Fe + Fs in place of F (Megatron's moe_layer_flops); the
            # router's 2 T h E per layer is left out, as Megatron leaves it out (0.03% for Mixtral 8x7B)
            width = ((self.l - self.n_moe) * self.F + self.n_moe * (self.k * self.Fe + self.Fs)) / l
            return 12.0 * B * s * l * h * h * (attention + width / h * gated + V / (2.0 * l * h))
        return 12.0 * B * s * l * h * h * (attention + self.F / h * gated + V / (2.0 * l * h))

    def hardware_flops(self, B, recompute, flash=False):
        """Model FLOPs + those of the recomputation (Narayanan et al.'s and Korthikanti et al.'s count)."""
        s, h, l = self.s, self.h, self.l
        f = self.model_flops(B)
        if recompute == "full" and self.gpt2_mlp() and self.gpt2_attention():
            f += 24.0 * B * s * l * h * h * (1 + s / (6.0 * h))
        elif recompute == "full":  # one more forward pass of the layers (the logits' 6 B s h V left out)
            f += (self.model_flops(B) - 6.0 * B * s * h * self.V) / 3.0
        elif recompute == "selective" and not flash:
            f += 4.0 * B * s * s * self.q * l
        return f


class Layout:
    def __init__(self, tp=1, pp=1, vp=1, dp=1, micro=1, global_batch=1, recompute="none", dtype="bf16",
                 sp=None, distributed=True, flash=False, tp_overlap=0.0, dp_overlap=True, scatter_gather=True,
                 grad_bytes=None, tp_async_bwd=False, pp_overlap=False, ep=None, moe_imbalance=1.0,
                 moe_fp32_comm=True, cp=1, cp_comm="p2p"):
        self.tp, self.pp, self.vp, self.dp, self.b, self.B = tp, pp, vp, dp, micro, global_batch
        # context parallelism (Megatron's rank order tp-cp-dp-pp): cp ranks hold s / cp tokens of each
        # sequence; cp_comm p2p (ring attention) or a2a (all-to-all over heads)
        self.cp, self.cp_comm = cp, cp_comm
        # expert parallelism (MoE models): ep ranks share each MoE layer's experts, E / ep each, carved out of
        # the tp x dp ranks of a stage (expert_tp 1); None: a dense model's layout (ep 1, not printed).
        # moe_imbalance: the busiest rank's routed rows over the balanced share (1: balanced, dropless).
        # moe_fp32_comm: Trident keeps the experts' outputs and sends the combine and both backward
        # all-to-alls in fp32 (Megatron: all four in the activation type)
        self.ep, self.show_ep = ep or 1, ep is not None
        self.moe_imbalance, self.moe_fp32_comm = moe_imbalance, moe_fp32_comm
        self.recompute, self.dtype, self.distributed, self.flash = recompute, dtype, distributed, flash
        self.sp = (tp > 1) if sp is None else sp
        self.tp_overlap, self.dp_overlap, self.scatter_gather = tp_overlap, dp_overlap, scatter_gather
        # bytes per reduced gradient: Megatron reduces fp32 gradients with bf16 (it forces
        # --accumulate-allreduce-grads-in-fp32) and 16-bit ones with fp16 unless that flag is given
        self.grad_bytes = grad_bytes or (2 if dtype == "fp16" else 4)
        # Megatron since 09/2021: the input-gradient all-reduces of the column-parallel layers (QKV, fc1)
        # run asynchronously behind those layers' weight-gradient GEMMs
        self.tp_async_bwd = tp_async_bwd
        # Megatron's --overlap-p2p-comm (interleaved schedule only): recorded, not credited (predict counts
        # every pipeline message; the fit rows do not support hiding the steady-state ones)
        self.pp_overlap = pp_overlap and vp > 1

    @property
    def gpus(self):
        return self.tp * self.pp * self.cp * self.dp

    @property
    def m(self):
        return self.B / (self.b * self.dp)

    @property
    def edp(self):  # expert-data-parallel ranks: those holding the same experts (expert_tp 1)
        return self.tp * self.cp * self.dp // self.ep

    def describe(self):
        cp = f" cp {self.cp}{' a2a' if self.cp_comm == 'a2a' else ''}" if self.cp > 1 else ""
        return (f"tp {self.tp} pp {self.pp} vp {self.vp}{cp} dp {self.dp}{f' ep {self.ep}' if self.show_ep else ''} "
                f"b {self.b} m {self.m:g} recompute "
                f"{self.recompute}{' sp' if self.sp else ''}{' zero1' if self.distributed else ''}")


def bytes_per_param(dtype, distributed, d):  # Megatron's table (the same as Trident's memory report)
    if dtype == "bf16":
        return 6 + 12 / d if distributed else 18
    if dtype == "fp16":
        return 4 + 16 / d if distributed else 20
    return 8 + 8 / d if distributed else 16


def activation_layer_bytes(M, L, e, moe=False):
    """Korthikanti et al. 2022 per layer and micro-batch, e bytes per stored value, 1-byte masks; moe: an
    MoE layer, whose MLP part is the shared expert's (split over tp as the dense MLP) and, for the rows this
    rank's experts receive (R k under balance, R = s b / t its sequence-parallel tokens, x moe_imbalance),
    each row's fc1 output and fc2 input (Fe1 + Fe) in the activation type and the expert's output kept for
    the combination (h, fp32 in Trident); with ep > 1 the expert side also keeps the rows it received (h)
    and its outputs (h, fp32 in Trident) (with ep 1 Trident gathers the rows again from the layer's kept
    input); per token the router's fp32 logits and the routing, E + 2 + 4 k fp32 values (Trident's memory
    report counts the same)."""
    s, b, h, a, t = M.s / L.cp, L.b, M.h, M.a, L.tp  # (context parallelism: the rank's s / cp tokens)
    sbh, as2b = s * b * h, a * s * s * b
    if L.recompute == "full":
        return e * sbh / (t if L.sp else 1)
    mlp = (M.F1 + M.F) / h  # fc1's output and fc2's input over h (GPT-2: 8)
    if moe:
        mlp = (M.Fs1 + M.Fs) / h
    att = (2 * M.q + 2 * M.ng * M.d) / h  # q, k, v and proj's input over h (GPT-2: 4; GQA: k and v shrink)
    if M.qk_layernorm:
        att += (M.q + M.ng * M.d) / h  # the norms' inputs (their outputs feed QK^T)
    values = sbh * ((4 + att + mlp) * e + 2) / t if L.sp else sbh * (4 * e + 2 + (att + mlp) * e / t)
    attention = 0 if (L.recompute == "selective" or L.flash) else as2b * (2 * e + 1) / t
    if moe:
        R = s * b / t  # this rank's tokens (the MoE layers need sequence parallelism under tp > 1)
        rows = R * M.k * L.moe_imbalance
        cb = 4 if L.moe_fp32_comm else e  # bytes of a kept expert output
        values += rows * ((M.Fe1 + M.Fe) * e + h * cb) + R * (M.E + 2 + 4 * M.k) * 4
        if L.ep > 1:
            values += rows * h * (e + cb)
    return values + attention


def activation_stage_bytes(M, L, e):
    """One layer's activations averaged over the model's dense and MoE layers (the MoE layers taken as
    spread evenly over the stages)."""
    if not M.E:
        return activation_layer_bytes(M, L, e)
    return ((M.l - M.n_moe) * activation_layer_bytes(M, L, e) + M.n_moe * activation_layer_bytes(M, L, e, True)) / M.l


def ring(n, nbytes, bw, lat):
    """Ring all-reduce of nbytes on n ranks: 2 (n-1)/n nbytes over each link, 2 (n-1) steps."""
    return 0.0 if n <= 1 else 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * lat


def attention_memory_seconds(M, L, e, T, q, t, heads, s, hbm, mem_f, mem_b):
    """A layer's memory-bound seconds forward and backward: the bytes mem_f / mem_b moved by its
    norms, bias-dropout-adds and MLP activation (the caller's), plus the per-head norms of q and k
    (read + write forward, 2 reads + 1 write backward), the softmax and dropout on the scores
    without flash attention (4 passes forward, 5 backward), and recomputation (full: the forward
    again; selective: the scores' passes again), at the HBM bandwidth hbm."""
    if M.qk_layernorm:
        mem_f += 2 * e * T * (q + M.ng * M.d) / t
        mem_b += 3 * e * T * (q + M.ng * M.d) / t
    if not L.flash:
        mem_f += 4 * e * heads * s * s
        mem_b += 5 * e * heads * s * s
    if L.recompute == "full":
        mem_b += mem_f
    elif L.recompute == "selective" and not L.flash:
        mem_b += 4 * e * heads * s * s
    return mem_f / hbm, mem_b / hbm


def predict(M, L, gpu, fitted=None):
    """Time (s) and memory (bytes) per iteration and GPU, with their parts."""
    g = GPUS[gpu] if isinstance(gpu, str) else gpu
    c = constants(g, fitted)
    e = 2 if L.dtype in ("bf16", "fp16") else 4
    peak = g["peak"][L.dtype] * 1e12
    hbm = g["hbm_tbps"] * 1e12
    t, p, v, d, b, m = L.tp, L.pp, L.vp, L.dp, L.b, L.m
    s, h, l, a, V, F = M.s, M.h, M.l, M.a, M.V, M.F
    N = L.gpus
    cp = L.cp
    T = b * s / cp  # tokens per micro-batch on a rank (s / cp of each sequence under context parallelism)
    dh = M.d  # head dimension (kv_channels)
    heads = b * a / t  # attention matrices (query heads) per tensor-parallel rank
    ep = L.ep
    if M.E or ep > 1:
        if not M.E:
            raise InputError(f"ep {ep}: the model has no experts")
        if (t * d) % ep or M.E % ep:
            raise InputError(f"ep {ep} must divide tp x dp = {t * d} and the experts {M.E}")
        if t > 1 and not L.sp:
            raise InputError("an MoE model with tp > 1 needs sequence parallelism (Megatron and Trident require it)")
    if cp > 1:
        if M.E:
            raise InputError("cp > 1 with experts: Trident refuses context parallelism with MoE layers")
        if not L.flash:
            raise InputError("cp > 1 needs flash attention (Trident's ring merges the fused kernel's log-sum-exp)")
        if s % (2 * cp):
            raise InputError(f"cp {cp}: the sequence {s} is not divisible by 2 cp")
        if L.cp_comm == "a2a" and ((a // t) % cp or (M.ng // t) % cp):
            raise InputError(f"cp {cp} a2a: the heads {a} and groups {M.ng} per tp rank must divide by cp")

    def gemm(Mm, Nn, Kk, batch=1.0):  # seconds for 2 M N K FLOPs at the efficiency of reduction length K:
        # t = 2 M N K / (peak eff_max) (1 + k0 / K), i.e. a fixed cost per output element worth k0 steps
        return 2.0 * Mm * Nn * Kk * batch / (peak * c["eff_max"] * Kk / (Kk + c["k0"]))

    # GEMMs of one layer and micro-batch on one tensor-parallel rank
    F1 = M.F1  # fc1's rows: F, or gate and up (2F) under swiglu
    qkv, q = M.qkv, M.q  # qkv's output columns (a + 2 ng) d (GPT-2: 3h), proj's inputs a d (GPT-2: h)
    lin_f = gemm(T, qkv / t, h) + gemm(T, h, q / t) + gemm(T, F1 / t, h) + gemm(T, h, F / t)
    wgrad_col = gemm(qkv / t, h, T) + gemm(F1 / t, h, T)  # weight gradients of the column-parallel layers
    lin_b = (gemm(T, h, qkv / t) + gemm(T, q / t, h) + gemm(T, h, F1 / t) + gemm(T, F / t, h)  # input grads
             + wgrad_col + gemm(h, q / t, T) + gemm(h, F / t, T))  # weight grads
    # the attention core: S = QK^T and dP = dO V^T reduce over the head dimension, each S element then
    # gets the softmax (the per-output-element cost k0 stands for); PV, dV, dQ, dK reduce over the
    # sequence. Batched GEMMs without flash; one fused kernel with it, which skips the masked (causal)
    # half of the tiles and recomputes S in the backward pass.
    # Context parallelism: p2p attends the rank's s / cp queries to cp key blocks of s / cp (the
    # zig-zag split gives every rank the same causal half); a2a attends all s queries of heads / cp.
    sq, sk, nb, hh = s, s, 1, heads
    if cp > 1 and L.cp_comm == "a2a":
        hh = heads / cp
    elif cp > 1:
        sq, sk, nb = s / cp, s / cp, cp
    att_f = nb * (gemm(sq, sk, dh, hh) + gemm(sq, dh, sk, hh))
    att_b = nb * (gemm(sq, sk, dh, hh) + 3 * gemm(sq, dh, sk, hh))
    if L.flash:
        att_f, att_b = 0.5 * att_f, 0.5 * (att_b + nb * gemm(sq, sk, dh, hh))
    gemm_f, gemm_b = lin_f + att_f, lin_b + att_b
    if L.recompute == "full":
        gemm_b += gemm_f
    elif L.recompute == "selective" and not L.flash:
        gemm_b += att_f
    # element-wise kernels, in values of T h: forward LayerNorms (2 x read + write), bias-dropout-adds
    # (2 x read 2, write 1), 1-byte masks; backward about twice that; bias + GeLU on T F / t (forward read
    # + write, backward 2 reads + 1 write); softmax + dropout on the scores: 4 passes forward, 5 backward
    rep = T * h / (t if L.sp else 1)
    mem_f = rep * (10 * e + 2) + T * (F1 + F) / t * e  # the activation reads fc1's output, writes fc2's input
    mem_b = rep * (20 * e + 2) + T * (F1 + F) / t * 1.5 * e
    mem_f, mem_b = attention_memory_seconds(M, L, e, T, q, t, heads, s, hbm, mem_f, mem_b)
    # tensor-parallel collectives of T h values
    node = g["per_node"]
    lat = c["latency_us"] * 1e-6
    bw_nv = g["nvlink_gbps"] * 1e9 * c["link_eff"]
    bw_net = g["net_gbps"] * 1e9 * c["link_eff"]
    one = ring(t, T * h * e, bw_nv if t <= node else bw_net, lat)
    n_f, n_b = 2, 2 + (2 if L.recompute == "full" else 0)

    def exposed(comm, gemms):  # a fraction tp_overlap chunked behind the GEMMs: 1/t of it stays exposed
        f = L.tp_overlap
        return (1 - f) * comm + f * (comm / t + max(0.0, comm * (t - 1) / t - gemms))
    tp_f = exposed(n_f * one, lin_f) if t > 1 else 0.0
    tp_b = exposed(n_b * one, lin_b) if t > 1 else 0.0
    if t > 1 and L.tp_async_bwd and L.tp_overlap == 0:
        tp_b = (n_b - 2) * one + max(0.0, 2 * one - wgrad_col)
    # context parallelism's exchange per layer (the cp group's ranks are t apart: NVLink while t cp
    # fits a node). p2p: cp - 1 key/value blocks (b s / cp tokens x 2 ng d / t values) travel forward,
    # each behind the attention of the block before it; backward the blocks again and their gradients
    # (fp32 in Trident), which leave after the block's attention (exposed). a2a: all-to-alls of qkv and
    # the output forward, and of qkv, the output, dy and dqkv (fp32) backward (Trident exchanges qkv
    # and y again rather than keeping them), on the critical path.
    cp_f = cp_b = 0.0
    if cp > 1:
        bw_cp = bw_nv if t * cp <= node else bw_net
        if L.cp_comm == "a2a":
            qkv_b, out_b = T * qkv / t * e, T * q / t * e
            cp_f = (alltoall(cp, qkv_b, max(1, node // t), bw_cp, bw_net, lat)
                    + alltoall(cp, out_b, max(1, node // t), bw_cp, bw_net, lat))
            cp_b = (cp_f + alltoall(cp, out_b * 4 / e, max(1, node // t), bw_cp, bw_net, lat)
                    + alltoall(cp, qkv_b * 4 / e, max(1, node // t), bw_cp, bw_net, lat))
        else:
            kv = T * 2 * M.ng * dh / t * e  # one block
            step = kv / bw_cp + lat
            cp_f = (cp - 1) * max(0.0, step - att_f / cp)
            cp_b = (cp - 1) * max(0.0, step - att_b / cp) + cp * (kv * 4 / e / bw_cp + lat)
        if L.recompute == "full":
            cp_b += cp_f
    layer_f, layer_b = gemm_f + mem_f + tp_f + cp_f, gemm_b + mem_b + tp_b + cp_b
    T_f, T_b = layer_f * l / p, layer_b * l / p  # one micro-batch through one stage
    if M.E:  # an MoE layer: attention as above, the MLP replaced (experts, router, shared expert, all-to-alls)
        moe = moe_layer(M, L, gemm, e, hbm, att_f, att_b, exposed, node, lat, bw_nv, bw_net)
        n_d, n_m = l - M.n_moe, M.n_moe  # dense and MoE layers, spread evenly over the stages
        T_f = (layer_f * n_d + moe["layer_f"] * n_m) / p
        T_b = (layer_b * n_d + moe["layer_b"] * n_m) / p
    T_stage = T_f + T_b
    # the last stage: logits (vocabulary split over tp) and the cross entropy. fp32: ~5 passes over the
    # fp32 logits in memory on a GPU (separate kernels for the cast, max, exp-sum, loss and gradient);
    # 16 bits: the GPU's 16-bit classifier, the logits written in 16 bits by their GEMM and read by the
    # max, the exp-sum and the gradient pass, which writes the gradient over them (4 passes of 2 bytes)
    logit_gemms = gemm(T, V / t, h) + gemm(T, h, V / t) + gemm(V / t, h, T)
    lb = g.get("logit_bytes", e)  # 2: the 16-bit classifier (GPUs in 16 bits); a CPU keeps fp32 logits
    cross_entropy = (g.get("logit_passes", 4 if lb == 2 else 5) * lb) * T * V / t / hbm
    T_logits = logit_gemms + cross_entropy
    t_compute = m * (T_stage + T_logits)
    t_bubble = (p - 1) / v * T_stage if p > 1 else 0.0
    # pipeline messages: T h / t values per stage boundary and direction (scatter/gather or SP)
    # Megatron orders ranks tp, then dp, then pp: neighbouring stages are t d ranks apart, the members
    # of a data-parallel group t apart
    crosses = t * d >= node
    p2p = T * h * e / (t if (L.sp or L.scatter_gather) else 1)
    # every micro-batch crosses each of the v p - 1 chunk boundaries twice: 2 (v m + p - 1) messages per
    # rank, all on the critical path. Interleaving multiplies the messages by v (Narayanan et al. 2021
    # §2.2.2); Megatron's --overlap-p2p-comm (pp_overlap) posts them asynchronously, but each chunk step
    # still waits on the previous step's handles, and the fit rows do not support counting them as hidden
    # (fit rms log error 0.024 with them, 0.030 with the steady-state ones hidden)
    n_msg = 2 * (v * m + p - 1)
    t_pp = 0.0 if p == 1 else n_msg * (p2p / (bw_net if crosses else bw_nv) + lat)
    # data-parallel gradients of this GPU's parameters (the last stage's, with the output layer)
    # (the word embeddings on the first stage, the output layer on the last: the same count, tied or not;
    # both on one stage without pipelining when untied)
    emb = M.V * h / t * (2 if (M.untied and p == 1) else 1)
    local_params = (l / p) * M.layer_params() / t + (emb + (s * h if M.learned_pos else 0) if p == 1 else emb)
    expert_params = 0.0
    if M.E:  # the dense part split over tp (an MoE layer's attention, norms, router, shared expert); the
        # routed experts whole (expert_tp 1), E / ep of them per MoE layer of the stage
        local_params = (((l - M.n_moe) * M.layer_params() + M.n_moe * M.moe_layer_dense_params()) / p / t
                        + (emb + (s * h if M.learned_pos else 0) if p == 1 else emb))
        expert_params = M.n_moe / p * (M.E // ep) * M.expert_params()
    # the gradients' group: dp x cp ranks (t apart), over which ZeRO-1 shards too
    dc = d * cp
    members = min(dc, max(1, node // t))  # ranks of one data-parallel group on a node
    bw_dp = bw_nv if t * dc <= node else min(bw_nv, members * bw_net)
    if L.distributed:
        t_grads = 0.0 if dc == 1 else (dc - 1) / dc * L.grad_bytes * local_params / bw_dp + (dc - 1) * lat
        t_params = 0.0 if dc == 1 else (dc - 1) / dc * e * local_params / bw_dp + (dc - 1) * lat
    else:
        t_grads, t_params = ring(dc, L.grad_bytes * local_params, bw_dp, lat), 0.0
    edp = L.edp
    if M.E and edp > 1:
        # the experts' gradients over the expert-data-parallel group (ranks ep apart in the tp-ep-dp order:
        # node // ep of them share a node), after the dense ones on the same links
        members_e = min(edp, max(1, node // ep))
        bw_edp = bw_nv if t * d <= node else min(bw_nv, members_e * bw_net)
        if L.distributed:
            t_grads += (edp - 1) / edp * L.grad_bytes * expert_params / bw_edp + (edp - 1) * lat
            t_params += (edp - 1) / edp * e * expert_params / bw_edp + (edp - 1) * lat
        else:
            t_grads += ring(edp, L.grad_bytes * expert_params, bw_edp, lat)
    if L.dp_overlap and v > 1:
        # the interleaved schedule (Megatron's schedules.py) launches each model chunk's gradient
        # reduction when that chunk's last backward pass is done: the chunks finish p chunk steps apart
        # (chunk j at j p steps before the end), so chunk j's share can run behind j p + 1 chunk
        # backward passes; each chunk's parameter gather is launched a chunk ahead in the forward
        # passes (chunk j first runs j p chunk steps after the start). The reductions share one link:
        # exposed = max over j of (the first j + 1 chunks' traffic - the window of chunk j)
        tb, tf = T_b / v, T_f / v
        t_dp = (max(0.0, max((j + 1) * t_grads / v - (j * p + 1) * tb for j in range(v)))
                + max(0.0, max((j + 1) * t_params / v - (j * p + 1) * tf for j in range(v))))
    elif L.dp_overlap:  # behind the backward (gradients) and forward (parameters) of one micro-batch
        t_dp = max(0.0, t_grads - T_b) + max(0.0, t_params - T_f)
    else:
        t_dp = t_grads + t_params
    t_opt = local_params * 34 / (dc if L.distributed else 1) / hbm
    if M.E:
        t_opt += expert_params * 34 / (edp if L.distributed else 1) / hbm
    total = t_compute + t_bubble + t_pp + t_dp + t_opt
    flops = M.hardware_flops(L.B, L.recompute, L.flash)
    gemm_time = m * ((gemm_f + gemm_b) * l / p + logit_gemms)
    parts = dict(gemm=gemm_time, elementwise=m * ((mem_f + mem_b) * l / p + cross_entropy),
                 tp=m * (tp_f + tp_b) * l / p, bubble=t_bubble, pp=t_pp, dp=t_dp, optimizer=t_opt)
    if cp > 1:
        parts["cp"] = m * (cp_f + cp_b) * l / p
    if M.E:
        parts["gemm"] = m * (((gemm_f + gemm_b) * n_d + moe["gemm"] * n_m) / p + logit_gemms)
        parts["elementwise"] = m * (((mem_f + mem_b) * n_d + moe["mem"] * n_m) / p + cross_entropy)
        parts["tp"] = m * ((tp_f + tp_b) * n_d + moe["tp"] * n_m) / p
        parts["ep"] = m * moe["a2a"] * n_m / p  # the token all-to-alls, on the critical path
        gemm_time = parts["gemm"]
    # memory: the first stage (its p micro-batches in flight) or the last (logits), whichever is larger
    states = local_params * bytes_per_param(L.dtype, L.distributed, dc)
    if M.E:  # the experts' state sharded over the expert-data-parallel group
        states += expert_params * bytes_per_param(L.dtype, L.distributed, edp)
    in_flight = l * (1 + ((p - 1) / (p * v) if v > 1 else 0))  # layers' activations held on stage 0
    acts = activation_stage_bytes(M, L, e) * in_flight
    # on the last stage (the rank's tokens): fp32 logits and their gradient, or the 16-bit classifier's
    # one 16-bit buffer (the gradient written over the logits)
    logits = (2 if lb == 2 else 8) * T * M.V / t
    memory = states + max(acts, activation_stage_bytes(M, L, e) * l / p + logits) + 2.0 * 2**30
    return dict(time=total, tflops=M.model_flops(L.B) / total / N / 1e12, hw_tflops=flops / total / N / 1e12,
                tokens_per_s=L.B * s / total, memory=memory, fits=memory <= g["hbm_gb"] * 1e9 * 0.95,
                parts=parts, eff=flops / N / max(gemm_time, 1e-30) / peak, states=states, activations=acts,
                params=local_params + expert_params, params_expert=expert_params,
                activations_last=activation_stage_bytes(M, L, e) * l / p, logits=logits, reserve=2.0 * 2**30)


def alltoall(n, nbytes, node, bw_nv, bw_net, lat):
    """All-to-all among n ranks, each sending nbytes spread evenly over the n (its own share stays): (n-1)/n
    of the bytes over the links + (n-1) latencies. A group within a node (n contiguous ranks, n dividing
    the node) uses NVLink; a larger one sends (n - node)/n of its bytes over its NIC while (node - 1)/n go
    over NVLink at the same time."""
    if n <= 1:
        return 0.0
    if n <= node and node % n == 0:
        return (n - 1) / n * nbytes / bw_nv + (n - 1) * lat
    inside = min(n, node)
    return max((n - inside) / n * nbytes / bw_net, (inside - 1) / n * nbytes / bw_nv) + (n - 1) * lat


def moe_layer(M, L, gemm, e, hbm, att_f, att_b, exposed, node, lat, bw_nv, bw_net):
    """One MoE layer and micro-batch on one GPU (forward and backward seconds, and their parts): the dense
    layer's attention; the router (R tokens x E, R = T / t the rank's sequence-parallel tokens); the experts'
    GEMMs on the R k rows the rank receives under balanced routing (x moe_imbalance), R k ep / E per local
    expert, whose weight gradients reduce over those rows; the shared expert as a dense MLP split over tp;
    the dispatch and combine all-to-alls over the ep group, 2 forward and 2 backward (+2 with full
    recomputation); tp collectives only around attention (and the shared expert): with expert_tp 1 the
    routed experts need none."""
    t, ep, h, s, b = L.tp, L.ep, M.h, M.s, L.b
    T = b * s
    R = T / t  # tokens this rank routes (sequence-parallel rows under tp > 1)
    rows = R * M.k * L.moe_imbalance  # rows this rank's experts receive
    local = M.E // ep  # experts per rank
    qkv, q, Fe, Fe1, Fs, Fs1, E = M.qkv, M.q, M.Fe, M.Fe1, M.Fs, M.Fs1, M.E
    lin_f = gemm(T, qkv / t, h) + gemm(T, h, q / t) + gemm(R, E, h)  # attention projections, router
    lin_f += gemm(rows, Fe1, h) + gemm(rows, h, Fe)  # experts: the local experts' rows together (same K)
    wgrad_col = gemm(qkv / t, h, T)
    lin_b = (gemm(T, h, qkv / t) + gemm(T, q / t, h) + wgrad_col + gemm(h, q / t, T)
             + gemm(R, h, E) + gemm(E, h, R)  # router input and weight gradients
             + gemm(rows, h, Fe1) + gemm(rows, Fe, h)  # experts' input gradients
             + gemm(Fe1, h, rows / local, local) + gemm(h, Fe, rows / local, local))  # weight grads: K = rows/expert
    if Fs:  # the shared expert: a dense MLP over all T tokens, split over tp
        lin_f += gemm(T, Fs1 / t, h) + gemm(T, h, Fs / t)
        wgrad_col += gemm(Fs1 / t, h, T)
        lin_b += gemm(T, h, Fs1 / t) + gemm(T, Fs / t, h) + gemm(Fs1 / t, h, T) + gemm(h, Fs / t, T)
    gemm_f, gemm_b = lin_f + att_f, lin_b + att_b
    if L.recompute == "full":
        gemm_b += gemm_f
    elif L.recompute == "selective" and not L.flash:
        gemm_b += att_f
    # element-wise: as the dense layer, with the expert rows' activation (R k (Fe1 + Fe) values) and the
    # permutations: gather into expert order and the weighted combination back (2 passes over R k h each
    # way), twice more for the regrouping around the all-to-alls when ep > 1
    cb = 4 if L.moe_fp32_comm else e  # bytes of the experts' outputs and the combine / backward messages
    rep = T * h / (t if L.sp else 1)
    perm = rows * h * (2 * e + 2 * cb) * (2 if ep > 1 else 1)
    mem_f = rep * (10 * e + 2) + rows * (Fe1 + Fe) * e + perm + T * (Fs1 + Fs) / t * e
    mem_b = rep * (20 * e + 2) + rows * (Fe1 + Fe) * 1.5 * e + perm + T * (Fs1 + Fs) / t * 1.5 * e
    heads = b * M.a / t
    mem_f, mem_b = attention_memory_seconds(M, L, e, T, q, t, heads, s, hbm, mem_f, mem_b)
    # tensor-parallel collectives: attention's pair (and the shared expert's); none around the routed experts
    one = ring(t, T * h * e, bw_nv if t <= node else bw_net, lat)
    n_f = 1 + (1 if Fs else 0)
    n_b = n_f * (2 if L.recompute == "full" else 1)
    tp_f = exposed(n_f * one, lin_f) if t > 1 else 0.0
    tp_b = exposed(n_b * one, lin_b) if t > 1 else 0.0
    if t > 1 and L.tp_async_bwd and L.tp_overlap == 0:
        tp_b = (n_b - n_f) * one + max(0.0, n_f * one - wgrad_col)
    # the token all-to-alls over the ep group (contiguous ranks in the tp-ep-dp order): dispatch in the
    # activation type, combine and the two backward ones in cb bytes; full recomputation repeats the forward
    a2a = lambda nbytes: alltoall(ep, rows * h * nbytes, node, bw_nv, bw_net, lat)  # noqa: E731
    a2a_f = a2a(e) + a2a(cb)
    a2a_b = 2 * a2a(cb) + (a2a_f if L.recompute == "full" else 0.0)
    return dict(layer_f=gemm_f + mem_f + tp_f + a2a_f, layer_b=gemm_b + mem_b + tp_b + a2a_b,
                gemm=gemm_f + gemm_b, mem=mem_f + mem_b, tp=tp_f + tp_b, a2a=a2a_f + a2a_b)


def print_prediction(M, L, gpu, r):
    active = f" ({M.active_params() / 1e9:.2f}B active: {M.E} experts, top-{M.k})" if M.E else ""
    print(f"{gpu}: {M.params() / 1e9:.2f}B parameters{active} on {L.gpus} GPUs ({L.describe()})")
    print(f"  step {r['time']:.3f} s | {r['tokens_per_s']:.0f} tokens/s | model {r['tflops']:.1f} TFLOP/s per GPU "
          f"(hardware {r['hw_tflops']:.1f}) | GEMM efficiency {r['eff']:.2f}")
    print("  parts (s): " + ", ".join(f"{k} {v:.4f}" for k, v in r["parts"].items()))
    print(f"  memory per GPU {r['memory'] / 2**30:.1f} GiB (states {r['states'] / 2**30:.1f}, activations "
          f"{r['activations'] / 2**30:.1f}); fits: {r['fits']}")


def divisors(n):
    return [k for k in range(1, n + 1) if n % k == 0]


def advise_rows(M, g, gpus, B, dtype="bf16", flash=False, layout_kw=None, eps=None):
    """Every layout of gpus GPUs that fits (tp in 1, 2, 4, 8 within a node, dividing the heads and the
    key/value groups; with flash attention and no experts, cp in 1, 2, ..., 32 dividing s / 2 (ring
    attention); pp any divisor of the layers; vp 1, 2, 4; micro-batch 1, 2, 4, 8; each
    recomputation; with experts, ep any divisor of E that divides tp x dp, or those of eps), with its
    prediction, fastest first. layout_kw: further Layout settings for all."""
    rows = []
    cps = [1]
    if flash and not M.E:  # context parallelism: ring attention on the fused kernel (dense models)
        cps = [k for k in (1, 2, 4, 8, 16, 32) if M.s % (2 * k) == 0]
    for t, cp in [(k, c) for k in (1, 2, 4, 8) if k <= g["per_node"] and M.a % k == 0 and M.ng % k == 0
                  and gpus % k == 0 for c in cps if gpus % (k * c) == 0]:
        for p in [k for k in divisors(M.l) if gpus % (t * cp * k) == 0]:
            d = gpus // (t * cp * p)
            ep_list = [None]
            if M.E:
                ep_list = [k for k in divisors(M.E) if (t * d) % k == 0 and (not eps or k in eps)]
            for v in [k for k in (1, 2, 4) if (k == 1 or (p > 1 and M.l % (p * k) == 0))]:
                for b in (1, 2, 4, 8):
                    if B % (b * d):
                        continue
                    if v > 1 and (B // (b * d)) % p:
                        continue
                    for rc in ("none", "selective", "full"):
                        for ep in ep_list:
                            L = Layout(t, p, v, d, b, B, rc, dtype, flash=flash, ep=ep, cp=cp,
                                       **(layout_kw or {}))
                            r = predict(M, L, g)
                            if r["fits"]:
                                rows.append((r["tokens_per_s"], L, r))
    rows.sort(key=lambda x: -x[0])
    return rows


def print_advice(M, gpu, gpus, B, dtype, rows, top):
    g = GPUS[gpu]
    what = (f"{M.params() / 1e9:.2f}B parameters ({M.active_params() / 1e9:.2f}B active: {M.E} experts, top-{M.k})"
            if M.E else f"{M.params() / 1e9:.2f}B parameters")
    print(f"advisor: {what}, {gpus} x {gpu}, global batch {B}, {dtype}: "
          f"{len(rows)} layouts fit in {g['hbm_gb']} GB; the best by predicted throughput:")
    w = 63 if M.E else 58  # the layout column (' ep N' with experts)
    print(f"  {'rank':>4}  {'layout':<{w}} {'tokens/s':>11} {'TFLOP/s/GPU':>12} {'GiB/GPU':>8}")
    for i, (tps, L, r) in enumerate(rows[:top]):
        print(f"  {i + 1:>4}  {L.describe():<{w}} {tps:>11.0f} {r['tflops']:>12.1f} {r['memory'] / 2**30:>8.1f}")


def advise(M, gpu, gpus, B, dtype="bf16", top=10, flash=False, layout_kw=None, eps=None):
    rows = advise_rows(M, GPUS[gpu], gpus, B, dtype, flash, layout_kw, eps)
    print_advice(M, gpu, gpus, B, dtype, rows, top)
    return rows


def parse_layout_spec(spec):
    """'tp=1,pp=4,ep=8[,vp=1,micro=1,recompute=none]' -> dict; vp, micro and recompute default to
    Megatron's defaults (1, 1, none), the values a script that does not set them runs with."""
    out = dict(vp=1, micro=1, recompute="none", ep=1, cp=1)
    for item in spec.split(","):
        key, _, val = item.partition("=")
        key = key.strip()
        if key not in ("tp", "pp", "ep", "cp", "vp", "micro", "recompute") or not val:
            raise InputError(f"--check-layout {spec!r}: {item!r} (keys tp, pp, cp, ep, vp, micro, recompute)")
        try:
            out[key] = val.strip() if key == "recompute" else int(val)
        except ValueError:
            raise InputError(f"--check-layout {spec!r}: {item!r} is not a whole number")
    if "tp" not in out or "pp" not in out:
        raise InputError(f"--check-layout {spec!r}: tp and pp are required")
    if out["recompute"] not in ("none", "selective", "full"):
        raise InputError(f"--check-layout {spec!r}: recompute none, selective or full")
    return out


def check_layout(M, gpu, gpus, B, dtype, flash, rows, spec, top, within, layout_kw=None):
    """A given layout (a published one) against the advisor's rows: its prediction, its rank by predicted
    throughput among the layouts that fit, what the faster ones gain, part by part. True when it fits,
    ranks among the best top and (with within) is at least (1 - within) x the best's throughput."""
    c = parse_layout_spec(spec)
    t, p, cpn = c["tp"], c["pp"], c["cp"]
    if gpus % (t * p * cpn):
        raise InputError(f"--check-layout: {gpus} GPUs are not a multiple of tp x pp x cp = {t * p * cpn}")
    d = gpus // (t * p * cpn)
    L = Layout(t, p, c["vp"], d, c["micro"], B, c["recompute"], dtype, flash=flash,
               ep=c["ep"] if M.E else None, cp=cpn, **(layout_kw or {}))
    r = predict(M, L, gpu)
    GiB = 2**30
    print(f"\nchecked layout: {L.describe()}")
    print(f"  step {r['time']:.3f} s | {r['tokens_per_s']:.0f} tokens/s | model {r['tflops']:.1f} TFLOP/s per GPU | "
          f"MFU {100 * r['tflops'] / GPUS[gpu]['peak'][dtype]:.1f}%")
    print("  parts (s): " + ", ".join(f"{k} {v:.4f}" for k, v in r["parts"].items()))
    print(f"  memory per GPU {r['memory'] / GiB:.1f} GiB: states {r['states'] / GiB:.1f} "
          f"({r['params'] / 1e9:.2f}B local parameters, {r['params_expert'] / 1e9:.2f}B of them experts), "
          f"activations {r['activations'] / GiB:.1f} "
          f"(first stage), last stage activations + logits {(r['activations_last'] + r['logits']) / GiB:.1f}, reserve "
          f"{r['reserve'] / GiB:.1f}; limit {0.95 * GPUS[gpu]['hbm_gb'] * 1e9 / GiB:.1f} GiB: "
          f"{'fits' if r['fits'] else 'DOES NOT FIT'}")
    if not rows:
        print("no advisor layout fits")
        return False
    best_tps, best_L, best_r = rows[0]
    rank = 1 + sum(1 for tps, _, _ in rows if tps > r["tokens_per_s"])
    # distinct layouts: with flash attention, selective recomputation (of the attention core, which flash
    # does not store) is the run without recomputation; such twins (same layout and prediction) count once
    seen, distinct = set(), []
    for tps, A, ra in rows:
        key = (A.tp, A.pp, A.vp, A.dp, A.ep, A.b, round(ra["time"], 12), round(ra["memory"]))
        if key not in seen:
            seen.add(key)
            distinct.append((tps, A, ra))
    rank_d = 1 + sum(1 for tps, _, _ in distinct if tps > r["tokens_per_s"])
    ratio = r["tokens_per_s"] / best_tps
    twins = (f" (row {rank} of the advisor's {len(rows)}: {len(rows) - len(distinct)} rows repeat another's layout "
             "and prediction, selective recomputation under flash attention)" if len(rows) > len(distinct) else "")
    print(f"  rank {rank_d} of {len(distinct)} distinct layouts that fit{twins}; {ratio:.3f} x the best's predicted "
          f"throughput ({best_L.describe()}: {best_tps:.0f} tokens/s)")
    print(f"  the best {top} distinct layouts:")
    for i, (tps, A, ra) in enumerate(distinct[:top]):
        mark = "  <- checked" if tps == r["tokens_per_s"] and (A.tp, A.pp, A.vp, A.ep, A.b) == (
            L.tp, L.pp, L.vp, L.ep, L.b) else ""
        print(f"  {i + 1:>4}  {A.describe():<63} {tps:>9.0f} tok/s {ra['tflops']:>6.1f} TFLOP/s "
              f"{ra['memory'] / GiB:>5.1f} GiB{mark}")
    rank = rank_d
    if rank > 1:
        diff = ", ".join(f"{k} {best_r['parts'].get(k, 0.0) - v:+.3f}" for k, v in r["parts"].items())
        print(f"  the best's parts minus the checked layout's (s per step): {diff}")
        delta = {k: best_r["parts"].get(k, 0.0) - v for k, v in r["parts"].items()}
        gains = ", ".join(f"{k} {-v:.3f} s" for k, v in sorted(delta.items(), key=lambda kv: kv[1]) if v < -0.01)
        costs = ", ".join(f"{k} {v:.3f} s" for k, v in sorted(delta.items(), key=lambda kv: -kv[1]) if v > 0.01)
        print(f"  the model prefers {best_L.describe()} by {100 * (1 / ratio - 1):.1f}%: it saves {gains or 'nothing'}"
              f" and spends {costs or 'nothing'} more per step")
        faster = [(tps, A) for tps, A, _ in distinct if tps > r["tokens_per_s"]]
        changes = {}
        for _, A in faster:
            for name, a_v, l_v in (("tp", A.tp, L.tp), ("pp", A.pp, L.pp), ("vp", A.vp, L.vp), ("ep", A.ep, L.ep),
                                   ("b", A.b, L.b), ("recompute", A.recompute, L.recompute)):
                if a_v != l_v:
                    changes.setdefault(name, set()).add(a_v)
        print("  the faster layouts differ in: " + "; ".join(f"{k} {sorted(v, key=str)}" for k, v in changes.items()))
        same = [(tps, A) for tps, A, _ in distinct if (A.vp, A.b, A.recompute) == (L.vp, L.b, L.recompute)]
        listed = any((A.tp, A.pp, A.ep) == (L.tp, L.pp, L.ep) for _, A in same)
        print(f"  among the layouts at its vp {L.vp}, micro-batch {L.b} and recomputation {L.recompute}: rank "
              f"{1 + sum(1 for tps, _ in same if tps > r['tokens_per_s'])} of {len(same) + (0 if listed else 1)}")
    ok = r["fits"] and rank <= top and (within is None or ratio >= 1 - within)
    print(("PASS" if ok else "FAIL") + f": the checked layout {'fits' if r['fits'] else 'does not fit'}, "
          f"{'ranks' if r['fits'] else 'would rank'} {rank} of the distinct layouts (gate: among the best {top})"
          + (f", {ratio:.3f} x the best (gate: >= {1 - within:.2f})" if within else ""))
    return ok


# ---------------------------------------------------------------------------------------------------
# Published rows: reading, fitting, baselines, report

COLUMNS = ("set", "source", "where", "gpu", "layers", "hidden", "heads", "seq", "vocab", "untied", "tp", "pp", "vp",
           "gpus", "global_batch", "micro", "recompute", "sp", "distributed", "dp_overlap", "tp_comm_overlap",
           "pp_overlap", "flash", "grad_bytes", "metric", "value", "assumed")
METRICS = ("hw_tflops", "model_tflops", "iter_s")


def read_rows(path=DATA):
    """The published rows, each with its Model, Layout, the published time per iteration and FLOPs."""
    try:
        with open(path, newline="") as f:
            raw = list(csv.DictReader(f))
    except OSError as e:
        raise InputError(f"cannot read {path}: {e}")
    if not raw or any(k not in raw[0] for k in COLUMNS):
        raise InputError(f"{path}: expected the columns {', '.join(COLUMNS)}")
    rows = []
    for i, r in enumerate(raw, start=2):
        try:
            if r["set"] not in ("fit", "heldout"):
                raise ValueError(f"set {r['set']!r} (fit or heldout)")
            if r["gpu"] not in GPUS:
                raise ValueError(f"unknown gpu {r['gpu']!r}")
            if r["metric"] not in METRICS:
                raise ValueError(f"metric {r['metric']!r} (one of {', '.join(METRICS)})")
            if r["recompute"] not in ("none", "selective", "full"):
                raise ValueError(f"recompute {r['recompute']!r}")
            flag = lambda k: r[k].strip() == "1"  # noqa: E731
            M = Model(int(r["layers"]), int(r["hidden"]), int(r["heads"]), int(r["seq"]), int(r["vocab"]),
                      untied=flag("untied"))
            t, p, n, B = int(r["tp"]), int(r["pp"]), int(r["gpus"]), int(r["global_batch"])
            if n % (t * p):
                raise ValueError(f"gpus {n} / (tp {t} pp {p}) is not whole")
            d = n // (t * p)
            if M.l % p or M.a % t:
                raise ValueError(f"layers {M.l} / pp {p} or heads {M.a} / tp {t} is not whole")
            # `auto` (not stated by the source): the micro-batch any of 1, 2, 4, 8, 16 that divides the batch,
            # the interleaving depth any divisor > 1 of the layers per stage (whole rounds of p micro-batches);
            # `row_predict` takes the fastest pair that fits, as a tuned benchmark run would
            bs = [1, 2, 4, 8, 16] if r["micro"].strip() == "auto" else [int(r["micro"])]
            lps = M.l // p
            vs = [k for k in range(2, lps + 1) if lps % k == 0] if r["vp"].strip() == "auto" else [int(r["vp"])]
            pairs = [(b, v) for b in bs for v in vs
                     if B % (b * d) == 0 and lps % v == 0 and (v == 1 or (B // (b * d)) % p == 0)]
            if not pairs:
                raise ValueError(f"batch {B} / (micro {r['micro']} dp {d}), layers per stage {lps} / vp {r['vp']}: "
                                 "no whole combination")
            layouts = [Layout(t, p, v, d, b, B, r["recompute"], "bf16", sp=flag("sp"),
                              distributed=flag("distributed"), flash=flag("flash"),
                              tp_overlap=1.0 if r["tp_comm_overlap"] == "all" else 0.0, dp_overlap=flag("dp_overlap"),
                              grad_bytes=int(r["grad_bytes"]), tp_async_bwd=r["tp_comm_overlap"] == "bwd",
                              pp_overlap=flag("pp_overlap")) for b, v in pairs]
            L = layouts[0]
            if r["tp_comm_overlap"] not in ("none", "bwd", "all"):
                raise ValueError(f"tp_comm_overlap {r['tp_comm_overlap']!r} (none, bwd or all)")
            if L.grad_bytes not in (2, 4):
                raise ValueError(f"grad_bytes {r['grad_bytes']!r} (2 or 4)")
            value = float(r["value"])
            if not value > 0:
                raise ValueError(f"value {r['value']!r}")
        except (ValueError, KeyError) as e:
            raise InputError(f"{path} line {i}: {e}")
        hw = M.hardware_flops(B, L.recompute, L.flash)
        if r["metric"] == "hw_tflops":
            t_pub = hw / (n * value * 1e12)
        elif r["metric"] == "model_tflops":
            t_pub = M.model_flops(B) / (n * value * 1e12)
        else:
            t_pub = value
        rows.append(dict(row=r, M=M, L=L, layouts=layouts, gpu=r["gpu"], set=r["set"], t_pub=t_pub, hw_flops=hw,
                         model_flops=M.model_flops(B), n=n))
    if not any(x["set"] == "fit" for x in rows) or not any(x["set"] == "heldout" for x in rows):
        raise InputError(f"{path}: needs rows of both sets, fit and heldout")
    missing = {x["gpu"] for x in rows} - {x["gpu"] for x in rows if x["set"] == "fit"}
    if missing:
        raise InputError(f"{path}: no fit rows for {', '.join(sorted(missing))} (the constant baseline needs them)")
    return rows


def fit_rows_digest(rows):
    """A digest of the fit rows' figures (not their comments): fitted.json records it, `published`
    refuses a stale fit."""
    keys = [k for k in COLUMNS if k not in ("source", "where", "assumed")]
    text = "\n".join(",".join(x["row"][k].strip() for k in keys) for x in rows if x["set"] == "fit")
    return hashlib.sha256(text.encode()).hexdigest()


def row_predict(x, fitted=None):
    """The prediction for a published row and the layout it was made at: with a micro-batch the source
    does not state (`auto`), the fastest of the candidates that fits in memory (the smallest if none does)."""
    preds = [(predict(x["M"], L, x["gpu"], fitted), L) for L in x["layouts"]]
    fitting = [rl for rl in preds if rl[0]["fits"]]
    return min(fitting, key=lambda rl: rl[0]["time"]) if fitting else preds[0]


def log_error(rows, fitted):
    errs = [math.log(row_predict(x, fitted)[0]["time"] / x["t_pub"]) for x in rows]
    return sum(e * e for e in errs) / len(errs)


def nelder_mead(f, x0, step=0.3, iters=2000, tol=1e-10):
    """Minimise f over R^n (plain Nelder-Mead; deterministic, no dependencies)."""
    n = len(x0)
    pts = [list(x0)] + [[x0[j] + (step if j == i else 0.0) for j in range(n)] for i in range(n)]
    vals = [f(x) for x in pts]
    for _ in range(iters):
        order = sorted(range(n + 1), key=lambda i: vals[i])
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < tol:
            break
        cen = [sum(p[j] for p in pts[:-1]) / n for j in range(n)]
        refl = [cen[j] + (cen[j] - pts[-1][j]) for j in range(n)]
        fr = f(refl)
        if fr < vals[0]:
            exp = [cen[j] + 2 * (cen[j] - pts[-1][j]) for j in range(n)]
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = [cen[j] + 0.5 * (pts[-1][j] - cen[j]) for j in range(n)]
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                for i in range(1, n + 1):
                    pts[i] = [pts[0][j] + 0.5 * (pts[i][j] - pts[0][j]) for j in range(n)]
                    vals[i] = f(pts[i])
    i = min(range(n + 1), key=lambda k: vals[k])
    return pts[i], vals[i]


def gemm_measurement(path, gpu):
    """eff_max and k0 from a GPU run of build/perf/gemm_roofline --dtype bf16 --json FILE: the curve
    eff(K) fitted (least squares in log) to the measured efficiency of every GEMM it timed."""
    with open(path) as f:
        info = json.load(f)
    if info.get("dtype") != "bf16":
        raise InputError(f"{path}: a bf16 GEMM measurement is needed (gemm_roofline --dtype bf16)")
    peak = GPUS[gpu]["peak"]["bf16"] * 1e12
    pts = [(s["K"], s["flops"] / s["median_s"] / peak) for mdl in info["models"] for s in mdl["shapes"]]
    if len(pts) < 2:
        raise InputError(f"{path}: no GEMM shapes")

    def loss(x):
        em, k0 = 0.95 / (1 + math.exp(-x[0])), math.exp(x[1])
        return sum(math.log(em * K / (K + k0) / y) ** 2 for K, y in pts)
    x, _ = nelder_mead(loss, [0.5, math.log(128.0)])
    return dict(eff_max=0.95 / (1 + math.exp(-x[0])), k0=math.exp(x[1]), measured=os.path.abspath(path))


def fit(path=DATA, out=FITTED, gemm_json=None, gemm_gpu=None, write=True):
    """Fit eff_max and k0 per GPU and link_eff and latency_us (shared) on the fit rows by least squares
    of log(predicted / published time); a GEMM measurement (gemm_json, for gemm_gpu) fixes that GPU's
    curve instead. Writes out and returns the fitted constants."""
    rows = read_rows(path)
    train = [x for x in rows if x["set"] == "fit"]
    gpus = sorted({x["gpu"] for x in train})
    measured = {}
    if gemm_json:
        if gemm_gpu not in GPUS:
            raise InputError("--gemm-json needs --gemm-gpu, one of " + ", ".join(sorted(GPUS)))
        measured[gemm_gpu] = gemm_measurement(gemm_json, gemm_gpu)
    names = [(gname, k) for gname in gpus if gname not in measured for k in FIT_KEYS_GPU] + \
            [(None, k) for k in FIT_KEYS_SHARED]

    def unpack(x):  # unconstrained x -> bounded constants (a logistic map onto each bound's range in log)
        fitted = dict(gpu={gname: {k: v for k, v in measured[gname].items() if k in FIT_KEYS_GPU}
                           for gname in measured}, shared={})
        for (gname, k), xi in zip(names, x):
            lo, hi = FIT_BOUNDS[k]
            val = math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) / (1 + math.exp(-xi)))
            (fitted["gpu"].setdefault(gname, {}) if gname else fitted["shared"])[k] = val
        return fitted

    def pack(consts):
        x = []
        for _, k in names:
            lo, hi = FIT_BOUNDS[k]
            u = (math.log(consts[k]) - math.log(lo)) / (math.log(hi) - math.log(lo))
            x.append(math.log(u / (1 - u)))
        return x
    best = None
    for start in range(3):  # three starts, the best kept: k0 at 32, 128, 512 elements
        consts = dict(FIT_START, k0=32.0 * 4 ** start)
        x, val = nelder_mead(lambda x: log_error(train, unpack(x)), pack(consts), step=0.5, iters=3000)
        x, val = nelder_mead(lambda x: log_error(train, unpack(x)), x, step=0.1, iters=3000)  # restart
        if best is None or val < best[1]:
            best = (x, val)
    fitted = unpack(best[0])
    fitted["gpu"] = {gname: {k: round(v, 6) for k, v in c.items()} for gname, c in sorted(fitted["gpu"].items())}
    fitted["shared"] = {k: round(v, 6) for k, v in fitted["shared"].items()}
    result = dict(
        what="Constants of perf/perf_model.py that no datasheet gives, fitted by `perf_model.py fit` on the rows "
             "of perf/model/published.csv whose set is `fit` (least squares of log(predicted / published time)). "
             "The held-out rows are not used.",
        command="/usr/bin/python3 perf/perf_model.py fit" + (f" --gemm-json {gemm_json} --gemm-gpu {gemm_gpu}"
                                                                if gemm_json else ""),
        fit_rows=len(train), fit_rows_sha256=fit_rows_digest(rows), rms_log_error=round(math.sqrt(best[1]), 6),
        gemm_curve={gname: ("measured: " + measured[gname]["measured"]) if gname in measured else
                    "fitted to published end-to-end throughputs (no GEMM measured on this GPU)" for gname in gpus},
        constants_from=CONSTANTS_FROM, gpu=fitted["gpu"], shared=fitted["shared"])
    if write:
        with open(out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return result


def fit_check(path=DATA, fitted_path=FITTED, gemm_json=None, gemm_gpu=None, rtol=0.005):
    """Refit in memory and compare with the constants in fitted_path: True when every constant agrees
    within rtol (the fit is reproducible from the code and the data as they are)."""
    old = load_fitted(fitted_path)
    new = fit(path, fitted_path, gemm_json, gemm_gpu, write=False)
    ok = old.get("fit_rows_sha256") == new["fit_rows_sha256"]
    print(f"fit rows: {'same' if ok else 'CHANGED'} ({new['fit_rows']} rows)")
    pairs = [(f"{g}.{k}", old["gpu"].get(g, {}).get(k), v) for g, c in new["gpu"].items() for k, v in c.items()]
    pairs += [(f"shared.{k}", old["shared"].get(k), v) for k, v in new["shared"].items()]
    for name, a, b in pairs:
        same = a is not None and abs(a - b) <= rtol * max(abs(a), abs(b))
        ok = ok and same
        print(f"  {name:<22} file {a if a is None else f'{a:.6g}':>12}  refit {b:.6g}  {'ok' if same else 'DIFFERS'}")
    return ok


def baselines(rows):
    """The two naive predictors, fitted on the fit rows only: (a) a constant hardware TFLOP/s per GPU
    type (the mean over that GPU's fit rows); (b) FLOPs executed (model + recomputation) / (GPUs x peak
    x one efficiency for every GPU, least squares of the log error as the model's own fit); and (b')
    the same on model FLOPs alone (without the recomputation; reported, not gated)."""
    train = [x for x in rows if x["set"] == "fit"]
    per_gpu = {}
    for x in train:
        per_gpu.setdefault(x["gpu"], []).append(x["hw_flops"] / (x["n"] * x["t_pub"]))
    const = {gname: sum(v) / len(v) for gname, v in per_gpu.items()}
    peak = lambda x: GPUS[x["gpu"]]["peak"]["bf16"] * 1e12  # noqa: E731
    eff_hw = math.exp(sum(math.log(x["hw_flops"] / (x["n"] * x["t_pub"] * peak(x))) for x in train) / len(train))
    eff_model = math.exp(sum(math.log(x["model_flops"] / (x["n"] * x["t_pub"] * peak(x))) for x in train) / len(train))
    return dict(const=const, eff_hw=eff_hw, eff_model=eff_model,
                a=lambda x: x["hw_flops"] / (x["n"] * const[x["gpu"]]) if x["gpu"] in const else float("nan"),
                b=lambda x: x["hw_flops"] / (x["n"] * peak(x) * eff_hw),
                b_model=lambda x: x["model_flops"] / (x["n"] * peak(x) * eff_model))


def published(out_md=None, check=False, max_ratio=0.7, max_mean=0.08, path=DATA, fitted_path=FITTED, command=None):
    """Model and baselines on every published row; the summary for the fit and the held-out rows.
    Errors are of the throughput: published time / predicted time - 1."""
    rows = read_rows(path)
    fitted = load_fitted(fitted_path)
    if fitted.get("fit_rows_sha256") != fit_rows_digest(rows):
        raise InputError(f"{fitted_path} was fitted on other fit rows than {path} holds now: "
                         "run `perf_model.py fit` again")
    base = baselines(rows)
    err = lambda t_pred, x: x["t_pub"] / t_pred - 1  # noqa: E731
    for x in rows:
        r, x["L"] = row_predict(x, fitted)
        x["model"] = err(r["time"], x)
        x["a"], x["b"], x["b_model"] = (err(base[k](x), x) for k in ("a", "b", "b_model"))

    def pub_text(x):
        r = x["row"]
        return {"hw_tflops": f"{float(r['value']):g} hw TFLOP/s", "model_tflops": f"{float(r['value']):g} TFLOP/s",
                "iter_s": f"{float(r['value']):g} s/iter"}[r["metric"]]
    lines = ["| set | source | where | layout | GPUs | batch | published | model | (a) constant | (b) FLOPs |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        r, L = x["row"], x["L"]
        lay = (f"tp {L.tp} pp {L.pp} vp {L.vp} dp {L.dp} b {L.b} {L.recompute}{' sp' if L.sp else ''}"
               f"{' flash' if L.flash else ''}")
        lines.append(f"| {x['set']} | {r['source']} | {r['where']} | {lay} | {x['n']} | {L.B} | {pub_text(x)} | "
                     f"{100 * x['model']:+.1f}% | {100 * x['a']:+.1f}% | {100 * x['b']:+.1f}% |")

    def summary(sel):
        out = {}
        for k in ("model", "a", "b", "b_model"):
            v = [abs(x[k]) for x in sel]
            out[k] = (sum(v) / len(v), max(v))
        return out
    groups = [("fit", [x for x in rows if x["set"] == "fit"]), ("held-out", [x for x in rows if x["set"] == "heldout"])]
    for gname in sorted({x["gpu"] for x in rows}):
        for s in ("fit", "heldout"):
            sel = [x for x in rows if x["gpu"] == gname and x["set"] == s]
            if sel:
                groups.append((f"  {s} {gname}", sel))
    for src in sorted({x["row"]["where"].split(" (")[0] for x in rows if x["set"] == "heldout"}):
        sel = [x for x in rows if x["set"] == "heldout" and x["row"]["where"].split(" (")[0] == src]
        groups.append((f"  heldout {src}", sel))
    lines += ["", "mean |error| (max |error|) of the throughput; ratio = model mean / baseline mean", "",
              "| rows | n | model | (a) constant TFLOP/s per GPU | (b) pure FLOPs | ratio to (a) | ratio to (b) "
              "| (b') model FLOPs only |", "|---|---|---|---|---|---|---|---|"]
    summaries = {}
    for name, sel in groups:
        sm = summaries[name] = summary(sel)
        f = lambda k: f"{100 * sm[k][0]:.1f}% ({100 * sm[k][1]:.1f}%)"  # noqa: E731
        lines.append(f"| {name.strip()} | {len(sel)} | {f('model')} | {f('a')} | {f('b')} | "
                     f"{sm['model'][0] / sm['a'][0]:.2f} | {sm['model'][0] / sm['b'][0]:.2f} | {f('b_model')} |")
    consts = ", ".join(f"{gname}: eff_max {c['eff_max']:.3f}, k0 {c['k0']:.0f}" for gname, c in fitted["gpu"].items())
    lines += ["", f"fitted constants (model/fitted.json, {fitted['fit_rows']} fit rows, rms log error "
              f"{fitted['rms_log_error']:.3f}): {consts}; link_eff {fitted['shared']['link_eff']:.3f}, latency "
              f"{fitted['shared']['latency_us']:.1f} us",
              "baselines fitted on the same fit rows: (a) " + ", ".join(
                  f"{gname} {v / 1e12:.1f} hw TFLOP/s" for gname, v in sorted(base["const"].items()))
              + f"; (b) efficiency {base['eff_hw']:.3f} of the bf16 peak; (b') {base['eff_model']:.3f}"]
    # layout effects alone: within each held-out group of one model on one GPU type from one source, the
    # throughput of every row relative to the group's first row, predicted vs published
    lines += ["", "layout effects at fixed model (held-out rows): the throughput relative to the first row of its "
              "group, mean |error| of that ratio", "",
              "| group | rows | published ratios | model | (a) constant | (b) pure FLOPs |",
              "|---|---|---|---|---|---|"]
    fixed, all_rel = {}, {"model": [], "a": [], "b": []}
    for x in rows:
        if x["set"] == "heldout":
            key = (" ".join(x["row"]["where"].split()[:2]), x["gpu"], x["M"].l, x["M"].h)  # paper, GPU, shape
            fixed.setdefault(key, []).append(x)
    for (where, gname, nl, nh), sel in fixed.items():
        if len(sel) < 2:
            continue
        ref = sel[0]
        rel = {k: [] for k in ("model", "a", "b")}
        pubs = []
        for x in sel[1:]:
            # sequences per second and GPU, relative to the first row
            pub = (x["L"].B / (x["n"] * x["t_pub"])) / (ref["L"].B / (ref["n"] * ref["t_pub"]))
            pubs.append(f"{pub:.3f}")
            for k in rel:
                pred = (1 + x[k]) / (1 + ref[k]) * pub  # predicted ratio: published ratio x error ratio
                rel[k].append(abs(pred / pub - 1))
        f = lambda k: f"{100 * sum(rel[k]) / len(rel[k]):.1f}%"  # noqa: E731
        lines.append(f"| {where}, {gname}, {nl} layers x {nh} | {len(sel)} | {' '.join(pubs)} | {f('model')} | "
                     f"{f('a')} | {f('b')} |")
        for k in rel:
            all_rel[k] += rel[k]
    f = lambda k: f"{100 * sum(all_rel[k]) / max(1, len(all_rel[k])):.1f}%"  # noqa: E731
    lines.append(f"| all ({len(all_rel['model'])} ratios) | | | {f('model')} | {f('a')} | {f('b')} |")
    held = summaries["held-out"]
    ok_a = held["model"][0] <= max_ratio * held["a"][0]
    ok_b = held["model"][0] <= max_ratio * held["b"][0]
    ok_mean = held["model"][0] <= max_mean
    verdict = (f"held-out: model {100 * held['model'][0]:.1f}% vs (a) {100 * held['a'][0]:.1f}% and (b) "
               f"{100 * held['b'][0]:.1f}%; gate: model <= {max_ratio:g} x each baseline "
               f"({'yes' if ok_a else 'NO'}, {'yes' if ok_b else 'NO'}) and <= {100 * max_mean:g}% "
               f"({'yes' if ok_mean else 'NO'})")
    # and on each GPU type's held-out rows alone: below both baselines (the H100 rows are few and their
    # throughputs close together, which a constant matches well)
    per_gpu = {name.split()[1]: sm for name, sm in summaries.items() if name.startswith("  heldout ")
               and name.split()[1] in GPUS}
    ok_gpu = {gname: sm["model"][0] < sm["a"][0] and sm["model"][0] < sm["b"][0] for gname, sm in per_gpu.items()}
    verdict += "; on each GPU's held-out rows below both baselines (" + ", ".join(
        f"{gname} {100 * sm['model'][0]:.1f}% vs {100 * sm['a'][0]:.1f}% and {100 * sm['b'][0]:.1f}%: "
        f"{'yes' if ok_gpu[gname] else 'NO'}" for gname, sm in sorted(per_gpu.items())) + ")"
    lines += ["", verdict]
    for name, sm in summaries.items():
        if name.strip().startswith("heldout") and (sm["model"][0] > sm["a"][0] or sm["model"][0] > sm["b"][0]):
            lines.append(f"NOTE: on `{name.strip()}` the model ({100 * sm['model'][0]:.1f}%) does not beat "
                         f"(a) {100 * sm['a'][0]:.1f}% and (b) {100 * sm['b'][0]:.1f}%")
    text = "\n".join(lines)
    print(text)
    passed = ok_a and ok_b and ok_mean and all(ok_gpu.values())
    result = ("PASS" if passed else "FAIL: the model does not beat both baselines clearly on the held-out rows "
              "(all of them, and each GPU's)")
    if check:
        print(result)
    if out_md:
        srcs = ["| set | row | where | assumed (not in the source) or stated |", "|---|---|---|---|"]
        srcs += [f"| {x['set']} | {x['row']['source']} | {x['row']['where']} | {x['row']['assumed']} |" for x in rows]
        with open(out_md, "w") as f:
            f.write("# Performance model against published Megatron-LM throughputs\n\n")
            f.write(f"Command: `{command or 'perf_model.py published'}` ({datetime.date.today().isoformat()}), "
                    f"constants from `{fitted.get('command', 'perf_model.py fit')}` (perf/model/fitted.json), "
                    "rows from perf/model/published.csv.\n\n")
            f.write(inspect.cleandoc(published.__doc__) + "\n\n" + inspect.cleandoc(baselines.__doc__) + "\n\n" + text + "\n"
                    + (result + "\n" if check else "") + "\n## Rows: sources and assumptions\n\n"
                    + "\n".join(srcs) + "\n")
    return passed


# ---------------------------------------------------------------------------------------------------
# Deck mode: a Trident input deck (inputs/*.ini) on a number of GPUs

def read_deck(path, vocab_override=0):
    """A Trident GPT deck's model, layout and precision (the keys of inputs/README.md; every key the
    deck leaves out takes Trident's default). Returns (Model, layout settings, notes)."""
    import configparser
    cp = configparser.ConfigParser(inline_comment_prefixes=("#",), interpolation=None)
    try:
        if not cp.read(path):
            raise InputError(f"cannot read the deck {path}")
    except configparser.Error as e:
        raise InputError(f"{path}: {e}")

    def get(section, key, default=None, kind=str):
        if not cp.has_option(section, key):
            if default is None:
                raise InputError(f"{path}: [{section}] {key} is required")
            return default
        raw = cp.get(section, key).strip()
        try:
            if kind is bool:
                if raw.lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                    raise ValueError(raw)
                return raw.lower() in ("true", "1", "yes", "on")
            return kind(raw)
        except ValueError:
            raise InputError(f"{path}: [{section}] {key} = {raw!r} is not a {kind.__name__}")
    notes = []
    if cp.has_option("model", "decoder_num_layers") or cp.has_option("model", "decoder_seq_length"):
        raise InputError(f"{path}: a T5 deck; deck mode models GPT decks")
    l, h = get("model", "num_layers", kind=int), get("model", "hidden_size", kind=int)
    a = get("model", "num_heads", kind=int)
    s = get("model", "seq_length", kind=int)
    swiglu = get("model", "swiglu", False, bool)
    ffn = get("model", "ffn_hidden_size", 0, int)
    vocab = vocab_override or get("model", "vocab_size", 0, int)
    if vocab <= 0:
        raise InputError(f"{path}: [model] vocab_size is 0 (taken from the shards at run time): give --vocab")
    t = get("parallel", "tp", 1, int)
    div = get("model", "make_vocab_size_divisible_by", 128, int) * t
    padded = -(-vocab // div) * div  # Megatron's padded vocabulary: the output layer's rows and FLOPs
    if padded != vocab:
        notes.append(f"vocabulary {vocab} padded to {padded} (a multiple of make_vocab_size_divisible_by x tp)")
    groups = get("model", "num_query_groups", 0, int)
    kv = get("model", "kv_channels", 0, int)
    if groups and a % groups:
        raise InputError(f"{path}: num_heads {a} is not a multiple of num_query_groups {groups}")
    if not kv and h % a:
        raise InputError(f"{path}: hidden_size {h} is not divisible by num_heads {a}")
    norm = get("model", "normalization", "LayerNorm")
    if norm not in ("LayerNorm", "RMSNorm"):
        raise InputError(f"{path}: normalization {norm!r} (LayerNorm or RMSNorm)")
    pos = get("model", "position_embedding_type", "learned_absolute")
    bias = get("model", "add_bias_linear", True, bool)
    # [moe] (inputs/README.md): experts, top-k, expert width, shared expert, which layers
    experts = get("moe", "num_experts", 0, int)
    topk = get("moe", "router_topk", 2, int)
    freq_raw = get("moe", "layer_freq", "1").strip()
    try:
        freq = ([int(x) for x in freq_raw.strip("[]").split(",") if x.strip()] if freq_raw.startswith("[")
                else int(freq_raw))
        if isinstance(freq, int) and freq < 1:
            raise ValueError(freq_raw)
    except ValueError:
        raise InputError(f"{path}: [moe] layer_freq = {freq_raw!r} (N >= 1 or a list of 0/1 per layer)")
    if experts and not 0 < topk <= experts:
        raise InputError(f"{path}: [moe] router_topk {topk} is not in 1..num_experts {experts}")
    if experts and get("moe", "expert_capacity_factor", 0.0, float) > 0:
        notes.append("expert_capacity_factor > 0 modelled as dropless balanced routing (the rows an expert gets "
                     "under balance are within its capacity)")
    M = Model(l, h, a, s, padded, ffn or None, swiglu, get("model", "untie_embeddings_and_output_weights", False, bool),
              groups or None, kv or None, get("model", "qk_layernorm", False, bool), bias=bias,
              qkv_bias=get("model", "add_qkv_bias", False, bool), rmsnorm=norm == "RMSNorm",
              learned_pos=pos == "learned_absolute", experts=experts, topk=topk,
              expert_ffn=get("moe", "ffn_hidden_size", 0, int) or None,
              shared_expert_ffn=get("moe", "shared_expert_intermediate_size", 0, int), moe_layer_freq=freq)
    dtype = get("precision", "dtype", "fp32")
    if dtype not in ("fp32", "bf16", "fp16"):
        raise InputError(f"{path}: dtype {dtype!r}")
    recompute = get("precision", "recompute", "none")
    if recompute not in ("none", "selective", "full"):
        raise InputError(f"{path}: recompute {recompute!r}")
    if recompute == "full" and (get("precision", "recompute_method", "uniform") != "uniform"
                                or get("precision", "recompute_num_layers", 1, int) != 1):
        notes.append("full recomputation modelled as uniform with one layer per group (the deck's method or "
                     "group size differs)")
    lay = dict(tp=t, pp=get("parallel", "pp", 1, int), vp=get("parallel", "vp", 1, int),
               micro=get("train", "micro_batch_size", 1, int), global_batch=get("train", "global_batch_size", kind=int),
               recompute=recompute, dtype=dtype, sp=get("parallel", "sequence_parallel", False, bool),
               distributed=get("optim", "distributed", "auto"), flash=get("model", "flash_attention", False, bool),
               dp_overlap=get("parallel", "overlap_grad_reduce", False, bool), vocab=vocab,
               ep=get("parallel", "ep", 1, int), cp=get("parallel", "cp", 1, int),
               cp_comm=get("parallel", "cp_comm_type", "p2p"))
    if get("parallel", "expert_tp", 1, int) != 1:
        raise InputError(f"{path}: [parallel] expert_tp > 1 (Trident refuses it; the model has expert_tp 1)")
    if lay["ep"] > 1 and not experts:
        raise InputError(f"{path}: [parallel] ep = {lay['ep']} without [moe] num_experts")
    if lay["distributed"] not in ("auto", "true", "false"):
        raise InputError(f"{path}: [optim] distributed = {lay['distributed']!r} (auto, true or false)")
    return M, lay, notes


def deck_layout(M, lay, gpus, distributed=None):
    t, p, v, b, B = lay["tp"], lay["pp"], lay["vp"], lay["micro"], lay["global_batch"]
    cpn = lay.get("cp", 1)
    if gpus % (t * p * cpn):
        raise InputError(f"--gpus {gpus} is not a multiple of tp x pp x cp = {t * p * cpn}")
    d = gpus // (t * p * cpn)
    problems = [why for bad, why in (
        (B % (b * d), f"global batch {B} is not a multiple of micro-batch {b} x dp {d}"),
        (M.a % t or M.ng % t, f"tp {t} does not divide the heads {M.a} and the key/value groups {M.ng}"),
        (M.l % (p * v), f"the layers {M.l} do not split over pp {p} x vp {v}"),
        (v > 1 and (B // max(1, b * d)) % p, f"interleaving needs the micro-batches per iteration to be a multiple "
                                             f"of pp {p}"),
        (M.E and ((t * d) % lay["ep"] or M.E % lay["ep"]), f"ep {lay['ep']} must divide tp x dp = {t * d} and the "
                                                           f"experts {M.E}"),
        (M.E and t > 1 and not lay["sp"], "an MoE model with tp > 1 needs parallel.sequence_parallel")) if bad]
    if problems:
        raise InputError("; ".join(problems))
    if distributed is None:  # auto: on when the gradients' group (dp x cp) has more than one rank
        distributed = d * cpn > 1 if lay["distributed"] == "auto" else lay["distributed"] == "true"
    return Layout(t, p, v, d, b, B, lay["recompute"], lay["dtype"], sp=lay["sp"] and t > 1, distributed=distributed,
                  flash=lay["flash"], dp_overlap=lay["dp_overlap"], ep=lay["ep"] if M.E else None, cp=cpn,
                  cp_comm=lay.get("cp_comm", "p2p"))


def deck(path, gpus, gpu="h100-sxm", top=5, check=False, vocab=0, expect_params=0):
    """The per-GPU memory, the predicted step time and MFU of a deck's layout, and its rank among the
    advisor's layouts (the same model, GPUs, global batch and precision)."""
    M, lay, notes = read_deck(path, vocab)
    g = GPUS[gpu]
    L = deck_layout(M, lay, gpus)
    r = predict(M, L, g)
    e = 2 if L.dtype in ("bf16", "fp16") else 4
    gb = 4 if L.dtype in ("bf16", "fp32") else 2  # main gradients: fp32 with bf16 (Megatron's); fp16 16-bit
    N = r["params"]
    GiB = 2**30
    unpadded = M.params() - (M.V - lay["vocab"]) * M.h * (2 if M.untied else 1)
    print(f"deck {path}: {unpadded:,} parameters ({M.params() / 1e9:.2f}B with the padded vocabulary; {M.l} layers, "
          f"hidden {M.h}, {M.a} heads, "
          f"{M.ng} key/value groups of {M.d} channels, ffn {M.F}{' swiglu' if M.swiglu else ''}, "
          f"vocabulary {lay['vocab']}"
          f"{', untied' if M.untied else ''}{', qk-layernorm' if M.qk_layernorm else ''}), sequence {M.s}")
    if M.E:
        active = M.active_params() - (M.V - lay["vocab"]) * M.h * (2 if M.untied else 1)
        print(f"  mixture of experts: {M.n_moe} MoE layers of {M.E} experts of width {M.Fe}, top-{M.k}"
              f"{f', a shared expert of width {M.Fs}' if M.Fs else ''}; {active:,} active parameters per token; "
              f"ep {L.ep}: {M.E // L.ep} experts per GPU and MoE layer, expert-data-parallel {L.edp}")
    for n in notes:
        print(f"  note: {n}")
    print(f"layout: {L.describe()} on {gpus} x {gpu}, {L.dtype}{', flash attention' if L.flash else ''}"
          f"{', overlapped gradient reduction' if L.dp_overlap else ''}")
    print(f"memory per GPU (GiB; {N / 1e9:.3f}B local parameters on the first/last stage):")
    rows = []
    Ne = r["params_expert"]
    for dist in (True, False):
        bpp = bytes_per_param(L.dtype, dist, L.dp * L.cp)  # sharded over dp x cp
        bpp_e = bytes_per_param(L.dtype, dist, L.edp)
        rows.append((dist, e * N, gb * N, (bpp - e - gb) * (N - Ne) + (bpp_e - e - gb) * Ne))
    (_, p_b, g_b, o_dist), (_, _, _, o_full) = rows
    print(f"  parameters          {p_b / GiB:8.2f}   ({e} B each"
          + (f"; {Ne / 1e9:.3f}B of them the GPU's experts)" if M.E else ")"))
    print(f"  gradients           {g_b / GiB:8.2f}   ({gb} B each, main gradients)")
    print(f"  optimizer           {o_dist / GiB:8.2f}   with the distributed optimizer (/ dp {L.dp}"
          + (f" x cp {L.cp}" if L.cp > 1 else "")
          + (f"; the experts' / expert-data-parallel {L.edp}" if M.E else "") + f"); {o_full / GiB:.2f} without")
    print(f"  activations         {r['activations'] / GiB:8.2f}   first stage, recompute {L.recompute} "
          f"(Korthikanti et al. 2022; {M.l} layers' worth in flight)")
    if L.pp > 1:
        print(f"  last stage          {(r['activations_last'] + r['logits']) / GiB:8.2f}   its layers' activations "
              f"{r['activations_last'] / GiB:.2f} + logits and their gradient {r['logits'] / GiB:.2f}")
    else:
        print(f"  logits              {r['logits'] / GiB:8.2f}   logits and their gradient (fp32; 16-bit: one buffer) (counted when larger "
              "than the in-flight activations)")
    print(f"  reserve             {r['reserve'] / GiB:8.2f}")
    other = predict(M, deck_layout(M, lay, gpus, distributed=not L.distributed), g)
    m_dist, m_full = (r["memory"], other["memory"]) if L.distributed else (other["memory"], r["memory"])
    limit = g["hbm_gb"] * 1e9 * 0.95
    print(f"  total               {m_dist / GiB:8.2f}   with the distributed optimizer; {m_full / GiB:.2f} without "
          f"(limit 95% of {g['hbm_gb']} GB = {limit / GiB:.1f} GiB); the deck's "
          f"({'distributed' if L.distributed else 'plain'} optimizer) fits: {'yes' if r['fits'] else 'NO'}")
    peak = g["peak"][L.dtype]
    print(f"step {r['time']:.3f} s | {r['tokens_per_s']:.0f} tokens/s | model {r['tflops']:.1f} TFLOP/s per GPU | "
          f"MFU {100 * r['tflops'] / peak:.1f}% of {peak:g} TFLOP/s ({L.dtype} dense)")
    print("  parts (s): " + ", ".join(f"{k} {v:.4f}" for k, v in r["parts"].items()))
    adv = advise_rows(M, g, gpus, L.B, L.dtype, L.flash, dict(dp_overlap=L.dp_overlap))
    faster = sum(1 for tps, _, _ in adv if tps > r["tokens_per_s"])
    among = any((A.tp, A.pp, A.vp, A.b, A.recompute, A.ep, A.cp) == (L.tp, L.pp, L.vp, L.b, L.recompute, L.ep, L.cp)
                for _, A, _ in adv)
    if not r["fits"]:
        rank_line = f"the deck's layout does not fit; {len(adv)} of the advisor's layouts do"
    else:
        rank_line = (f"the deck's layout ranks {faster + 1} of {len(adv) + (0 if among else 1)} by predicted "
                     f"throughput ({r['tokens_per_s'] / adv[0][0]:.2f} x the best)" if adv
                     else "no advisor layout fits")
        if not among:
            rank_line += " (it is not one of the advisor's candidates: vp beyond 1, 2, 4, or its sp/optimizer settings)"
    print("rank: " + rank_line)
    print_advice(M, gpu, gpus, L.B, L.dtype, adv, top)
    ok = r["fits"] and (not expect_params or unpadded == expect_params)
    if check or expect_params:
        if expect_params and unpadded != expect_params:
            print(f"FAIL: {unpadded:,} parameters, expected {expect_params:,}")
        if check and not r["fits"]:
            print("FAIL: the deck's layout does not fit in memory")
        if ok:
            print("PASS: the deck's layout fits" + (f" and it has the expected {expect_params:,} parameters"
                                                     if expect_params else ""))
    return ok


# Checkpoint saves at scale (docs/DESIGN.md "Write path", "Asynchronous save"). The parallel file
# system's figures: NERSC's Perlmutter scratch, an all-flash Lustre file system (HPE ClusterStor
# E1000), "an aggregate bandwidth of >5 TB/sec" with 274 OSSes (docs.nersc.gov/filesystems/
# perlmutter-scratch), and its GPU nodes reach it through 4 Slingshot NICs of 200 Gb/s each (Lockwood
# et al., "Architecture and Performance of Perlmutter's 35 PB ClusterStor E1000 All-Flash File
# System", CUG 2021, Fig. 1): at most 100 GB/s per node. What one node's ranks write to Lustre through
# the client is the parameter --node-gbps (default 10 GB/s, a tenth of the NICs', an assumption:
# measure it with IOR on the machine at hand); the file system caps the sum at --fs-gbps.
PERLMUTTER_SCRATCH_GBPS = 5000.0
PERLMUTTER_NODE_NIC_GBPS = 100.0


def checkpoint_rows():
    """(name, Model, Layout, gpus, gpu) of the projected runs: the Llama 3 70B and Mixtral 8x7B decks
    at their CTest GPU counts, and the 175B row of the published table (Korthikanti et al. 2022)."""
    out = []
    for name, deck_file, gpus in (("Llama 3 70B (inputs/llama3_70b.ini)", "llama3_70b.ini", 64),
                                  ("Mixtral 8x7B (inputs/mixtral_8x7b.ini)", "mixtral_8x7b.ini", 32)):
        M, lay, _ = read_deck(os.path.join(ROOT, "inputs", deck_file))
        out.append((name, M, deck_layout(M, lay, gpus), gpus, "h100-sxm"))
    x = next(r for r in read_rows() if r["row"]["source"] == "Korthikanti 2022 175B selective + SP")
    out.append(("GPT 175B (published table: Korthikanti 2022, selective + SP)", x["M"], row_predict(x)[1], x["n"],
                x["gpu"]))
    return out


def checkpoint_projection(node_gbps=10.0, fs_gbps=PERLMUTTER_SCRATCH_GBPS, gpus_per_node=8, d2h_gbps=20.0,
                          interval=500, out_md=None):
    """The stall of a checkpoint save and its extra memory, synchronous against asynchronous, for the
    rows of checkpoint_rows(). Trident's checkpoint holds 16 bytes per parameter in a 16-bit run (the
    model widened to fp32, the fp32 masters and both moments) and 12 in an fp32 one; every rank writes
    its share (the ranks' parts partition every tensor), so a save moves checkpoint / GPUs bytes per GPU
    over PCIe (--d2h-gbps, pageable host memory) and checkpoint / min(nodes x node rate, file system
    rate) seconds to the file system. Synchronous: training waits for both. Asynchronous: for the copy
    only; the write must finish within the checkpoint interval (`interval` iterations of the predicted
    step). The gathering save this replaces held both full moments of a model-parallel rank (its
    parameters / (tp x pp) x 8 bytes) on the device during the save, and again on the host."""
    lines = [f"Checkpoint save at scale: {node_gbps:g} GB/s per node to the file system (capped at {fs_gbps:g} GB/s "
             f"in all: Perlmutter scratch's published aggregate), {gpus_per_node} GPUs per node, {d2h_gbps:g} GB/s "
             f"device-to-host per GPU, a save every {interval} iterations.", "",
             "| run | GPUs | parameters | checkpoint TB | step s | write s | sync stall s | sync overhead | "
             "async stall s | async overhead | write within interval | gather's device GB/GPU (before) | "
             "async host GB/node |", "|" + "---|" * 13]
    for name, M, L, gpus, gpu in checkpoint_rows():
        P = M.params()
        per_param = 16 if L.dtype in ("bf16", "fp16") else 12
        S = per_param * P
        nodes = math.ceil(gpus / gpus_per_node)
        agg = min(nodes * node_gbps, fs_gbps) * 1e9
        w = S / gpus
        t_copy = w / (d2h_gbps * 1e9)
        t_write = S / agg
        r = predict(M, L, gpu)
        step = r["time"]
        period = interval * step
        sync = t_copy + t_write
        gather = r["params"] * 8 / 1e9  # the rank's parameters (first stage): both moments, fp32
        lines.append(f"| {name} | {gpus} | {P / 1e9:.1f}B | {S / 1e12:.2f} | {step:.2f} | {t_write:.1f} | {sync:.1f} "
                     f"| {100 * sync / (period + sync):.1f}% | {t_copy:.2f} | {100 * t_copy / (period + t_copy):.2f}% "
                     f"| {'yes' if t_write < period else 'NO'} ({t_write / period:.2f} of it) | {gather:.1f} "
                     f"| {w * min(gpus, gpus_per_node) / 1e9:.0f} |")
    lines += ["", "Overheads are the stall over the time between two saves (the interval's steps plus the stall). "
              "`write within interval`: the background write's time over the interval (a save waits for the "
              "previous one beyond 1)."]
    text = "\n".join(lines)
    print(text)
    if out_md:
        with open(out_md, "w") as f:
            f.write(text + "\n")
    return text


def host_device(build, threads, layers=4, hidden=128, seq=128, tokens=512):
    """One rank's share of this machine as a 'GPU' for the model: the fp32 GEMM rate of exactly this
    model's GEMMs measured by gemm_roofline through Trident's ops/gemm with the rank's threads (peak:
    a 1024^3 GEMM; efficiency: the model's GEMMs over the peak), memory bandwidth from a large copy
    measured with numpy, and MPICH's shared-memory transport for the messages (~5 GB/s per direction)."""
    exe = os.path.join(build, "perf", "gemm_roofline")
    tmp = os.path.join(build, "perf", "roofline_host.json")
    subprocess.run([exe, "--square", "1024", "--hidden", str(hidden), "--seq", str(seq), "--tokens", str(tokens),
                    "--vocab", "50304", "--json", tmp], check=True, capture_output=True,
                   env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    info = json.load(open(tmp))
    peak = info["square"]["flops"] / info["square"]["median_s"]
    shape = next(v for k, v in info.items() if isinstance(v, list) and v and "layer_flops" in v[0])[0]
    rate = (layers * shape["layer_flops"] + shape["head_flops"]) / (layers * shape["layer_time_s"] + shape["head_time_s"])
    import time
    import numpy as np
    a = np.ones(2 ** 25, dtype=np.float32)
    t0 = time.perf_counter()
    for _ in range(5):
        a.copy()
    bw = 5 * 2 * a.nbytes / (time.perf_counter() - t0)
    # measured here, so nothing is taken from model/fitted.json: a flat GEMM curve at the measured rate
    # logit_passes 1: a row of logits stays in the CPU's cache between the cross entropy's passes
    return dict(name="host", peak={"fp32": peak / 1e12}, hbm_gb=24, hbm_tbps=bw / 1e12, nvlink_gbps=5.0,
                net_gbps=5.0, per_node=2, eff_max=rate / peak, k0=0.0, link_eff=1.0, latency_us=5.0, logit_passes=1, logit_bytes=4)


def local(build, out_md=None, iters=8):
    """Trident's GPT runs here against the model with the host as the device: step time and the
    memory Trident reports (parameters + gradients + optimizer, activations)."""
    cores = os.cpu_count() or 1
    devices = {}
    deck = os.path.join(ROOT, "inputs", "gpt_small.ini")
    shards = os.path.join(ROOT, "data", "sample", "kjv_gpt2_*.h5")
    M = Model(4, 128, 4, 128, 50257)
    cases = [("np1", 1, dict()), ("dp2", 2, dict(dp=2)), ("tp2", 2, dict(tp=2)), ("pp2", 2, dict(pp=2)),
             ("np1 full recompute", 1, dict(recompute="full"))]
    lines = ["| run | measured ms/iter | predicted | error | measured states+activations MiB | predicted | error |",
             "|---|---|---|---|---|---|---|"]
    work = os.path.join(build, "perf", "model_local")
    os.makedirs(work, exist_ok=True)
    for name, n, kw in cases:
        mcsv = os.path.join(work, name.replace(" ", "_") + ".csv")
        if os.path.exists(mcsv):
            os.remove(mcsv)  # its own scratch file: a run from scratch would refuse to replace it
        cmd = ["mpiexec", "-n", str(n), os.path.join(build, "apps", "pretrain_gpt"), "--deck", deck,
               "--data.train_shards", shards, "--train.iters", str(iters), "--eval.interval", "0",
               "--checkpoint.save=", "--log.metrics_file", mcsv, "--train.global_batch_size", "8",
               "--log.memory_file", mcsv[:-4] + "_memory.json"]
        tp, pp, dp = kw.get("tp", 1), kw.get("pp", 1), kw.get("dp", 1)
        threads = max(1, cores // n)  # what the app gives each rank (app_driver: the node's cores / ranks)
        if threads not in devices:
            devices[threads] = host_device(build, threads)
        dev = devices[threads]
        cmd += ["--parallel.tp", str(tp), "--parallel.pp", str(pp), "--precision.recompute", kw.get("recompute", "none")]
        subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows = list(csv.DictReader(open(mcsv)))[2:]
        ms = sorted(float(r["ms_per_iter"]) for r in rows)[len(rows) // 2]
        with open(mcsv[:-4] + "_memory.json") as f:
            r0 = json.load(f)["ranks"][0]  # rank 0: params, grads, optimizer, activations
        measured_mem = (r0["params_bytes"] + r0["grads_bytes"] + r0["optimizer_bytes"] + r0["activation_bytes"]) / 2**20
        L = Layout(tp, pp, 1, dp, 4, 8, kw.get("recompute", "none"), "fp32", sp=False, distributed=False,
                   dp_overlap=False, scatter_gather=False)
        r = predict(M, L, dev)
        pred_ms = r["time"] * 1e3
        pred_mem = (r["states"] + r["activations"]) / 2**20
        lines.append(f"| {name} | {ms:.1f} | {pred_ms:.1f} | {100 * (pred_ms - ms) / ms:+.0f}% | {measured_mem:.1f} | "
                     f"{pred_mem:.1f} | {100 * (pred_mem - measured_mem) / measured_mem:+.0f}% |")
    text = "\n".join(lines)
    for threads, dev in sorted(devices.items()):
        print(f"host, {threads} thread(s) per rank: fp32 GEMM peak {dev['peak']['fp32'] * 1e3:.1f} GFLOP/s, this model's GEMMs at "
              f"{dev['eff_max']:.2f} of it, copy bandwidth {dev['hbm_tbps'] * 1e3:.1f} GB/s")
    print(text)
    if out_md:
        with open(out_md, "w") as f:
            f.write("# Performance model against Trident runs on this machine\n\n" + local.__doc__.strip() + "\n\n"
                    + "GPT small (4 layers, hidden 128, seq 128, GPT-2 vocabulary), micro-batch 4, global batch 8, "
                      "fp32, on " + str(cores) + " cores; per rank: " + "; ".join(
                          f"{t} thread(s): fp32 GEMM peak {d['peak']['fp32'] * 1e3:.1f} GFLOP/s, the model's GEMMs "
                          f"at {d['eff_max']:.2f} of it" for t, d in sorted(devices.items())) + "\n\n" + text + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("predict", "advise"):
        q = sub.add_parser(name)
        q.add_argument("--gpu", default="h100-sxm", choices=sorted(GPUS))
        q.add_argument("--layers", type=int, required=True)
        q.add_argument("--hidden", type=int, required=True)
        q.add_argument("--heads", type=int, required=True)
        q.add_argument("--seq", type=int, default=2048)
        q.add_argument("--vocab", type=int, default=51200)
        q.add_argument("--ffn", type=int, default=0, help="MLP width (0: 4h; with --swiglu int(8h/3/64)*64 per half)")
        q.add_argument("--swiglu", action="store_true", help="the Llama family's gated MLP (gate, up, down)")
        q.add_argument("--untied", action="store_true", help="an output layer of its own")
        q.add_argument("--query-groups", type=int, default=0,
                       help="key/value groups of grouped-query attention (0: --heads, multi-head)")
        q.add_argument("--kv-channels", type=int, default=0, help="channels per attention head (0: hidden / heads)")
        q.add_argument("--qk-layernorm", action="store_true",
                       help="a norm over each head's queries and keys (Qwen 3): its element-wise traffic and activations")
        q.add_argument("--global", dest="global_batch", type=int, required=True)
        q.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
        q.add_argument("--flash", action="store_true")
        q.add_argument("--experts", type=int, default=0, help="routed experts per MoE layer (0: a dense model)")
        q.add_argument("--topk", type=int, default=2, help="experts each token is routed to")
        q.add_argument("--expert-ffn", type=int, default=0, help="each expert's MLP width (0: --ffn's)")
        q.add_argument("--shared-expert-ffn", type=int, default=0, help="a shared expert's width (0: none)")
        q.add_argument("--moe-layer-freq", type=int, default=1,
                       help="every N-th layer is an MoE layer (layers 0, N, ...)")
        q.add_argument("--moe-imbalance", type=float, default=1.0,
                       help="the busiest rank's routed rows over the balanced share (1: balanced dropless routing)")
        q.add_argument("--a2a-16bit", action="store_true",
                       help="keep the experts' outputs and send every all-to-all in the activation type (Megatron); "
                            "default: Trident, the combine and the backward all-to-alls in fp32")
        if name == "predict":
            for k, dflt in (("tp", 1), ("pp", 1), ("vp", 1), ("dp", 1), ("micro", 1), ("ep", 1)):
                q.add_argument("--" + k, type=int, default=dflt)
            q.add_argument("--recompute", default="none", choices=["none", "selective", "full"])
            q.add_argument("--no-sp", action="store_true")
            q.add_argument("--no-distributed", action="store_true")
            q.add_argument("--tp-overlap", type=float, default=0.0,
                           help="fraction of the tensor-parallel traffic chunked behind the GEMMs (0..1)")
            q.add_argument("--no-dp-overlap", action="store_true")
        else:
            q.add_argument("--gpus", type=int, required=True)
            q.add_argument("--top", type=int, default=10)
            q.add_argument("--expect", metavar="TP,PP",
                           help="exit 1 unless a layout with this tensor- and pipeline-parallel size is among the best --top")
            q.add_argument("--ep", type=int, default=0, help="consider only this expert-parallel size (0: every one)")
            q.add_argument("--check-layout", metavar="SPEC",
                           help="a layout 'tp=1,pp=4,ep=8[,vp=1,micro=1,recompute=none]' (unset keys: Megatron's "
                                "defaults): print its prediction and rank; exit 1 unless it fits and ranks among the "
                                "best --top (and, with --within, is within that fraction of the best's throughput)")
            q.add_argument("--within", type=float, default=None,
                           help="with --check-layout: also require at least (1 - WITHIN) x the best's throughput")
    q = sub.add_parser("fit", help="fit the non-vendor constants on the fit rows; writes model/fitted.json")
    q.add_argument("--data", default=DATA)
    q.add_argument("--out", default=FITTED)
    q.add_argument("--gemm-json", help="a GPU run of gemm_roofline --dtype bf16 --json: fixes that GPU's GEMM curve")
    q.add_argument("--gemm-gpu", choices=sorted(GPUS), help="the GPU the --gemm-json file was measured on")
    q.add_argument("--check", action="store_true",
                   help="write nothing: refit and exit 1 unless --out's constants agree within 0.5%% (reproducibility)")
    q = sub.add_parser("published", help="model and baselines on the fit and the held-out rows")
    q.add_argument("--data", default=DATA)
    q.add_argument("--fitted", default=FITTED)
    q.add_argument("--out", help="also write the report (markdown) here")
    q.add_argument("--check", action="store_true",
                   help="exit 1 unless, on the held-out rows, the model's mean |error| is at most --max-ratio times "
                        "each baseline's and at most --max-mean-error, and on each GPU type's held-out rows below "
                        "both baselines' mean")
    q.add_argument("--max-ratio", type=float, default=0.7)
    q.add_argument("--max-mean-error", type=float, default=0.08)
    q = sub.add_parser("deck", help="a Trident deck (inputs/*.ini): memory, step time and the layout's rank")
    q.add_argument("path")
    q.add_argument("--gpus", type=int, required=True)
    q.add_argument("--gpu", default="h100-sxm", choices=sorted(GPUS))
    q.add_argument("--top", type=int, default=5)
    q.add_argument("--vocab", type=int, default=0, help="the vocabulary when the deck leaves model.vocab_size at 0")
    q.add_argument("--check", action="store_true", help="exit 1 unless the deck's layout fits in memory")
    q.add_argument("--expect-params", type=int, default=0,
                   help="exit 1 unless the model has this many parameters (the unpadded vocabulary)")
    q = sub.add_parser("checkpoint", help="a checkpoint save's stall and extra memory at scale, sync vs async")
    q.add_argument("--node-gbps", type=float, default=10.0, help="one node's write rate to the file system, GB/s")
    q.add_argument("--fs-gbps", type=float, default=PERLMUTTER_SCRATCH_GBPS,
                   help="the file system's aggregate write rate, GB/s (default: Perlmutter scratch's published >5 TB/s)")
    q.add_argument("--gpus-per-node", type=int, default=8)
    q.add_argument("--d2h-gbps", type=float, default=20.0, help="device-to-host copy rate per GPU, GB/s")
    q.add_argument("--interval", type=int, default=500, help="iterations between saves")
    q.add_argument("--out", help="also write the table (markdown) here")
    q = sub.add_parser("local")
    q.add_argument("--build", default=os.path.join(ROOT, "build"))
    q.add_argument("--out")
    a = ap.parse_args()
    try:
        return run(a)
    except InputError as e:
        print(f"perf_model.py: bad input: {e}", file=sys.stderr)
        return 2


def run(a):
    if a.cmd == "fit":
        if a.check:
            ok = fit_check(a.data, a.out, a.gemm_json, a.gemm_gpu)
            print("PASS: the committed constants are what the fit gives" if ok else
                  f"FAIL: {a.out} is not what `perf_model.py fit` gives for the current code and data")
            return 0 if ok else 1
        r = fit(a.data, a.out, a.gemm_json, a.gemm_gpu)
        print(json.dumps({k: r[k] for k in ("fit_rows", "rms_log_error", "gpu", "shared", "gemm_curve")}, indent=2))
        print(f"wrote {a.out}")
        return 0
    if a.cmd == "published":
        if not (0 < a.max_ratio and 0 < a.max_mean_error):
            raise InputError("--max-ratio and --max-mean-error must be positive")
        cmd = "/usr/bin/python3 perf/perf_model.py " + " ".join(sys.argv[1:])
        passed = published(a.out, a.check, a.max_ratio, a.max_mean_error, a.data, a.fitted, cmd)
        return 0 if (passed or not a.check) else 1
    if a.cmd == "deck":
        ok = deck(a.path, a.gpus, a.gpu, a.top, a.check, a.vocab, a.expect_params)
        return 0 if (ok or not (a.check or a.expect_params)) else 1
    if a.cmd == "local":
        local(a.build, a.out)
        return 0
    if a.cmd == "checkpoint":
        if min(a.node_gbps, a.fs_gbps, a.d2h_gbps) <= 0 or a.gpus_per_node < 1 or a.interval < 1:
            raise InputError("--node-gbps, --fs-gbps, --d2h-gbps must be positive; --gpus-per-node, --interval >= 1")
        checkpoint_projection(a.node_gbps, a.fs_gbps, a.gpus_per_node, a.d2h_gbps, a.interval, a.out)
        return 0
    if a.query_groups and a.heads % a.query_groups:
        raise InputError(f"--heads {a.heads} is not a multiple of --query-groups {a.query_groups}")
    if not a.kv_channels and a.hidden % a.heads:
        raise InputError(f"--hidden {a.hidden} is not divisible by --heads {a.heads}: give --kv-channels")
    if a.experts < 0 or (a.experts and not 0 < a.topk <= a.experts) or a.moe_layer_freq < 1 or a.moe_imbalance < 1:
        raise InputError("--experts >= 0, --topk in 1..experts, --moe-layer-freq >= 1, --moe-imbalance >= 1")
    M = Model(a.layers, a.hidden, a.heads, a.seq, a.vocab, a.ffn or None, a.swiglu, a.untied, a.query_groups or None,
              a.kv_channels or None, a.qk_layernorm, experts=a.experts, topk=a.topk, expert_ffn=a.expert_ffn or None,
              shared_expert_ffn=a.shared_expert_ffn, moe_layer_freq=a.moe_layer_freq)
    moe_kw = dict(moe_imbalance=a.moe_imbalance, moe_fp32_comm=not a.a2a_16bit) if a.experts else {}
    if a.cmd == "advise":
        if a.check_layout:
            parse_layout_spec(a.check_layout)  # bad input before the advice
        if a.ep and (not a.experts or a.experts % a.ep):
            raise InputError(f"--ep {a.ep} must divide --experts {a.experts}")
        rows = advise(M, a.gpu, a.gpus, a.global_batch, a.dtype, a.top, a.flash, moe_kw, [a.ep] if a.ep else None)
        if a.check_layout:
            ok = check_layout(M, a.gpu, a.gpus, a.global_batch, a.dtype, a.flash, rows, a.check_layout, a.top,
                              a.within, moe_kw)
            return 0 if ok else 1
        if not rows:
            print("FAIL: no layout fits")
            return 1
        if a.expect:
            tp, pp = (int(x) for x in a.expect.split(","))
            ranks = [i + 1 for i, (_, L, _) in enumerate(rows[:a.top]) if (L.tp, L.pp) == (tp, pp)]
            if not ranks:
                print(f"FAIL: no layout with tp {tp} pp {pp} among the best {a.top}")
                return 1
            print(f"expected layout tp {tp} pp {pp}: rank {ranks[0]} of the best {a.top}")
        return 0
    L = Layout(a.tp, a.pp, a.vp, a.dp, a.micro, a.global_batch, a.recompute, a.dtype, sp=not a.no_sp and a.tp > 1,
               distributed=not a.no_distributed, flash=a.flash, tp_overlap=a.tp_overlap, dp_overlap=not a.no_dp_overlap,
               ep=a.ep if a.experts else (a.ep if a.ep > 1 else None), **moe_kw)
    print_prediction(M, L, a.gpu, predict(M, L, a.gpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
