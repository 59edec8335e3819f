#!/usr/bin/python3
"""PyTorch peer for perf/bench_gpt.py: trains a GPT-2- or Llama-architecture model for a few steps
on the CPU and prints one JSON object with its throughput.

The model is the one Trident trains (docs/DESIGN.md): learned absolute positions, pre-LayerNorm
(eps 1e-5), GELU (tanh form), causal self-attention written out as matmuls (Trident's op
order: QK^T, mask, softmax, dropout, PV), dropout (default 0.1) where GPT-2 and Trident have it
(embeddings, attention probabilities, each residual branch), tied input/output embeddings, init normal(0, 0.02) with output
projections scaled by 1/sqrt(2 * layers); fp32; AdamW (no weight decay on biases and LayerNorm
parameters, like Trident) with gradient clipping at 1.0 every step. Tokens are random (the
speed of a dense step does not depend on them). --compile runs the same model through torch.compile
(the GPU benchmark's second peer).

Model FLOPs use Megatron's formula 72 B s l h^2 (1 + s/6h + V/12hl) with V = the PADDED vocabulary
(50304 for GPT-2's 50257, --flops-vocab), the V Trident reports, so that both sides count the same
FLOPs per token; PyTorch itself runs the unpadded 50257-row embedding/LM head (about 0.1% fewer
real FLOPs).

--arch llama --experts E --topk k --expert-ffn Fe replaces every layer's MLP by a mixture of experts
as the reference implementations write it (Mixtral's sparse MoE block in Hugging Face): a linear
router, softmax over the E experts, the top-k renormalised, then a Python loop over the experts,
each running its tokens (index_select) through its own SwiGLU and adding them back weighted
(index_add); the load-balancing loss (Switch, coefficient 0.01) joins the loss. FLOPs count the
active parameters (Megatron's MoE form: k Fe in place of F).

--arch llama is the Llama family's decoder as Meta and Hugging Face define it (LlamaForCausalLM):
no positions added to the embeddings but rotary positions on each head's queries and keys (base
--rotary-base, the half-split rotation of Hugging Face's rotate_half), RMSNorm (eps 1e-5) before
each block and the output layer, a SwiGLU MLP down(silu(gate x) * up x) of width --ffn, grouped-
query attention (--groups key/value heads, each shared by heads/groups query heads), no linear
biases, an untied output layer. Its FLOPs are Megatron's general form
12 B s l h^2 ((1 + ng/nh + s/h) nh d/h + 3F/2h + V/2lh) (num_floating_point_operations in
megatron/training/training.py), the formula Trident prints for such a deck.

Run with Debian's interpreter (/usr/bin/python3): it has torch 1.13 with OpenBLAS GEMMs. Threads:
both torch.set_num_threads(n) and OPENBLAS_NUM_THREADS=n (and OMP_NUM_THREADS) are set here,
before torch is imported.

  /usr/bin/python3 perf/torch_gpt.py --layers 12 --hidden 768 --heads 12 --batch 4 --seq 64 \
      --steps 6 --warmup 2 --threads 2
"""
import argparse
import json
import math
import os
import statistics
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=["gpt", "llama"], default="gpt",
                   help="gpt: GPT-2's layer; llama: RoPE, RMSNorm, SwiGLU, grouped-query attention, untied, no biases")
    p.add_argument("--groups", type=int, default=0, help="llama: key/value groups (0: heads, multi-head)")
    p.add_argument("--rotary-base", type=float, default=10000.0, help="llama: RoPE base theta")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--ffn", type=int, default=0, help="MLP hidden size (0: 4 * hidden; llama: the SwiGLU width F)")
    p.add_argument("--experts", type=int, default=0,
                   help="llama: a mixture of this many SwiGLU experts in every layer's MLP (0: dense)")
    p.add_argument("--topk", type=int, default=2, help="llama MoE: experts per token")
    p.add_argument("--expert-ffn", type=int, default=0, help="llama MoE: each expert's width (0: --ffn)")
    p.add_argument("--vocab", type=int, default=50257, help="vocabulary the model runs")
    p.add_argument("--device", default="cpu", help="cpu or cuda (the GPU benchmark's peer)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: forward and loss under torch.autocast('cpu', bfloat16) (oneDNN bf16 GEMMs), "
                        "fp32 parameters, gradients and optimizer")
    p.add_argument("--flops-vocab", type=int, default=50304,
                   help="V in the FLOP formula (Trident's padded vocabulary; Megatron pads to a multiple of 128)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--accum", type=int, default=1,
                   help="micro-batches of --batch sequences per step, their gradients accumulated (loss / accum "
                        "each) before one clipping and one AdamW step, as Megatron's global batch")
    p.add_argument("--steps", type=int, default=6, help="training steps in all, warm-up included")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the timing")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.1,
                   help="dropout on embeddings, attention probabilities and both residual branches (GPT-2/Megatron: 0.1)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--compile", action="store_true",
                   help="run the model through torch.compile (PyTorch 2; the first steps compile, so give "
                        "--warmup at least 2); the result says whether it compiled")
    p.add_argument("--json", default="", help="also write the JSON result to this file")
    a = p.parse_args(argv)
    if a.steps <= a.warmup:
        p.error("--steps must exceed --warmup")
    if a.hidden % a.heads:
        p.error("--hidden must be divisible by --heads")
    a.groups = a.groups or a.heads
    if a.heads % a.groups:
        p.error("--groups must divide --heads")
    if a.arch == "gpt" and a.groups != a.heads:
        p.error("--groups is for --arch llama")
    return a


def megatron_flops(batch, seq, layers, hidden, vocab):
    """Model FLOPs of one training step (forward + backward, no recomputation)."""
    s, h, l, V = float(seq), float(hidden), float(layers), float(vocab)
    return 72.0 * batch * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * h * l))


def llama_flops(batch, seq, layers, hidden, heads, groups, ffn, vocab):
    """Megatron's num_floating_point_operations for a SwiGLU, grouped-query layer (kv_channels = h / nh)."""
    s, h, l, V, F = float(seq), float(hidden), float(layers), float(vocab), float(ffn)
    return 12.0 * batch * s * l * h * h * ((1.0 + groups / heads + s / h) + F / h * 1.5 + V / (2.0 * l * h))


def openblas_info():
    """The OpenBLAS kernel set torch's GEMMs run on (OpenBLAS picks it at load time from the CPU;
    OPENBLAS_CORETYPE overrides it). Empty when torch does not use OpenBLAS."""
    import ctypes
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        lib.openblas_get_config.restype = ctypes.c_char_p
        return {"core": lib.openblas_get_corename().decode(), "config": lib.openblas_get_config().decode(),
                "coretype_env": os.environ.get("OPENBLAS_CORETYPE", "")}
    except (OSError, AttributeError):
        return {}


def main(argv=None):
    a = parse_args(argv)
    # Threads must be fixed before torch (and its OpenBLAS) load.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(a.threads)
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    # on a GPU, PyTorch's own fused attention (flash) when this torch has it: the fair peer
    sdpa = dev.type == "cuda" and hasattr(torch.nn.functional, "scaled_dot_product_attention")
    torch.set_flush_denormal(True)
    torch.manual_seed(a.seed)

    C, H, L, T = a.hidden, a.heads, a.layers, a.seq
    ffn = a.ffn or 4 * C

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(C, eps=1e-5)
            self.qkv = nn.Linear(C, 3 * C)
            self.proj = nn.Linear(C, C)
            self.ln2 = nn.LayerNorm(C, eps=1e-5)
            self.fc1 = nn.Linear(C, ffn)
            self.fc2 = nn.Linear(ffn, C)

        def attention(self, x):
            B = x.shape[0]
            q, k, v = self.qkv(x).split(C, dim=2)                    # (B, T, C) each
            q = q.view(B, T, H, C // H).transpose(1, 2)               # (B, H, T, hs)
            k = k.view(B, T, H, C // H).transpose(1, 2)
            v = v.view(B, T, H, C // H).transpose(1, 2)
            if sdpa:
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=a.dropout if self.training else 0.0,
                                                   is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
                return self.proj(y)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))  # (B, H, T, T)
            att = att.masked_fill(self.mask, float("-inf"))
            att = F.dropout(F.softmax(att, dim=-1), a.dropout, self.training)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
            return self.proj(y)

        def forward(self, x):
            x = x + F.dropout(self.attention(self.ln1(x)), a.dropout, self.training)
            mlp = self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))
            return x + F.dropout(mlp, a.dropout, self.training)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(a.vocab, C)
            self.wpe = nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.lnf = nn.LayerNorm(C, eps=1e-5)
            mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
            for b in self.blocks:
                b.register_buffer("mask", mask, persistent=False)
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif ".ln" in name or name.startswith("lnf"):
                    nn.init.ones_(p)
                elif name.endswith("proj.weight") or name.endswith("fc2.weight"):
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
                else:
                    nn.init.normal_(p, 0.0, 0.02)

        def forward(self, idx, targets):
            pos = torch.arange(T, device=idx.device)
            x = F.dropout(self.wte(idx) + self.wpe(pos), a.dropout, self.training)
            for b in self.blocks:
                x = b(x)
            logits = F.linear(self.lnf(x), self.wte.weight)           # tied LM head: (B, T, V)
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    G, hs = a.groups, C // H

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(C))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight

    # rotary tables: angle t * base^(-2i/d) on the pairs (i, i + d/2) of each head (rotate_half)
    inv_freq = 1.0 / (a.rotary_base ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs))
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    cos = torch.cat([ang, ang], dim=-1).cos().to(dev)
    sin = torch.cat([ang, ang], dim=-1).sin().to(dev)

    def rope(x):  # (B, heads, T, hs)
        x1, x2 = x[..., : hs // 2], x[..., hs // 2:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    E, K = a.experts, a.topk
    Fe = a.expert_ffn or ffn
    aux_terms = []

    class SwiGLU(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.gate = nn.Linear(C, width, bias=False)
            self.up = nn.Linear(C, width, bias=False)
            self.down = nn.Linear(width, C, bias=False)

        def forward(self, x):
            return self.down(F.silu(self.gate(x)) * self.up(x))

    class MoE(nn.Module):  # Mixtral's block: router, softmax, top-k renormalised, a loop over the experts
        def __init__(self):
            super().__init__()
            self.router = nn.Linear(C, E, bias=False)
            self.experts = nn.ModuleList(SwiGLU(Fe) for _ in range(E))

        def forward(self, x):
            shape = x.shape
            x = x.reshape(-1, C)
            probs = F.softmax(self.router(x), dim=-1, dtype=torch.float32)
            w, idx = torch.topk(probs, K, dim=-1)
            w = (w / w.sum(dim=-1, keepdim=True)).to(x.dtype)
            counts = torch.bincount(idx.reshape(-1), minlength=E).to(probs.dtype)
            aux_terms.append(E / (K * x.shape[0] ** 2) * (probs.sum(0) * counts).sum())
            out = torch.zeros_like(x)
            for e in range(E):
                tok, slot = (idx == e).nonzero(as_tuple=True)
                if tok.numel():
                    out = out.index_add(0, tok, self.experts[e](x.index_select(0, tok)) * w[tok, slot].unsqueeze(1))
            return out.reshape(shape)

    class LlamaBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = RMSNorm()
            self.q = nn.Linear(C, H * hs, bias=False)
            self.k = nn.Linear(C, G * hs, bias=False)
            self.v = nn.Linear(C, G * hs, bias=False)
            self.proj = nn.Linear(H * hs, C, bias=False)
            self.norm2 = RMSNorm()
            if E:
                self.moe = MoE()
            else:
                self.gate = nn.Linear(C, ffn, bias=False)
                self.up = nn.Linear(C, ffn, bias=False)
                self.down = nn.Linear(ffn, C, bias=False)

        def attention(self, x):
            B = x.shape[0]
            q = rope(self.q(x).view(B, T, H, hs).transpose(1, 2))
            k = rope(self.k(x).view(B, T, G, hs).transpose(1, 2))
            v = self.v(x).view(B, T, G, hs).transpose(1, 2)
            k = k.repeat_interleave(H // G, dim=1)  # query head h reads group h // (H/G)
            v = v.repeat_interleave(H // G, dim=1)
            if sdpa:
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=a.dropout if self.training else 0.0,
                                                   is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
                att = att.masked_fill(self.mask, float("-inf"))
                y = F.dropout(F.softmax(att, dim=-1), a.dropout, self.training) @ v
            return self.proj(y.transpose(1, 2).contiguous().view(B, T, H * hs))

        def forward(self, x):
            x = x + F.dropout(self.attention(self.norm1(x)), a.dropout, self.training)
            h2 = self.norm2(x)
            mlp = self.moe(h2) if E else self.down(F.silu(self.gate(h2)) * self.up(h2))
            return x + F.dropout(mlp, a.dropout, self.training)

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(a.vocab, C)
            self.blocks = nn.ModuleList(LlamaBlock() for _ in range(L))
            self.norm = RMSNorm()
            self.head = nn.Linear(C, a.vocab, bias=False)  # untied output layer
            mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
            for b in self.blocks:
                b.register_buffer("mask", mask, persistent=False)
            for name, p in self.named_parameters():
                if "norm" in name:
                    continue  # ones
                if name.endswith("proj.weight") or name.endswith("down.weight"):  # experts' down too
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
                else:
                    nn.init.normal_(p, 0.0, 0.02)

        def forward(self, idx, targets):
            x = F.dropout(self.embed(idx), a.dropout, self.training)
            for b in self.blocks:
                x = b(x)
            logits = self.head(self.norm(x))
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
            if aux_terms:
                loss = loss + 0.01 * sum(aux_terms)
                aux_terms.clear()
            return loss

    model = (GPT() if a.arch == "gpt" else Llama()).to(dev)
    step_model = model
    if a.compile:
        if not hasattr(torch, "compile"):
            sys.exit(f"torch_gpt: --compile needs PyTorch 2 (this is {torch.__version__})")
        step_model = torch.compile(model)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    n_params = sum(p.numel() for p in model.parameters())
    blas = openblas_info()
    g = torch.Generator().manual_seed(a.seed)
    M = a.accum
    data = torch.randint(0, a.vocab, (a.steps, M, a.batch, T + 1), generator=g).to(dev)

    times, losses = [], []
    for step in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for mb in range(M):
            idx, tgt = data[step, mb, :, :-1].contiguous(), data[step, mb, :, 1:].contiguous()
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
                loss = step_model(idx, tgt) / M
            loss.backward()
            loss_sum += float(loss)
        loss = torch.tensor(loss_sum)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        losses.append(float(loss))

    timed = times[a.warmup:]
    per_iter = statistics.median(timed)
    tokens = M * a.batch * T
    flops = M * (megatron_flops(a.batch, T, L, C, a.flops_vocab) if a.arch == "gpt"
                 else llama_flops(a.batch, T, L, C, H, G, K * Fe if E else ffn, a.flops_vocab))
    result = {
        "framework": "pytorch",
        "torch_version": torch.__version__,
        "threads": a.threads,
        "dtype": a.dtype,
        "device": a.device,
        "fused_attention": sdpa,
        "compiled": a.compile,
        "torch_num_threads": torch.get_num_threads(),
        "arch": a.arch, "groups": G,
        "layers": L, "hidden": C, "heads": H, "ffn": ffn, "experts": E, "topk": K if E else 0, "expert_ffn": Fe if E else 0, "dropout": a.dropout, "vocab": a.vocab, "flops_vocab": a.flops_vocab,
        "batch": a.batch, "accum": M, "seq": T, "parameters": n_params,
        "openblas": blas,
        "steps": a.steps, "warmup": a.warmup,
        "step_ms": [round(t * 1e3, 3) for t in times],
        "ms_per_iter": per_iter * 1e3,
        "tokens_per_s": tokens / per_iter,
        "flops_per_iter": flops,
        "tflops": flops / per_iter / 1e12,
        "losses": losses,
        "note": "median over the steps after warm-up; FLOPs by Megatron's formula with V = flops_vocab (padded)",
    }
    text = json.dumps(result)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
