#!/usr/bin/env python3
"""Hugging Face format checks of convert_checkpoint (docs/DESIGN.md "Hugging Face formats").

usage: hf_checks.py CHECK --build BUILD --sample DIR --work DIR [--mpiexec M]
  gpt     a GPT trained here (fp32) exports to config.json, model.safetensors, vocab.json and
          merges.txt; the import of that export holds bitwise the same model tensors (and
          checksums); --eval.only scores the original at one rank and the import at tp=2 and
          at pp=2 alike (8 digits); validation/hf_models.py, an independent float64 GPT-2 keyed
          by Hugging Face's names reading the safetensors itself, gives that loss within 1e-6
          relative; strided evaluation (eval.stride) at 1 and 2 ranks gives the reference's tokens
          scored, loss, perplexity and bits per byte (bytes exact); scoring a JSON-lines file
          directly equals scoring the shard preprocess_data makes of it; a directory laid out as
          the Hub publishes GPT-2 (two shards and an index, bare names, buffers, the tied
          lm_head.weight stored) imports to the same checkpoint; a bf16 run at tp=2 exports as bf16
          and imports back to its own model values,
          bitwise
  bert    the same for BERT as MegatronBertForPreTraining, scored on the samples that
          pretrain_bert's evaluation mode dumps (masked-LM and sentence-order losses)
  errors  one clear error each, nothing written: an output that exists (without --overwrite,
          the files unchanged), another activation, untied output weights, a sequence longer
          than the position table, a truncated safetensors file, an extra tensor, a shape that
          differs from the config, a pickle-only directory, a T5 checkpoint, two processes; for the
          Llama family a k_proj of another group count, an active sliding window, yarn rope
          scaling, another activation, a missing shard, a Llama layer asked for as GPT-2, a shard
          size that is no size
  llama   directories of validation/hf_llama.py (an independent float64 Llama family keyed by
          Hugging Face's names, writing config.json and sharded safetensors itself): Llama 3
          (GQA, llama3 rope scaling, bf16 shards), Llama with every bias, tied embeddings and
          head_dim 24, Mistral (one key/value head, fp16). Each imports; --eval.only scores it as
          the reference does (1e-6) at one rank and at tp=2 or pp=2 (8 digits); the export writes
          the same tensors byte for byte at the written dtype, sharded, with the same config, and
          re-imports bitwise; greedy generation equals the reference's tokens; q/k rows in Meta's
          interleaved order score differently by far more than the tolerance (so a converter that
          permuted them would fail)
  qwen    the same for Qwen 2 (q/k/v biases) and Qwen 3 (q/k norms, head_dim 24, bf16)
  moe     the same for the mixtures of experts: Mixtral (4 experts, top-2, bf16 shards) at one rank and
          tp=2 with sequence parallelism; Qwen 3 MoE (q/k norms, head_dim 24, norm_topk_prob false,
          so Trident's router_pre_softmax; layer 0 dense of intermediate_size via mlp_only_layers) at
          one rank and dp=2 with expert parallelism 2; Qwen 3 MoE as released (norm_topk_prob true,
          top-3 of 8, decoder_sparse_step 2 over 4 layers, bf16) at one rank and pp=2. Also the
          imported deck's [moe] keys, greedy generation of each, the config's MoE keys and meaning
          on export (Qwen 3 MoE's dense layers may be spelled otherwise); each Qwen 3 MoE scored by
          the reference with norm_topk_prob flipped differs by far more than the tolerance
  transformers_gpt, transformers_bert, transformers_llama
          transformers' own models (GPT2LMHeadModel, MegatronBertForPreTraining,
          AutoModelForCausalLM on every case of llama, qwen and moe) score the exports as
          --eval.only scores the originals, within 1e-5 (float32); exit 77 with the reason where
          transformers or PyTorch is not installed
"""
import argparse
import hashlib
import json
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from testlib import run, single_error_failures  # noqa: E402

EVAL_REL = 1e-6  # independent float64 reference against Trident's fp32 evaluation
# another layout sums in another order: the 8 printed digits may differ in the last (measured:
# BERT 10.838454 at one rank, 10.838453 at tp=2)
LAYOUT_REL = 2e-7


class Ctx:
    def __init__(self, a):
        self.a = a
        self.apps = os.path.join(a.build, "apps")
        self.sample = a.sample
        self.conv = os.path.join(self.apps, "convert_checkpoint")
        self.gpt_vocab = [os.path.join(a.sample, "gpt2", "encoder.json"), os.path.join(a.sample, "gpt2", "vocab.bpe")]

    def path(self, *p):
        return os.path.join(self.a.work, *p)

    def app(self, name, np_=1):
        exe = os.path.join(self.apps, name)
        return ([self.a.mpiexec, "-n", str(np_), exe] if np_ > 1 else [exe])

    def train_gpt(self, name, iters, extra=(), np_=1):
        ck = self.path(name)
        run(self.app("pretrain_gpt", np_) + ["--deck", os.path.join(ROOT, "inputs", "gpt_tiny_ci.ini"), "--data.train_shards",
                                        os.path.join(self.sample, "kjv_gpt2_*.h5"), "--train.iters", str(iters),
                                        "--eval.interval", "0", "--checkpoint.save", ck] + list(extra))
        return ck

    def train_masked(self, app, deck, name, iters, extra=()):
        ck = self.path(name)
        shards = "kjv_t5_*.h5" if app == "pretrain_t5" else "kjv_bert_*.h5"
        run(self.app(app) + ["--deck", os.path.join(ROOT, "inputs", deck), "--data.train_shards",
                             os.path.join(self.sample, shards), "--data.vocab_file",
                             os.path.join(self.sample, "bert", "vocab.txt"), "--train.iters", str(iters),
                             "--eval.interval", "0", "--checkpoint.save", ck] + list(extra))
        return ck

    def export(self, ck, out, extra=()):
        run([self.conv, "--to", "hf", "--input", ck, "--output", out] + list(extra))
        return out

    def import_(self, hf, out, extra=()):
        run([self.conv, "--to", "trident", "--input", hf, "--output", out] + list(extra))
        return out


def latest_file(ck):
    it = int(open(os.path.join(ck, "latest")).read())
    return os.path.join(ck, "iter_%07d" % it, "checkpoint.h5")


def model_tensors(ck):
    """{name: (sha256 of the bytes, checksum attribute)} of a checkpoint's model/ datasets."""
    import h5py
    out = {}
    with h5py.File(latest_file(ck), "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = (hashlib.sha256(obj[()].tobytes()).hexdigest(), obj.attrs["checksum"])
        f["model"].visititems(visit)
    return out


def same_model(what, a, b):
    ta, tb = model_tensors(a), model_tensors(b)
    assert sorted(ta) == sorted(tb), f"{what}: tensors {sorted(set(ta) ^ set(tb))} differ in presence"
    bad = [n for n in ta if ta[n] != tb[n]]
    assert not bad, f"{what}: tensors differ: {bad[:5]}"
    print(f"{what}: {len(ta)} model tensors bitwise identical (bytes and checksums)")


def eval_loss(out):
    lines = [l for l in out.splitlines() if l.startswith("eval loss:")]
    assert lines, out[-2000:]
    return lines[0].split(":", 1)[1].strip()


def reference(args, expect_rc=0):
    rc, out, _ = run([sys.executable, os.path.join(ROOT, "validation", "hf_models.py")] + args, expect_ok=False)
    if rc not in (expect_rc, 77):
        print(out)
        raise SystemExit(f"hf_models.py exited {rc}")
    return rc, out


def within(what, ours, ref, tol):
    rel = abs(float(ours) - ref) / abs(ref)
    print(f"{what}: Trident {ours}, reference {ref:.10g}, relative difference {rel:.2e} (tolerance {tol:g})")
    assert rel <= tol, f"{what}: {rel:.2e} > {tol:g}"


def check_gpt(c):
    shutil.rmtree(c.a.work, ignore_errors=True)
    os.makedirs(c.a.work)
    ck = c.train_gpt("ck", 40, ["--model.hidden_dropout", "0.1", "--model.attention_dropout", "0.1"])
    hf = c.export(ck, c.path("hf"), ["--vocab-file", c.gpt_vocab[0], "--merge-file", c.gpt_vocab[1]])
    files = sorted(os.listdir(hf))
    assert files == ["config.json", "merges.txt", "model.safetensors", "tokenizer_config.json", "vocab.json"], files
    cfg = json.load(open(os.path.join(hf, "config.json")))
    assert (cfg["model_type"], cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["vocab_size"], cfg["n_positions"]) == \
        ("gpt2", 2, 64, 4, 50257, 64), cfg
    assert open(os.path.join(hf, "vocab.json"), "rb").read() == open(c.gpt_vocab[0], "rb").read()
    with open(os.path.join(hf, "model.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    assert n % 8 == 0 and header["transformer.h.0.attn.c_attn.weight"]["shape"] == [64, 192], header
    assert "lm_head.weight" not in header and header["transformer.wte.weight"]["shape"] == [50257, 64]
    print(f"export: {files}; {len(header) - 1} tensors, c_attn [64, 192] (Conv1D [in, out]), vocabulary 50257")
    imp = c.import_(hf, c.path("imported"))
    same_model("export -> import", ck, imp)

    shard = os.path.join(c.sample, "kjv_gpt2_00001.h5")
    windows, seq = 16, 32

    def evaluate(load, np_, extra=()):
        _, out, _ = run(c.app("pretrain_gpt", np_) + [
            "--deck", os.path.join(ROOT, "inputs", "gpt_tiny_ci.ini"), "--checkpoint.load", load, "--eval.only",
            "true", "--eval.shard", shard, "--eval.windows", str(windows), "--train.micro_batch_size", "4"]
            + list(extra))
        return eval_loss(out)

    original = evaluate(ck, 1)
    tp2 = evaluate(imp, 2, ["--parallel.tp", "2"])
    # with the deck the import wrote (seq_length: its position table, so set to the windows' 32)
    pp2 = evaluate(imp, 2, ["--parallel.pp", "2", "--deck", os.path.join(imp, "model.ini"),
                            "--model.seq_length", str(seq)])
    print(f"--eval.only: original at 1 rank {original}, import at tp=2 {tp2}, at pp=2 {pp2}")
    within("  the import at tp=2", tp2, float(original), LAYOUT_REL)
    within("  the import at pp=2", pp2, float(original), LAYOUT_REL)
    _, out = reference(["gpt-eval", "--model", hf, "--shard", shard, "--windows", str(windows), "--seq", str(seq)])
    within("independent GPT-2 (Hugging Face names, float64) vs --eval.only", original, float(eval_loss(out)), EVAL_REL)

    # strided evaluation, tokens, perplexity and bits per byte against the independent reference;
    # at dp=2 with a short last block (15 windows, micro-batch 4)
    tokenizer = ["--data.vocab_file", c.gpt_vocab[0], "--data.merges_file", c.gpt_vocab[1]]
    strided = {}
    for np_, name in ((1, "1 rank"), (2, "dp=2")):
        _, out, _ = run(c.app("pretrain_gpt", np_) + [
            "--deck", os.path.join(ROOT, "inputs", "gpt_tiny_ci.ini"), "--checkpoint.load", ck, "--eval.only", "true",
            "--eval.shard", shard, "--eval.windows", "15", "--eval.stride", "8", "--train.micro_batch_size", "4"]
            + tokenizer)
        strided[name] = {k: v for k, v in (l.split(":", 1) for l in out.splitlines() if l.startswith("eval "))}
    _, out = reference(["gpt-eval", "--model", hf, "--shard", shard, "--windows", "15", "--seq", str(seq),
                        "--stride", "8"])
    ref = {k: v for k, v in (l.split(":", 1) for l in out.splitlines() if l.startswith("eval "))}
    print("strided evaluation (15 windows of 32, stride 8):", {k: v.strip() for k, v in strided["1 rank"].items()})
    for name, got in strided.items():
        assert got["eval tokens"].strip() == ref["eval tokens"].strip() == str(32 + 14 * 8), (got, ref)
        within(f"  {name}: strided loss vs the reference", got["eval loss"], float(ref["eval loss"]), EVAL_REL)
        within(f"  {name}: perplexity", got["eval perplexity"], float(ref["eval perplexity"]), 10 * EVAL_REL)
        bpb, nbytes = got["eval bits per byte"].split()[0], got["eval bits per byte"].split("(")[1]
        assert nbytes == ref["eval bits per byte"].split("(")[1], (got, ref)
        within(f"  {name}: bits per byte ({nbytes.split()[0]} bytes)", bpb, float(ref["eval bits per byte"].split()[0]),
               EVAL_REL)
    # evaluation straight from JSON lines equals that of the shard preprocess_data makes of them
    jsonl = c.path("three_books.jsonl")
    with open(os.path.join(c.sample, "kjv.jsonl")) as f, open(jsonl, "w") as g:
        g.writelines(f.readlines()[:3])
    run(c.app("preprocess_data") + ["--input", jsonl, "--output-prefix", c.path("three_books"), "--tokenizer-type",
                                    "GPT2BPETokenizer", "--vocab-file", c.gpt_vocab[0], "--merge-file", c.gpt_vocab[1],
                                    "--append-eod"])
    outs = []
    for src in (jsonl, c.path("three_books_00000.h5")):
        _, out, _ = run(c.app("pretrain_gpt") + [
            "--deck", os.path.join(ROOT, "inputs", "gpt_tiny_ci.ini"), "--checkpoint.load", ck, "--eval.only", "true",
            "--eval.shard", src, "--eval.windows", "40", "--eval.stride", "16"] + tokenizer)
        outs.append([l for l in out.splitlines() if l.startswith("eval ")])
    print("JSON lines evaluated directly:", outs[0])
    assert outs[0] == outs[1], outs

    # a directory as the Hub publishes them: two shards and an index, names without
    # "transformer.", the attention-mask buffers, the tied lm_head.weight stored
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "validation"))
    import hf_models
    w = {k: v.astype(np.float32) for k, v in hf_models.read_safetensors(os.path.join(hf, "model.safetensors")).items()}
    bare = {k[len("transformer."):]: v for k, v in w.items()}
    bare["lm_head.weight"] = bare["wte.weight"]
    for i in range(2):
        bare[f"h.{i}.attn.bias"] = np.tril(np.ones((64, 64), np.float32))[None, None]
    names = sorted(bare)
    hub = c.path("hub")
    os.makedirs(hub)
    shutil.copy(os.path.join(hf, "config.json"), hub)
    index = {}
    for part, chosen in enumerate((names[:len(names) // 2], names[len(names) // 2:])):
        f = f"model-0000{part + 1}-of-00002.safetensors"
        write_safetensors(os.path.join(hub, f), {k: bare[k] for k in chosen})
        index.update({k: f for k in chosen})
    json.dump({"metadata": {}, "weight_map": index}, open(os.path.join(hub, "model.safetensors.index.json"), "w"))
    same_model("Hub-style directory (2 shards, bare names, buffers, stored lm_head) -> import", ck,
               c.import_(hub, c.path("imported_hub")))

    # a bf16 run at tp=2 (any layout exports: the checkpoint is global)
    bf = c.train_gpt("ck_bf16", 3, ["--precision.dtype", "bf16", "--parallel.tp", "2"], np_=2)
    hf16 = c.export(bf, c.path("hf_bf16"), ["--dtype", "bf16", "--vocab-file", c.gpt_vocab[0], "--merge-file",
                                             c.gpt_vocab[1]])
    assert json.load(open(os.path.join(hf16, "config.json")))["torch_dtype"] == "bfloat16"
    same_model("bf16 run -> bf16 export -> import", bf, c.import_(hf16, c.path("imported_bf16")))


def check_bert(c):
    shutil.rmtree(c.a.work, ignore_errors=True)
    os.makedirs(c.a.work)
    vocab = os.path.join(c.sample, "bert", "vocab.txt")
    ck = c.train_masked("pretrain_bert", "bert_tiny_ci.ini", "ck", 5)
    hf = c.export(ck, c.path("hf"))  # the vocabulary: the deck's data.vocab_file
    cfg = json.load(open(os.path.join(hf, "config.json")))
    assert cfg["model_type"] == "megatron-bert" and cfg["architectures"] == ["MegatronBertForPreTraining"], cfg
    assert open(os.path.join(hf, "vocab.txt"), "rb").read() == open(vocab, "rb").read()
    imp = c.import_(hf, c.path("imported"))
    same_model("export -> import", ck, imp)
    shard = os.path.join(c.sample, "kjv_bert_00001.h5")
    dump = c.path("eval_samples.h5")

    def evaluate(load, np_, extra=()):
        _, out, _ = run(c.app("pretrain_bert", np_) + [
            "--deck", os.path.join(ROOT, "inputs", "bert_tiny_ci.ini"), "--data.vocab_file", vocab,
            "--checkpoint.load", load, "--eval.only", "true", "--eval.shard", shard, "--eval.windows", "24"]
            + list(extra))
        return out

    out = evaluate(ck, 1, ["--debug.dump_batches", dump])
    original, lm = eval_loss(out), [l for l in out.splitlines() if l.startswith("eval lm loss:")][0].split(":")[1]
    other = eval_loss(evaluate(imp, 2, ["--parallel.tp", "2"]))
    print(f"--eval.only: original at 1 rank {original}, import at tp=2 {other}")
    within("  the import at tp=2", other, float(original), LAYOUT_REL)
    _, ref = reference(["bert-eval", "--model", hf, "--samples", dump])
    within("independent Megatron-BERT (Hugging Face names, float64) vs --eval.only", original,
           float(eval_loss(ref)), EVAL_REL)
    within("  its masked-LM part", lm.strip(),
           float([l for l in ref.splitlines() if l.startswith("eval lm loss:")][0].split(":")[1]), EVAL_REL)
    # without the sentence-order head: MegatronBertForMaskedLM, the masked-LM loss alone
    ck1 = c.train_masked("pretrain_bert", "bert_tiny_ci.ini", "ck_no_head", 3, ["--bert.binary_head", "false"])
    hf1 = c.export(ck1, c.path("hf_no_head"))
    assert json.load(open(os.path.join(hf1, "config.json")))["architectures"] == ["MegatronBertForMaskedLM"]
    same_model("no binary head: export -> import", ck1, c.import_(hf1, c.path("imported_no_head")))
    dump1 = c.path("eval_samples_no_head.h5")
    out1 = evaluate(ck1, 1, ["--debug.dump_batches", dump1, "--bert.binary_head", "false"])
    _, ref1 = reference(["bert-eval", "--model", hf1, "--samples", dump1])
    assert "eval sop loss" not in ref1, ref1
    within("no binary head: reference vs --eval.only", eval_loss(out1), float(eval_loss(ref1)), EVAL_REL)


def write_safetensors(path, tensors, pad=True):
    """tensors: {name: float32 numpy array}; the published layout, written independently."""
    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        b = tensors[name].astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def check_errors(c):
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "validation"))
    import hf_models
    shutil.rmtree(c.a.work, ignore_errors=True)
    os.makedirs(c.a.work)
    ck = c.train_gpt("ck", 1)
    tok = ["--vocab-file", c.gpt_vocab[0], "--merge-file", c.gpt_vocab[1]]
    hf = c.export(ck, c.path("hf"), tok)
    before = {f: hashlib.sha256(open(os.path.join(hf, f), "rb").read()).hexdigest() for f in os.listdir(hf)}
    cfg = json.load(open(os.path.join(hf, "config.json")))
    weights = {k: v.astype(np.float32) for k, v in hf_models.read_safetensors(os.path.join(hf, "model.safetensors")).items()}

    def variant(name, config=None, tensors=None, files=None):
        d = c.path(name)
        os.makedirs(d)
        json.dump(config if config is not None else cfg, open(os.path.join(d, "config.json"), "w"))
        if tensors is not None:
            write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        for f, data in (files or {}).items():
            open(os.path.join(d, f), "wb").write(data)
        return d

    gelu = variant("gelu", dict(cfg, activation_function="gelu"), weights)
    untied = variant("untied", cfg, dict(weights, **{"lm_head.weight": weights["transformer.wte.weight"] * 2}))
    extra = variant("extra", cfg, dict(weights, **{"transformer.h.0.attn.rotary": np.zeros(4, np.float32)}))
    shape = variant("shape", dict(cfg, n_inner=128), weights)
    pickle = variant("pickle", cfg, None, {"pytorch_model.bin": b"\x80\x02"})
    cut = variant("truncated", cfg, None,
                  {"model.safetensors": open(os.path.join(hf, "model.safetensors"), "rb").read()[:100000]})
    t5 = c.train_masked("pretrain_t5", "t5_tiny_ci.ini", "t5_ck", 1)
    conv = [c.conv]
    imp = conv + ["--to", "trident", "--output", c.path("out")]
    # the Llama family: a directory of validation/hf_llama.py with one thing changed each
    lsrc = c.path("llama_src")
    hf_llama(["write", "--family", "llama", "--out", lsrc, "--seed", "3", "--shard-size", "60000"])
    lcfg = json.load(open(os.path.join(lsrc, "config.json")))

    def llama_variant(name, **changes):
        d = c.path(name)
        shutil.copytree(lsrc, d)
        json.dump(dict(lcfg, **changes), open(os.path.join(d, "config.json"), "w"))
        return d

    kv = llama_variant("llama_kv", num_key_value_heads=4)
    window = llama_variant("mistral_window", model_type="mistral", architectures=["MistralForCausalLM"],
                           sliding_window=16)
    yarn = llama_variant("llama_yarn", rope_scaling={"rope_type": "yarn", "factor": 4.0})
    silu = llama_variant("llama_gelu", hidden_act="gelu")
    lost = llama_variant("llama_lost_shard")
    os.remove(os.path.join(lost, "model-00002-of-%05d.safetensors" % len(
        set(json.load(open(os.path.join(lsrc, "model.safetensors.index.json")))["weight_map"].values()))))
    limp = c.import_(lsrc, c.path("llama_ck"))
    bad = single_error_failures([
        ("export over an existing export", conv + ["--to", "hf", "--input", ck, "--output", hf] + tok, "exists"),
        ("import into an existing checkpoint", conv + ["--to", "trident", "--input", hf, "--output", ck], "exists"),
        ("another activation (gelu)", imp + ["--input", gelu], "activation_function"),
        ("untied output weights", imp + ["--input", untied], "untied"),
        ("sequence longer than the positions", imp + ["--input", hf, "--seq-length", "65"], "position table"),
        ("truncated safetensors", imp + ["--input", cut], "truncated/model.safetensors"),
        ("a tensor with no place", imp + ["--input", extra], "transformer.h.0.attn.rotary"),
        ("shape differs from the config", imp + ["--input", shape], "shape"),
        ("a pickle only", imp + ["--input", pickle], "pytorch_model.bin"),
        ("a T5 checkpoint", conv + ["--to", "hf", "--input", t5, "--output", c.path("t5_hf")], "t5"),
        ("an unknown --dtype", conv + ["--to", "hf", "--input", ck, "--output", c.path("x"),
                                                        "--dtype", "int8"] + tok, "dtype"),
        ("two processes", [c.a.mpiexec, "-n", "2"] + conv + ["--to", "hf", "--input", ck, "--output",
                                                            c.path("np2")] + tok, "one process"),
        ("Llama: k_proj of another group count", imp + ["--input", kv], "k_proj.weight: shape"),
        ("Mistral with a sliding window", imp + ["--input", window], "sliding-window"),
        ("Llama: yarn rope scaling", imp + ["--input", yarn], "yarn"),
        ("Llama: another activation", imp + ["--input", silu], "hidden_act"),
        ("Llama: a shard missing", imp + ["--input", lost], "model-00002-of-"),
        ("a Llama layer as GPT-2", conv + ["--to", "hf", "--input", limp, "--output", c.path("as_gpt2"),
                                           "--hf-architecture", "gpt2"], "cannot be written as gpt2"),
        ("a shard size that is no size", conv + ["--to", "hf", "--input", limp, "--output", c.path("as_gpt2"),
                                                 "--max-shard-size", "5 apples"], "max-shard-size"),
    ])
    after = {f: hashlib.sha256(open(os.path.join(hf, f), "rb").read()).hexdigest() for f in os.listdir(hf)}
    assert before == after, "a refused export changed the existing one"
    for d in ("out", "t5_hf", "x", "np2", "as_gpt2"):
        assert not os.path.exists(c.path(d, "latest")) and not os.path.exists(c.path(d, "model.safetensors")), d
    assert not bad, bad
    print("errors: each refused with one error line; nothing written, the existing export unchanged")


def hf_llama(args, expect_ok=True):
    """validation/hf_llama.py (the independent float64 Llama family keyed by Hugging Face's names)."""
    rc, out, _ = run([sys.executable, os.path.join(ROOT, "validation", "hf_llama.py")] + args, expect_ok=False)
    if rc not in (0, 77) and expect_ok:
        print(out)
        raise SystemExit(f"hf_llama.py {args[0]} exited {rc}")
    return rc, out


def hf_dir_tensors(d):
    """{name: (dtype, shape, raw bytes)} of a Hugging Face directory (one file, or the index's shards)."""
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else ["model.safetensors"]
    out = {}
    for f in files:
        with open(os.path.join(d, f), "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
            data = fh.read()
        for name, e in header.items():
            if name != "__metadata__":
                b, end = e["data_offsets"]
                out[name] = (e["dtype"], e["shape"], data[b:end])
    return out, files


# The Llama-family cases: (name, family, hf_llama.py write options, layouts evaluated beside one rank).
# Weights at init-std 0.2, so that the model is far from uniform and every tensor counts.
LLAMA_CASES = {
    "llama": [
        ("llama 3 (GQA, llama3 rope scaling, bf16 shards)", "llama",
         ["--rope-scaling", "llama3:8,1,4,32", "--rope-theta", "500000", "--dtype", "bf16", "--shard-size", "60000"],
         ("tp2", "pp2")),
        ("llama with every bias, tied embeddings, head_dim 24", "llama",
         ["--attention-bias", "--mlp-bias", "--tie", "--head-dim", "24"], ("tp2",)),
        ("mistral (no biases, one key/value head, fp16)", "mistral", ["--dtype", "f16", "--kv-heads", "1"], ("pp2",)),
    ],
    "qwen": [
        ("qwen2 (q/k/v biases)", "qwen2", ["--shard-size", "100000"], ("tp2", "pp2")),
        ("qwen3 (q/k norms, head_dim 24, bf16)", "qwen3", ["--head-dim", "24", "--dtype", "bf16"], ("tp2", "pp2")),
    ],
    # mixtures of experts (MoE at tp > 1 needs sequence parallelism; ep 2 at dp 2)
    "moe": [
        ("mixtral (4 experts of width 48, top-2 renormalised, bf16 shards)", "mixtral",
         ["--experts", "4", "--topk", "2", "--expert-ffn", "48", "--dtype", "bf16", "--shard-size", "60000"],
         ("tp2sp",)),
        ("qwen3_moe (q/k norms, head_dim 24, 4 experts top-2 without renormalisation, layer 0 dense)", "qwen3_moe",
         ["--experts", "4", "--topk", "2", "--expert-ffn", "48", "--no-norm-topk-prob", "--mlp-only-layers", "0",
          "--head-dim", "24", "--shard-size", "100000"], ("dp2ep2",)),
        ("qwen3_moe as released (top-3 of 8 experts renormalised, decoder_sparse_step 2 of 4 layers, bf16)",
         "qwen3_moe", ["--layers", "4", "--experts", "8", "--topk", "3", "--expert-ffn", "32", "--decoder-sparse-step",
                       "2", "--dtype", "bf16"], ("pp2",)),
    ],
}
# the config.json keys an export must give back, beyond the dense ones
MOE_KEYS = {"mixtral": ["num_local_experts", "num_experts_per_tok", "sliding_window"],
            "qwen3_moe": ["num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "head_dim",
                          "use_sliding_window"]}


def hf_spec(cfg):
    """What validation/hf_llama.py reads from a config.json (its Spec's fields): the model it means."""
    if os.path.join(ROOT, "validation") not in sys.path:
        sys.path.insert(0, os.path.join(ROOT, "validation"))
    import hf_llama
    return vars(hf_llama.Spec(cfg))


def moe_deck(imp):
    """The [moe] section of an import's model.ini, as {key: value string}."""
    import configparser
    ini = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    ini.read(os.path.join(imp, "model.ini"))
    return dict(ini["moe"]) if ini.has_section("moe") else {}


def check_moe_deck(imp, src):
    """The import's deck asks for the mixture the config.json describes (docs/DESIGN.md "Mixture of experts")."""
    spec, deck = hf_spec(json.load(open(os.path.join(src, "config.json")))), moe_deck(imp)
    truth = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}
    freq = deck.get("layer_freq", "1").strip()
    if freq.startswith("["):
        sparse = tuple(i for i, v in enumerate(freq.strip("[]").split(",")) if int(v) == 1)
    else:
        sparse = tuple(i for i in range(spec["layers"]) if i % int(freq) == 0)
    got = (int(deck.get("num_experts", 0)), int(deck.get("router_topk", 2)), int(deck.get("ffn_hidden_size", 0)),
           truth[deck.get("router_pre_softmax", "false").lower()], deck.get("router_score_function", "softmax"),
           float(deck.get("expert_capacity_factor", 0)), int(deck.get("shared_expert_intermediate_size", 0)), sparse)
    want = (spec["experts"], spec["topk"], spec["expert_ffn"], not spec["norm_topk"], "softmax", 0.0, 0,
            spec["moe_layers"])
    print(f"  model.ini [moe]: {deck}")
    assert got == want, f"the imported deck's [moe] (experts, topk, width, pre-softmax, score, capacity, " \
                        f"shared, sparse layers) {got}, the config's {want}"


LLAMA_WINDOWS, LLAMA_SEQ = 12, 32  # the Llama-family cases' evaluation: windows of the sample's second shard


def llama_eval(c, imp, np_, extra=()):
    """--eval.only of an imported Llama-family directory on the sample's second shard: the loss's text."""
    _, out, _ = run(c.app("pretrain_gpt", np_) + [
        "--deck", os.path.join(imp, "model.ini"), "--checkpoint.load", imp, "--eval.only", "true",
        "--eval.shard", os.path.join(c.sample, "kjv_gpt2_00001.h5"), "--eval.windows", str(LLAMA_WINDOWS),
        "--model.seq_length", str(LLAMA_SEQ), "--train.micro_batch_size", "4", "--train.global_batch_size", "4",
        "--data.train_shards", os.path.join(c.sample, "kjv_gpt2_*.h5")] + list(extra))
    return eval_loss(out)


def llama_export(c, imp, out, family, opts):
    """The export of an import at the dtype hf_llama.py wrote (opts): (dtype, directory)."""
    dt = {"bf16": "bf16", "f16": "fp16"}.get(opts[opts.index("--dtype") + 1] if "--dtype" in opts else "", "fp32")
    # a Llama-family deck exports as llama, qwen2 or qwen3 by its keys; Mistral is asked for by name
    arch = ["--hf-architecture", family] if family == "mistral" else []
    return dt, c.export(imp, out, ["--dtype", dt, "--max-shard-size", "50000"] + arch)


def check_llama_family(c, cases, moe=False):
    """Hugging Face directories written by validation/hf_llama.py import into Trident, which scores them as
    the reference does (1e-6) at one rank and at tp=2 / pp=2 (MoE: also tp=2 with sequence parallelism
    and dp=2 with ep=2); export writes back the same tensors (names, shapes, bytes at the written dtype) and
    config, and re-imports bitwise; greedy generation follows the reference token for token (the first
    case; MoE: each); q/k rows in Meta's interleaved order would be detected (not MoE); MoE: the
    imported deck's [moe] keys, and Qwen 3 MoE's norm_topk_prob flipped would be detected."""
    shutil.rmtree(c.a.work, ignore_errors=True)
    os.makedirs(c.a.work)
    shard = os.path.join(c.sample, "kjv_gpt2_00001.h5")
    windows, seq = LLAMA_WINDOWS, LLAMA_SEQ

    def evaluate(imp, np_, extra=()):
        return llama_eval(c, imp, np_, extra)

    layouts = {"tp2": ["--parallel.tp", "2"], "pp2": ["--parallel.pp", "2"],
               "tp2sp": ["--parallel.tp", "2", "--parallel.sequence_parallel", "true"],
               "dp2ep2": ["--parallel.ep", "2", "--train.micro_batch_size", "2"]}
    for k, (what, family, opts, lays) in enumerate(cases):
        print(f"== {what}")
        src = c.path(f"hf_{k}")
        hf_llama(["write", "--family", family, "--out", src, "--seed", str(11 + k), "--init-std", "0.2"] + opts)
        imp = c.import_(src, c.path(f"imported_{k}"))
        if moe:
            check_moe_deck(imp, src)
        one = evaluate(imp, 1)
        _, out = hf_llama(["eval", "--model", src, "--shard", shard, "--windows", str(windows), "--seq", str(seq)])
        ref = float(eval_loss(out))
        within("  independent float64 reference vs --eval.only", one, ref, EVAL_REL)
        for lay in lays:
            within(f"  the import at {lay}", evaluate(imp, 2, layouts[lay]), float(one), LAYOUT_REL)
        # export at the written dtype: the same tensors and bytes, the same config; and back, bitwise
        dt, exp = llama_export(c, imp, c.path(f"export_{k}"), family, opts)
        (a, _), (b, files) = hf_dir_tensors(src), hf_dir_tensors(exp)
        assert sorted(a) == sorted(b), f"tensors differ in presence: {sorted(set(a) ^ set(b))}"
        bad = [n for n in a if a[n] != b[n]]
        assert not bad, f"exported tensors differ from the imported directory's: {bad[:4]}"
        ca, cb = json.load(open(os.path.join(src, "config.json"))), json.load(open(os.path.join(exp, "config.json")))
        keys = ["model_type", "architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta", "rope_scaling",
                "tie_word_embeddings", "vocab_size", "max_position_embeddings", "attention_bias", "mlp_bias"]
        keys += MOE_KEYS.get(family, [])
        diff = {key: (ca.get(key), cb.get(key)) for key in keys if ca.get(key) != cb.get(key)}
        assert not diff, f"config.json differs: {diff}"
        assert ca.get("head_dim", ca["hidden_size"] // ca["num_attention_heads"]) == \
            cb.get("head_dim", cb["hidden_size"] // cb["num_attention_heads"])
        # and the same model by the reference's reading (Qwen 3 MoE's dense layers: decoder_sparse_step and
        # mlp_only_layers may be spelled otherwise)
        sa, sb = hf_spec(ca), hf_spec(cb)
        assert sa == sb, f"config.json means another model: {({k: (sa[k], sb[k]) for k in sa if sa[k] != sb[k]})}"
        print(f"  export ({dt}, {len(files)} shards): {len(b)} tensors byte for byte the imported directory's; "
              f"config.json equal on {len(keys)} keys and in meaning")
        same_model("  export -> import", imp, c.import_(exp, c.path(f"reimported_{k}")))
        if k == 0 or moe:
            # greedy generation from the import: the reference's tokens
            enc = json.load(open(c.gpt_vocab[0]))
            prompt = [enc[t] for t in ("In", "\u0120the", "\u0120beginning", "\u0120God")]
            _, out, _ = run(c.app("generate_gpt") + ["--checkpoint", imp, "--vocab-file", c.gpt_vocab[0],
                                                     "--merge-file", c.gpt_vocab[1], "--prompt",
                                                     "In the beginning God", "--max-new-tokens", "12", "--greedy",
                                                     "--print-ids", "--ignore-eod"])
            ours = [l.split(":", 1)[1].split() for l in out.splitlines() if l.startswith("ids[1]:")][0]
            _, out = hf_llama(["generate", "--model", src, "--prompt", ",".join(map(str, prompt)), "--tokens", "12"])
            theirs = [l.split(":", 1)[1].split() for l in out.splitlines() if l.startswith("tokens:")][0]
            print(f"  greedy generation after {prompt}: Trident {ours}, reference {theirs}")
            assert ours == theirs, "greedy generation differs from the reference"
        if k == 0 and not moe:
            # Meta's interleaved q/k rows (what a converter that forgot, or doubled, the rotate-half
            # permutation would read): the import scores them, but not as the reference scores the
            # model, by far more than the tolerance
            meta = c.path("hf_meta")
            hf_llama(["write", "--family", family, "--out", meta, "--seed", "11", "--init-std", "0.2",
                      "--permute-qk", "meta"] + opts)
            wrong = float(evaluate(c.import_(meta, c.path("imported_meta")), 1))
            rel = abs(wrong - ref) / ref
            print(f"  q/k rows in Meta's interleaved order: {wrong} against the reference's {ref:.8g}, relative "
                  f"difference {rel:.1e} (the check above would fail: tolerance {EVAL_REL:g})")
            assert rel > 100 * EVAL_REL, "a wrong q/k row order went unnoticed"
        if moe and family == "qwen3_moe":
            # the other routing (renormalised over the top k, Trident's default softmax; or, for a converter
            # that dropped norm_topk_prob, the reverse): the reference scores it apart by far more than the
            # tolerance, so the comparison above shows that the import routes as norm_topk_prob says
            flip = c.path(f"hf_{k}_flipped")
            shutil.copytree(src, flip)
            cf = json.load(open(os.path.join(src, "config.json")))
            json.dump(dict(cf, norm_topk_prob=not cf["norm_topk_prob"]), open(os.path.join(flip, "config.json"), "w"))
            _, out = hf_llama(["eval", "--model", flip, "--shard", shard, "--windows", str(windows), "--seq", str(seq)])
            other = float(eval_loss(out))
            rel = abs(other - float(one)) / float(one)
            print(f"  norm_topk_prob {not cf['norm_topk_prob']}: the reference scores {other:.8g} against Trident's "
                  f"{one}, relative difference {rel:.1e} (the check above would fail: tolerance {EVAL_REL:g})")
            assert rel > 100 * EVAL_REL, "the routing's renormalisation went unnoticed"


# ---------------------------------------------------------------------------------------------
# transformers' own models (CTest hf_transformers_gpt, _bert, _llama): exit 77 where transformers or
# PyTorch is not installed (the CPU image; the GPU check's image has them)

TRANSFORMERS_REL = 1e-5  # transformers' float32 models against Trident's fp32 evaluation


def transformers_missing():
    """Why transformers' models cannot run here (None when transformers and PyTorch are installed)."""
    import importlib.util
    gone = [m for m in ("transformers", "torch") if importlib.util.find_spec(m) is None]
    return f"{' and '.join(gone)} not installed for {sys.executable}" if gone else None


def require_transformers():
    missing = transformers_missing()
    if missing:
        print(f"SKIPPED (77): {missing}: transformers' own models cannot score the exports here")
        raise SystemExit(77)


def transformers_ran(rc, out, what):
    """A reference run with --transformers after require_transformers(): 77 (its import failed) is a failure."""
    if rc == 77:
        print(out)
        raise SystemExit(f"FAILED: {what}: transformers is installed but the reference could not import it")


def check_transformers_gpt(c):
    """transformers' GPT2LMHeadModel.from_pretrained on the export of a GPT trained here scores the
    windows as --eval.only does (float32, within TRANSFORMERS_REL)."""
    require_transformers()
    shutil.rmtree(c.a.work, ignore_errors=True)
    os.makedirs(c.a.work)
    ck = c.train_gpt("ck", 40, ["--model.hidden_dropout", "0.1", "--model.attention_dropout", "0.1"])
    hf = c.export(ck, c.path("hf"), ["--vocab-file", c.gpt_vocab[0], "--merge-file", c.gpt_vocab[1]])
    shard, windows, seq = os.path.join(c.sample, "kjv_gpt2_00001.h5"), 16, 32
    _, out, _ = run(c.app("pretrain_gpt") + [
        "--deck", os.path.join(ROOT, "inputs", "gpt_tiny_ci.ini"), "--checkpoint.load", ck, "--eval.only", "true",
        "--eval.shard", shard, "--eval.windows", str(windows), "--train.micro_batch_size", "4"])
    rc, ref = reference(["gpt-eval", "--model", hf, "--shard", shard, "--windows", str(windows), "--seq", str(seq),
                         "--transformers"])
    transformers_ran(rc, ref, "GPT2LMHeadModel")
    within("transformers' GPT2LMHeadModel (float32) vs --eval.only", eval_loss(out), float(eval_loss(ref)),
           TRANSFORMERS_REL)


def check_transformers_bert(c):
    """transformers' MegatronBertForPreTraining on the export of a BERT trained here scores the samples
    that --eval.only dumps as it does (float32, within TRANSFORMERS_REL)."""
    require_transformers()
    shutil.rmtree(c.a.work, ignore_errors=True)
    os.makedirs(c.a.work)
    vocab = os.path.join(c.sample, "bert", "vocab.txt")
    ck = c.train_masked("pretrain_bert", "bert_tiny_ci.ini", "ck", 5)
    hf = c.export(ck, c.path("hf"))
    dump = c.path("eval_samples.h5")
    _, out, _ = run(c.app("pretrain_bert") + [
        "--deck", os.path.join(ROOT, "inputs", "bert_tiny_ci.ini"), "--data.vocab_file", vocab,
        "--checkpoint.load", ck, "--eval.only", "true", "--eval.shard", os.path.join(c.sample, "kjv_bert_00001.h5"),
        "--eval.windows", "24", "--debug.dump_batches", dump])
    rc, ref = reference(["bert-eval", "--model", hf, "--samples", dump, "--transformers"])
    transformers_ran(rc, ref, "MegatronBertForPreTraining")
    within("transformers' MegatronBertForPreTraining (float32) vs --eval.only", eval_loss(out),
           float(eval_loss(ref)), TRANSFORMERS_REL)


def check_transformers_llama(c):
    """transformers' AutoModelForCausalLM on the export of each Llama-family case of the llama, qwen and moe
    checks scores the windows as --eval.only of the import does (float32, within TRANSFORMERS_REL)."""
    require_transformers()
    shutil.rmtree(c.a.work, ignore_errors=True)
    os.makedirs(c.a.work)
    cases = LLAMA_CASES["llama"] + LLAMA_CASES["qwen"] + LLAMA_CASES["moe"]
    for k, (what, family, opts, _) in enumerate(cases):
        print(f"== {what}")
        src = c.path(f"hf_{k}")
        hf_llama(["write", "--family", family, "--out", src, "--seed", str(11 + k), "--init-std", "0.2"] + opts)
        imp = c.import_(src, c.path(f"imported_{k}"))
        one = llama_eval(c, imp, 1)
        _, exp = llama_export(c, imp, c.path(f"export_{k}"), family, opts)
        rc, out = hf_llama(["eval", "--model", exp, "--shard", os.path.join(c.sample, "kjv_gpt2_00001.h5"),
                            "--windows", str(LLAMA_WINDOWS), "--seq", str(LLAMA_SEQ), "--transformers"])
        transformers_ran(rc, out, f"AutoModelForCausalLM on {what}")
        within("  transformers' AutoModelForCausalLM (float32) on the export vs --eval.only", one,
               float(eval_loss(out)), TRANSFORMERS_REL)


CHECKS = {"gpt": check_gpt, "bert": check_bert, "errors": check_errors,
          "llama": lambda c: check_llama_family(c, LLAMA_CASES["llama"]),
          "qwen": lambda c: check_llama_family(c, LLAMA_CASES["qwen"]),
          "moe": lambda c: check_llama_family(c, LLAMA_CASES["moe"], moe=True),
          "transformers_gpt": check_transformers_gpt, "transformers_bert": check_transformers_bert,
          "transformers_llama": check_transformers_llama}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("check", choices=sorted(CHECKS))
    p.add_argument("--build", required=True)
    p.add_argument("--sample", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--mpiexec", default="mpiexec")
    a = p.parse_args()
    CHECKS[a.check](Ctx(a))
    print(f"{a.check}: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
