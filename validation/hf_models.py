#!/usr/bin/env python3
"""Scores a Hugging Face model directory written by convert_checkpoint, independently of Trident.

A GPT-2 (GPT2LMHeadModel) and a Megatron-BERT (MegatronBertForPreTraining) written here in
PyTorch from the published architectures, keyed by Hugging Face's tensor names and layouts
(GPT-2's Conv1D weights [in, out], BERT's query/key/value), in float64. The weights are read from
model.safetensors by this file's own parser of the published format (8-byte little-endian
header length, JSON header, raw little-endian tensors); config.json gives the shapes. The names,
layouts and wiring are this file's own; the norms, GELU and attention are torch_reference.py's.

usage:
  hf_models.py gpt-eval  --model DIR --shard FILE --windows N --seq S [--stride s] [--transformers] [--device D]
      the mean next-token cross-entropy over the windows tokens[k*s : k*s + S + 1], k < N, of a
      token shard (s = S: disjoint; s < S: each later window scores only its last s targets), as
      `pretrain_gpt --eval.only` scores them; prints `eval tokens:`, `eval loss: <v>`,
      `eval perplexity:` and, with the directory's vocab.json, `eval bits per byte:`
  hf_models.py bert-eval --model DIR --samples DUMP.h5 [--transformers] [--device D]
      the masked-LM cross-entropy over every labelled position plus the sentence-order (NSP)
      cross-entropy over the samples that `pretrain_bert --eval.only --debug.dump_batches DUMP.h5`
      scored; prints `eval loss:`, `eval lm loss:`, `eval sop loss:`
  --transformers  load the directory with transformers' from_pretrained instead of this file's
                  models (exit 77 when transformers is not installed), in float32; --device cuda
                  runs it on a GPU (TF32 off)
Exit: 0, 2 on bad input, 77 when --transformers is asked for and missing.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np


class InputError(Exception):
    pass


def read_safetensors(path):
    """{name: float64 numpy array} of a safetensors file (F32, BF16, F16)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise InputError(f"{path}: too short")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise InputError(f"{path}: header length {n} beyond the file")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        buf = data[b:end]
        if e["dtype"] == "F32":
            a = np.frombuffer(buf, dtype="<f4").astype(np.float64)
        elif e["dtype"] == "F16":
            a = np.frombuffer(buf, dtype="<f2").astype(np.float64)
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            raise InputError(f"{path}: {name}: dtype {e['dtype']} not read here")
        out[name] = a.reshape(e["shape"])
    return out


def load_dir(model_dir):
    cfg_path = os.path.join(model_dir, "config.json")
    st = os.path.join(model_dir, "model.safetensors")
    if not os.path.exists(cfg_path) or not os.path.exists(st):
        raise InputError(f"{model_dir}: needs config.json and model.safetensors")
    with open(cfg_path) as f:
        cfg = json.load(f)
    return cfg, read_safetensors(st)


def _tr():
    """validation/torch_reference.py, the layer's math shared with the Trident references (imported
    when a model is scored: reading safetensors needs no torch)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import torch_reference
    return torch_reference


def attention(q, k, v, heads, key_mask=None, causal=False):
    """Scaled dot-product attention over heads; q, k, v [B, T, C]."""
    tr = _tr()
    D = q.shape[-1] // heads
    q, k, v = (tr.split_heads(t, heads, D) for t in (q, k, v))
    return tr.merge_heads(tr.attention(q, k, v, causal=causal, key_valid=key_mask))


def gpt2_logits(cfg, w, ids):
    """GPT2LMHeadModel's logits: h = wte[x] + wpe; per block h += attn(ln_1 h), h += mlp(ln_2 h);
    ln_f; logits = h wte^T. Conv1D: y = x W + b with W [in, out]."""
    tr = _tr()

    def p(name):
        for k in ("transformer." + name, name):
            if k in w:
                return w[k]
        raise InputError(f"no tensor {name}")

    eps = cfg.get("layer_norm_epsilon", 1e-5)
    H, L = cfg["n_head"], cfg["n_layer"]
    C = cfg["n_embd"]
    T = ids.shape[1]
    h = p("wte.weight")[ids] + p("wpe.weight")[:T][None]
    for i in range(L):
        b = f"h.{i}."
        a = tr.layer_norm(h, p(b + "ln_1.weight"), p(b + "ln_1.bias"), eps)
        qkv = a @ p(b + "attn.c_attn.weight") + p(b + "attn.c_attn.bias")
        q, k, v = qkv.split(C, -1)
        y = attention(q, k, v, H, causal=True)
        h = h + y @ p(b + "attn.c_proj.weight") + p(b + "attn.c_proj.bias")
        a = tr.layer_norm(h, p(b + "ln_2.weight"), p(b + "ln_2.bias"), eps)
        m = tr.gelu_tanh(a @ p(b + "mlp.c_fc.weight") + p(b + "mlp.c_fc.bias"))
        h = h + m @ p(b + "mlp.c_proj.weight") + p(b + "mlp.c_proj.bias")
    h = tr.layer_norm(h, p("ln_f.weight"), p("ln_f.bias"), eps)
    return h @ p("wte.weight").T


def megatron_bert_outputs(cfg, w, tok, typ, pad):
    """MegatronBertForPreTraining's (prediction logits, seq_relationship logits or None): no
    embedding LayerNorm; per layer x += attn(attention.ln x), x += mlp(ln x); encoder.ln; the
    LM transform (dense, GELU, LayerNorm), tied decoder plus cls.predictions.bias; pooler (tanh of
    a dense layer on position 0) and the 2-way head. nn.Linear: y = x W^T + b."""
    tr = _tr()
    eps = cfg.get("layer_norm_eps", 1e-12)
    H, L = cfg["num_attention_heads"], cfg["num_hidden_layers"]
    T = tok.shape[1]

    def lin(x, name):
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    def ln(x, name):
        return tr.layer_norm(x, w[name + ".weight"], w[name + ".bias"], eps)

    wte = w["bert.embeddings.word_embeddings.weight"]
    x = wte[tok] + w["bert.embeddings.position_embeddings.weight"][:T][None] + \
        w["bert.embeddings.token_type_embeddings.weight"][typ]
    valid = pad.bool()
    for i in range(L):
        b = f"bert.encoder.layer.{i}."
        a = ln(x, b + "attention.ln")
        y = attention(lin(a, b + "attention.self.query"), lin(a, b + "attention.self.key"),
                      lin(a, b + "attention.self.value"), H, key_mask=valid)
        x = x + lin(y, b + "attention.output.dense")
        a = ln(x, b + "ln")
        x = x + lin(tr.gelu_tanh(lin(a, b + "intermediate.dense")), b + "output.dense")
    x = ln(x, "bert.encoder.ln")
    h = ln(tr.gelu_tanh(lin(x, "cls.predictions.transform.dense")), "cls.predictions.transform.LayerNorm")
    logits = h @ wte.T + w["cls.predictions.bias"]
    sop = None
    if "cls.seq_relationship.weight" in w:
        import torch
        pooled = torch.tanh(lin(x[:, 0], "bert.pooler.dense"))
        sop = lin(pooled, "cls.seq_relationship")
    return logits, sop


def transformers_model(kind, model_dir, device):
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("hf_models.py: transformers is not installed here: skipped")
        sys.exit(77)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if kind == "gpt":
        from transformers import GPT2LMHeadModel as M
    else:
        import transformers
        with open(os.path.join(model_dir, "config.json")) as f:
            M = getattr(transformers, json.load(f)["architectures"][0])
    # float32 whatever the stored dtype (transformers 5 loads the stored dtype by default)
    m = M.from_pretrained(model_dir).float().to(device)
    m.eval()
    return m


def token_byte_lengths(vocab_json):
    """Bytes of each GPT-2 token: vocab.json spells a token's bytes through GPT-2's published
    byte-to-printable-character table (printable Latin-1 bytes stand for themselves, the other
    bytes for the code points 256, 257, ... in byte order)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    char_of, extra = {}, 0
    for b in range(256):
        if b in keep:
            char_of[b] = chr(b)
        else:
            char_of[b] = chr(256 + extra)
            extra += 1
    byte_of = {c: b for b, c in char_of.items()}
    with open(vocab_json, encoding="utf-8") as f:
        vocab = json.load(f)
    lengths = np.zeros(len(vocab), dtype=np.int64)
    for token, i in vocab.items():
        lengths[i] = len(bytes(byte_of[c] for c in token)) if all(c in byte_of for c in token) else 0
    return lengths, vocab.get("<|endoftext|>", -1)


def shard_windows(shard, windows, seq, stride):
    """The first (windows - 1) * stride + seq + 1 tokens of a token shard, and the windows' inputs x
    and targets y (-100 where an earlier window scored the target). Windows of S + 1 tokens every
    `stride` tokens; the first window scores its S targets, each later one its last `stride` (the
    rest were scored with a shorter context before), so every target 1 .. (N - 1) * stride + S is
    scored once, with the longest context the window allows."""
    import h5py
    if windows < 1 or seq < 1 or not 1 <= stride <= seq:
        raise InputError("--windows and --seq must be positive, --stride between 1 and --seq")
    last = (windows - 1) * stride + seq
    with h5py.File(shard, "r") as f:
        if f["tokens"].shape[0] < last + 1:
            raise InputError(f"{shard}: {f['tokens'].shape[0]} tokens, fewer than {last + 1}")
        t = f["tokens"][:last + 1].astype(np.int64)
    starts = [k * stride for k in range(windows)]
    x = np.stack([t[s:s + seq] for s in starts])
    y = np.stack([t[s + 1:s + seq + 1] for s in starts])
    y[1:, :seq - stride] = -100  # scored by an earlier window
    return t, x, y


def score_windows(logits_of, x, y, batch, shard, stride):
    """The summed cross-entropy of y under logits_of(x) in batches, with the lines every eval command
    prints (`eval tokens:`, `eval loss:`, `eval perplexity:`); returns (total, count)."""
    import torch
    total, count = 0.0, 0
    with torch.no_grad():
        for k in range(0, len(x), batch):
            logits = logits_of(torch.tensor(x[k:k + batch]))
            yb = torch.tensor(y[k:k + batch])
            total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1),
                                                       ignore_index=-100, reduction="sum").item()
            count += int((yb != -100).sum())
    loss = total / count
    print(f"scored {len(x)} windows of {x.shape[1]} tokens, stride {stride}, of {shard}")
    print(f"eval tokens: {count}")
    print("eval loss: %.12g" % loss)
    print("eval perplexity: %.12g" % math.exp(loss))
    return total, count


def gpt_eval(a):
    """shard_windows' windows scored by this file's GPT-2 (or transformers'); with the directory's
    vocab.json also bits per byte."""
    import torch
    stride = a.stride or a.seq
    t, x, y = shard_windows(a.shard, a.windows, a.seq, stride)
    last = len(t) - 1
    if a.transformers:
        m = transformers_model("gpt", a.model, a.device)

        def logits_of(xb):
            return m(input_ids=xb.to(a.device)).logits.double().cpu()
    else:
        cfg, raw = load_dir(a.model)
        w = {k: torch.tensor(v) for k, v in raw.items()}

        def logits_of(xb):
            return gpt2_logits(cfg, w, xb)
    total, count = score_windows(logits_of, x, y, a.batch, a.shard, stride)
    assert count == last, (count, last)
    vocab_json = os.path.join(a.model, "vocab.json")
    if os.path.exists(vocab_json):
        lengths, eod = token_byte_lengths(vocab_json)
        scored = t[1:last + 1]
        nbytes = int(lengths[scored[scored != eod]].sum())
        print("eval bits per byte: %.12g (%d bytes)" % (total / math.log(2) / nbytes, nbytes))
    return 0


def bert_eval(a):
    import h5py
    import torch
    with h5py.File(a.samples, "r") as f:
        rows = f["iter_0000000"][()].astype(np.int64)
    S = (rows.shape[1] - 1) // 4
    tok, typ, lab, pad, order = (torch.tensor(rows[:, :S]), torch.tensor(rows[:, S:2 * S]),
                                 torch.tensor(rows[:, 2 * S:3 * S]), torch.tensor(rows[:, 3 * S:4 * S]),
                                 torch.tensor(rows[:, 4 * S]))
    lm_sum, lm_n, sop_sum, has_sop = 0.0, 0, 0.0, False
    if a.transformers:
        m = transformers_model("bert", a.model, a.device)
    else:
        cfg, raw = load_dir(a.model)
        w = {k: torch.tensor(v) for k, v in raw.items()}
    with torch.no_grad():
        for k in range(0, rows.shape[0], a.batch):
            sl = slice(k, k + a.batch)
            if a.transformers:
                d = a.device
                o = m(input_ids=tok[sl].to(d), token_type_ids=typ[sl].to(d), attention_mask=pad[sl].to(d))
                if hasattr(o, "prediction_logits"):  # MegatronBertForPreTraining
                    logits, sop = o.prediction_logits.double().cpu(), o.seq_relationship_logits.double().cpu()
                else:  # MegatronBertForMaskedLM (no sentence-order head)
                    logits, sop = o.logits.double().cpu(), None
            else:
                logits, sop = megatron_bert_outputs(cfg, w, tok[sl], typ[sl], pad[sl])
            lb = lab[sl].reshape(-1)
            lm_sum += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), lb, ignore_index=-1,
                                                        reduction="sum").item()
            lm_n += int((lb != -1).sum())
            if sop is not None:
                has_sop = True
                sop_sum += torch.nn.functional.cross_entropy(sop, order[sl], reduction="sum").item()
    lm = lm_sum / max(lm_n, 1)
    sop = sop_sum / rows.shape[0] if has_sop else 0.0
    print(f"scored {rows.shape[0]} samples of {S} tokens ({lm_n} labelled positions) of {a.samples}")
    print("eval loss: %.12g" % (lm + sop))
    print("eval lm loss: %.12g" % lm)
    if has_sop:
        print("eval sop loss: %.12g" % sop)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gpt-eval")
    g.add_argument("--shard", required=True)
    g.add_argument("--windows", type=int, required=True)
    g.add_argument("--seq", type=int, required=True)
    g.add_argument("--stride", type=int, default=0, help="tokens between window starts (0: --seq, disjoint)")
    b = sub.add_parser("bert-eval")
    b.add_argument("--samples", required=True)
    for s in (g, b):
        s.add_argument("--model", required=True)
        s.add_argument("--transformers", action="store_true")
        s.add_argument("--device", default="cpu")
        s.add_argument("--batch", type=int, default=8)
    a = p.parse_args(argv)
    import torch
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    try:
        return gpt_eval(a) if a.cmd == "gpt-eval" else bert_eval(a)
    except (InputError, OSError, KeyError) as e:
        print("bad input:", e)
        return 2


if __name__ == "__main__":
    sys.exit(main())
