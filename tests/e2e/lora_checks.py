#!/usr/bin/env python3
"""LoRA checks (docs/DESIGN.md "LoRA"; deck keys lora.rank, lora.alpha, lora.targets).

usage: lora_checks.py CHECK --build BUILD --sample DIR --work DIR [--mpiexec M]
  gpt      a GPT base model trained here on the KJV shards; LoRA fine-tuning on the repository's
           docs (their own shard, preprocess_data), at one rank:
             - at initialisation the adapters give the base model's loss exactly: the first
               iteration's training loss equals a plain fine-tuning run's (17 digits), and
               --eval.only of the initial LoRA checkpoint equals the base model's;
             - the frozen base weights are bitwise unchanged after training (every base tensor
               of the trained model, dumped, against the base checkpoint);
             - the checkpoints hold the adapters only (and their optimizer state);
             - fine-tuning lowers the loss on held-out docs (--eval.only on a file of them);
             - convert_checkpoint --to merged gives plain weights whose loss equals the adapter
               model's within 1e-6 relative; --to hf of the adapters equals --to hf of the merge;
             - the optimizer state shrinks to the adapters' padded share (log.memory_file),
               exactly, against a plain fine-tuning run of the same model
  layouts  the same LoRA run (no dropout) at tp=2, tp=2 with sequence parallelism, pp=2 and dp=2
           with the distributed optimizer follows the one-rank losses within 1e-7 relative; a run
           resumed from its LoRA checkpoint continues bitwise; bf16 keeps the base bitwise frozen;
           T5 with adapters on every projection (cross-attention too) at tp=2 follows one rank;
           BERT adapters trained at tp=2 score as their merge
  llama    the Llama-family layer (inputs/llama_tiny_ci.ini: 4 heads in 2 key/value groups, SwiGLU,
           untied output layer, no biases) keeps the four target names: qkv's adapter B has the
           grouped rows (nh + 2 ng) d, fc1's the gate and up rows 2F, proj's A and fc2's A read
           nh d and F columns; at initialisation the adapters give the base loss exactly; the base
           stays bitwise frozen; tp=2, tp=2 with sequence parallelism and pp=2 follow one rank
           within 1e-7; the merge scores as the adapters at one rank and at tp=2
  errors   one clear error each: lora.rank without checkpoint.finetune, an unknown target, a
           cross-attention target on GPT, overlap_grad_reduce, a LoRA checkpoint given as a base
           model or to generate_gpt, a resume with other lora keys, adapters whose base model
           changed since
"""
import argparse
import csv
import json
import os
import re
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from testlib import assert_layout, run, single_error_failures  # noqa: E402
from hf_checks import latest_file  # noqa: E402 (tests/e2e: the checkpoint file a save directory's latest names)

MERGE_REL = 1e-6   # merged plain weights against the adapters (fp32 rounding of W + s B A)
LAYOUT_REL = 1e-7  # other layouts sum in other orders (measured: 7.9e-9 at tp=2, 2.7e-9 for T5)
DECK = os.path.join(ROOT, "inputs", "gpt_tiny_ci.ini")
LLAMA_DECK = os.path.join(ROOT, "inputs", "llama_tiny_ci.ini")
# the docs fine-tuned on, and the held-out file scored before and after
TRAIN_DOCS = ["README.md", "inputs/README.md", "docs/DESIGN.md"]
HELD_OUT = "validation/README.md"


class Ctx:
    def __init__(self, a):
        self.a = a
        self.apps = os.path.join(a.build, "apps")
        self.sample = a.sample
        self.vocab = [os.path.join(a.sample, "gpt2", "encoder.json"), os.path.join(a.sample, "gpt2", "vocab.bpe")]
        self.deck = DECK

    def path(self, *p):
        return os.path.join(self.a.work, *p)

    def app(self, name, np_=1):
        exe = os.path.join(self.apps, name)
        return [self.a.mpiexec, "-n", str(np_), exe] if np_ > 1 else [exe]

    def gpt(self, extra, np_=1, expect_ok=True):
        return run(self.app("pretrain_gpt", np_) + ["--deck", self.deck, "--data.train_shards",
                                                   os.path.join(self.sample, "kjv_gpt2_*.h5")] + list(extra),
                   expect_ok=expect_ok)

    def base(self, name="base", iters=30):
        ck = self.path(name)
        self.gpt(["--train.iters", str(iters), "--eval.interval", "0", "--checkpoint.save", ck])
        return ck

    def lora(self, base, save, iters, extra=(), np_=1, shards=None, expect_ok=True):
        args = ["--checkpoint.load", base, "--checkpoint.finetune", "true", "--lora.rank", "4", "--lora.alpha", "8",
                "--train.iters", str(iters), "--eval.interval", "0"]
        if save:
            args += ["--checkpoint.save", save]
        if shards:
            args += ["--data.train_shards", shards]
        return self.gpt(args + list(extra), np_, expect_ok)

    def evaluate(self, load, shard, windows=24, np_=1, extra=()):
        _, out, _ = run(self.app("pretrain_gpt", np_) + [
            "--deck", self.deck, "--checkpoint.load", load, "--eval.only", "true", "--eval.shard", shard,
            "--eval.windows", str(windows), "--train.micro_batch_size", "4", "--data.vocab_file", self.vocab[0],
            "--data.merges_file", self.vocab[1]] + list(extra))
        line = [l for l in out.splitlines() if l.startswith("eval loss:")]
        assert line, out[-2000:]
        return line[0].split(":", 1)[1].strip()


def losses(csv_path):
    with open(csv_path) as f:
        return [float(r["loss"]) for r in csv.DictReader(f)]


def within(what, got, want, rel):
    d = abs(got - want) / max(abs(want), 1e-30)
    print(f"{what}: {got!r} vs {want!r}, relative difference {d:.2e} (tolerance {rel:g})")
    assert d <= rel, f"{what}: relative difference {d:.3e} > {rel:g}"


def safetensors_tensors(path):
    """{name: (dtype, shape, bytes)} of a safetensors file, parsed from the published format."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}


def docs_corpus(c):
    """The repository's docs as JSON lines, tokenized into a shard; the held-out file as text."""
    jsonl = c.path("docs.jsonl")
    with open(jsonl, "w") as g:
        for d in TRAIN_DOCS:
            text = open(os.path.join(ROOT, d)).read()
            # one document per section, so that the dataset has documents to shuffle
            for part in text.split("\n## "):
                if len(part) > 200:
                    g.write(json.dumps({"text": part}) + "\n")
    run(c.app("preprocess_data") + ["--input", jsonl, "--output-prefix", c.path("docs"), "--tokenizer-type",
                                    "GPT2BPETokenizer", "--vocab-file", c.vocab[0], "--merge-file", c.vocab[1],
                                    "--append-eod"])
    held = c.path("held_out.txt")
    shutil.copy(os.path.join(ROOT, HELD_OUT), held)
    return c.path("docs_*.h5"), held


def check_gpt(c):
    import h5py
    import numpy as np
    base = c.base("base", 200)
    shards, held = docs_corpus(c)
    lora = c.path("lora")
    iters = 60
    common = ["--optim.lr", "1e-2", "--optim.min_lr", "1e-3", "--optim.warmup_iters", "4", "--log.interval", "20"]
    _, out, _ = c.lora(base, lora, iters, common + [
        "--checkpoint.save_initial", "true", "--log.metrics_file", c.path("lora.csv"), "--log.memory_file",
        c.path("lora_memory.json"), "--debug.dump_params", c.path("dump"), "--debug.dump_params_iters",
        str(iters)], shards=shards)
    banner = [l for l in out.splitlines() if l.startswith("LoRA: rank")]
    assert banner, out[-3000:]
    print(banner[0])
    # a plain fine-tuning run of the same model and data: the first iteration's loss
    c.gpt(["--checkpoint.load", base, "--checkpoint.finetune", "true", "--train.iters", "1", "--eval.interval",
           "0", "--data.train_shards", shards, "--log.metrics_file", c.path("plain.csv"), "--log.memory_file",
           c.path("plain_memory.json")] + common)
    l_lora, l_plain = losses(c.path("lora.csv")), losses(c.path("plain.csv"))
    print(f"iteration 1 training loss: LoRA {l_lora[0]!r}, plain fine-tuning {l_plain[0]!r}")
    assert l_lora[0] == l_plain[0], "adapters at initialisation do not give the base model's loss exactly"

    # the checkpoints hold the adapters (and their moments) only
    with h5py.File(latest_file(lora), "r") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        assert names and all(n.endswith(("/lora_a", "/lora_b")) for n in names), names[:8]
        recorded = f.attrs["lora_base"]
        recorded = recorded.decode() if isinstance(recorded, bytes) else recorded
        assert recorded == os.path.join(base, "iter_0000200", "checkpoint.h5"), recorded
        assert any(n.startswith("optimizer/exp_avg/") for n in names)
        model_names = [n for n in names if n.startswith("model/")]
        # 2 layers x 4 projections x (A, B)
        assert len(model_names) == 16, model_names
        print(f"LoRA checkpoint: {len(model_names)} adapter tensors, {len(names) - len(model_names)} optimizer "
              f"tensors, nothing else; lora_base {recorded}")

    # frozen base: every base tensor of the trained model, bitwise the base checkpoint's
    dump = os.path.join(c.path("dump"), "iter_%07d.h5" % iters)
    with h5py.File(dump, "r") as d, h5py.File(latest_file(base), "r") as b:
        base_names = []
        b["model"].visititems(lambda n, o: base_names.append("model/" + n) if isinstance(o, h5py.Dataset) else None)
        changed = [n for n in base_names if d[n][()].tobytes() != b[n][()].tobytes()]
        assert not changed, f"base tensors changed by LoRA training: {changed[:5]}"
        lora_b = []
        d.visititems(lambda n, o: lora_b.append(n) if n.endswith("lora_b") else None)
        b_norm = sum(float(np.abs(d[n][()]).sum()) for n in lora_b)
        assert lora_b and b_norm > 0, "the adapters' B stayed zero: nothing trained"
        print(f"frozen base: {len(base_names)} base tensors bitwise unchanged after {iters} iterations; "
              f"sum |B| over {len(lora_b)} adapters = {b_norm:.4g}")

    # at initialisation the adapter model scores as the base model; fine-tuning lowers the loss
    l_base = c.evaluate(base, held)
    l_init = c.evaluate(os.path.join(lora, "iter_0000000"), held)
    l_tuned = c.evaluate(lora, held)
    print(f"--eval.only on held-out {HELD_OUT}: base {l_base}, LoRA at initialisation {l_init}, "
          f"after {iters} iterations {l_tuned}")
    assert l_init == l_base, "the initial adapters change the base model's loss"
    assert float(l_tuned) < float(l_base) - 0.05, "LoRA fine-tuning on the docs did not lower the held-out loss"

    # merged plain weights score as the adapters do
    merged = c.path("merged")
    run(c.app("convert_checkpoint") + ["--to", "merged", "--input", lora, "--output", merged])
    l_merged = c.evaluate(merged, held)
    within("merged checkpoint vs adapters (--eval.only)", float(l_merged), float(l_tuned), MERGE_REL)
    l_merged_tp2 = c.evaluate(merged, held, np_=2, extra=["--parallel.tp", "2"])
    within("  the merged checkpoint at tp=2", float(l_merged_tp2), float(l_tuned), MERGE_REL)
    hf_a, hf_b = c.path("hf_lora"), c.path("hf_merged")
    for src, dst in ((lora, hf_a), (merged, hf_b)):
        run(c.app("convert_checkpoint") + ["--to", "hf", "--input", src, "--output", dst, "--vocab-file", c.vocab[0],
                                           "--merge-file", c.vocab[1]])
    ta = safetensors_tensors(os.path.join(hf_a, "model.safetensors"))
    tb = safetensors_tensors(os.path.join(hf_b, "model.safetensors"))
    assert ta == tb, "--to hf of the adapters differs from --to hf of their merge"
    print(f"--to hf of the adapters: {len(ta)} tensors, bitwise those of --to hf of the merged checkpoint")

    # optimizer state: the adapters' padded share of the model's
    mem_l = json.load(open(c.path("lora_memory.json")))["ranks"][0]["optimizer_bytes"]
    mem_p = json.load(open(c.path("plain_memory.json")))["ranks"][0]["optimizer_bytes"]
    m = re.search(r": (\d+) adapter parameters train, the (\d+) of the base model", banner[0])
    adapters, total = int(m.group(1)), int(m.group(1)) + int(m.group(2))
    pad = lambda n: -(-n // 4096) * 4096  # noqa: E731 (one rank: shards of 4096 elements)
    # plain: both moments of the whole padded store (its params_bytes / 4 fp32 values, the
    # vocabulary padding included); LoRA: of the adapters' padded range
    plain_values = json.load(open(c.path("plain_memory.json")))["ranks"][0]["params_bytes"] / 4
    want_l, want_p = 8 * pad(adapters), 8 * plain_values
    print(f"optimizer state (AdamW moments, fp32): LoRA {mem_l:.0f} bytes, plain {mem_p:.0f} bytes: "
          f"{mem_p / mem_l:.1f}x less ({adapters} adapter parameters of {total})")
    assert (mem_l, mem_p) == (want_l, want_p), f"expected {want_l} and {want_p} bytes"


def check_layouts(c):
    base = c.base("base", 10)
    quiet = ["--model.hidden_dropout", "0", "--model.attention_dropout", "0", "--log.interval", "6"]
    ref_csv = c.path("ref.csv")
    c.lora(base, None, 6, quiet + ["--log.metrics_file", ref_csv])
    ref = losses(ref_csv)
    for name, np_, extra in (("tp=2", 2, ["--parallel.tp", "2"]),
                             ("tp=2 with sequence parallelism", 2, ["--parallel.tp", "2",
                                                                    "--parallel.sequence_parallel", "true"]),
                             ("pp=2", 2, ["--parallel.pp", "2"]),
                             ("dp=2, distributed optimizer", 2, ["--optim.distributed", "true"])):
        m = c.path(f"layout_{len(os.listdir(c.a.work))}.csv")
        c.lora(base, None, 6, quiet + extra + ["--log.metrics_file", m], np_=np_)
        got = losses(m)
        worst = max(abs(g - r) / r for g, r in zip(got, ref))
        print(f"LoRA at {name}: losses {['%.6f' % x for x in got]} vs one rank, worst relative {worst:.2e}")
        assert len(got) == len(ref) and worst <= LAYOUT_REL, f"LoRA at {name} departs from one rank"
    # resume: 3 iterations saved, then 3 more, bitwise the straight run's
    ck = c.path("resume")
    c.lora(base, ck, 3, quiet + ["--optim.decay_iters", "6"])
    r_csv = c.path("resumed.csv")
    _, out, _ = c.lora(base, ck, 6, quiet + ["--log.metrics_file", r_csv])
    assert "resuming them" in out and "resumed from" in out, out[-2000:]
    assert losses(r_csv) == ref[3:], f"resumed {losses(r_csv)} vs straight {ref[3:]}"
    print(f"LoRA resumed at iteration 3: iterations 4-6 bitwise the straight run's {ref[3:]}")
    # bf16: the 16-bit base stays bitwise frozen
    import h5py
    dump = c.path("dump_bf16")
    c.lora(base, None, 4, quiet + ["--precision.dtype", "bf16", "--debug.dump_params", dump,
                                   "--debug.dump_params_iters", "1,4"])
    with h5py.File(os.path.join(dump, "iter_0000001.h5"), "r") as a, \
            h5py.File(os.path.join(dump, "iter_0000004.h5"), "r") as b:
        names = []
        a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        base_names = [n for n in names if not n.endswith(("lora_a", "lora_b"))]
        moved = [n for n in names if a[n][()].tobytes() != b[n][()].tobytes()]
        assert moved and all(n.endswith(("lora_a", "lora_b")) for n in moved), moved[:5]
        print(f"bf16 LoRA: {len(base_names)} base tensors bitwise frozen over iterations 1-4, "
              f"{len(moved)} adapter tensors trained")
    # T5: adapters on every projection, cross-attention included, one rank against tp=2
    t5_base = c.path("t5_base")
    t5 = ["--deck", os.path.join(ROOT, "inputs", "t5_tiny_ci.ini"), "--data.train_shards",
          os.path.join(c.sample, "kjv_t5_*.h5"), "--data.vocab_file", os.path.join(c.sample, "bert", "vocab.txt"),
          "--eval.interval", "0"]
    run(c.app("pretrain_t5") + t5 + ["--train.iters", "4", "--checkpoint.save", t5_base])
    t5_lora = t5 + quiet + ["--checkpoint.load", t5_base, "--checkpoint.finetune", "true", "--lora.rank", "2",
                            "--lora.targets", "qkv,proj,fc1,fc2,cross_q,cross_kv,cross_proj", "--train.iters", "3"]
    run(c.app("pretrain_t5") + t5_lora + ["--log.metrics_file", c.path("t5_1.csv")])
    run(c.app("pretrain_t5", 2) + t5_lora + ["--parallel.tp", "2", "--log.metrics_file", c.path("t5_tp2.csv")])
    a, b = losses(c.path("t5_1.csv")), losses(c.path("t5_tp2.csv"))
    worst = max(abs(x - y) / y for x, y in zip(b, a))
    print(f"T5 LoRA on 7 projections: one rank {a}, tp=2 {b}, worst relative {worst:.2e}")
    assert worst <= LAYOUT_REL
    # BERT: adapters trained at tp=2 score over their base as their merge does (its heads stay frozen)
    bert_base, bert_lora = c.path("bert_base"), c.path("bert_lora")
    vocab = ["--data.vocab_file", os.path.join(c.sample, "bert", "vocab.txt")]
    bert = ["--deck", os.path.join(ROOT, "inputs", "bert_tiny_ci.ini"), "--data.train_shards",
            os.path.join(c.sample, "kjv_bert_*.h5"), "--eval.interval", "0"] + vocab
    run(c.app("pretrain_bert") + bert + ["--train.iters", "4", "--checkpoint.save", bert_base])
    run(c.app("pretrain_bert", 2) + bert + ["--parallel.tp", "2", "--checkpoint.load", bert_base,
                                            "--checkpoint.finetune", "true", "--lora.rank", "4", "--train.iters", "4",
                                            "--optim.lr", "1e-2", "--checkpoint.save", bert_lora])
    merged = c.path("bert_merged")
    run(c.app("convert_checkpoint") + ["--to", "merged", "--input", bert_lora, "--output", merged])

    def bert_eval(load):
        _, out, _ = run(c.app("pretrain_bert") + [
            "--deck", os.path.join(ROOT, "inputs", "bert_tiny_ci.ini"), "--checkpoint.load", load, "--eval.only",
            "true", "--eval.shard", os.path.join(c.sample, "kjv_bert_00001.h5"), "--eval.windows", "16"] + vocab)
        return float([l for l in out.splitlines() if l.startswith("eval loss:")][0].split(":")[1])
    l_base, l_lora, l_merged = bert_eval(bert_base), bert_eval(bert_lora), bert_eval(merged)
    print(f"BERT --eval.only: base {l_base}, LoRA trained at tp=2 {l_lora}, merged {l_merged}")
    assert l_lora != l_base, "the BERT adapters changed nothing"
    within("  BERT merged vs adapters", l_merged, l_lora, MERGE_REL)


def lora_at_layout(c, model, name, base, quiet, extra, ref, check_layout=False):
    """6 LoRA steps from `base` on 2 ranks at the layout `extra`: one rank's losses `ref` within LAYOUT_REL."""
    m = c.path(f"layout_{len(os.listdir(c.a.work))}.csv")
    _, out, _ = c.lora(base, None, 6, quiet + extra + ["--log.metrics_file", m], np_=2)
    if check_layout:
        assert_layout(c.app("pretrain_gpt", 2) + extra, out)
    got = losses(m)
    worst = max(abs(g - r) / r for g, r in zip(got, ref))
    print(f"{model} LoRA at {name}: losses {['%.6f' % x for x in got]} vs one rank, worst relative {worst:.2e}")
    assert len(got) == len(ref) and worst <= LAYOUT_REL, f"{model} LoRA at {name} departs from one rank"


def merge_scores_as_adapters(c, model, base, lora, layout):
    """convert_checkpoint --to merged of `lora`: the held-out loss (--eval.only) of the merged plain
    weights equals the adapters' (MERGE_REL), on one rank and at `layout` (name, flags) on two."""
    held = c.path("held_out.txt")
    shutil.copy(os.path.join(ROOT, HELD_OUT), held)
    merged = c.path("merged")
    run(c.app("convert_checkpoint") + ["--to", "merged", "--input", lora, "--output", merged])
    l_base, l_lora = c.evaluate(base, held), c.evaluate(lora, held)
    assert l_lora != l_base, "the adapters changed nothing"
    within(f"{model} merged checkpoint vs adapters (--eval.only)", float(c.evaluate(merged, held)), float(l_lora),
           MERGE_REL)
    within(f"  the merged checkpoint at {layout[0]}", float(c.evaluate(merged, held, np_=2, extra=layout[1])),
           float(l_lora), MERGE_REL)


def check_llama(c):
    import h5py
    import numpy as np
    c.deck = LLAMA_DECK
    heads, groups, hidden, ffn = 4, 2, 64, 160  # the deck's
    d = hidden // heads
    base = c.base("base", 30)
    quiet = ["--model.hidden_dropout", "0", "--model.attention_dropout", "0", "--log.interval", "6",
             "--optim.lr", "1e-2", "--optim.warmup_iters", "1"]
    lora, ref_csv = c.path("lora"), c.path("ref.csv")
    _, out, _ = c.lora(base, lora, 6, quiet + ["--log.metrics_file", ref_csv, "--debug.dump_params", c.path("dump"),
                                               "--debug.dump_params_iters", "6"])
    print([l for l in out.splitlines() if l.startswith("LoRA: rank")][0])
    c.gpt(["--checkpoint.load", base, "--checkpoint.finetune", "true", "--train.iters", "1", "--eval.interval", "0",
           "--log.metrics_file", c.path("plain.csv")] + quiet)
    ref, plain = losses(ref_csv), losses(c.path("plain.csv"))
    print(f"iteration 1 training loss: LoRA {ref[0]!r}, plain fine-tuning {plain[0]!r}")
    assert ref[0] == plain[0], "adapters at initialisation do not give the base model's loss exactly"
    # the adapters' shapes follow the grouped qkv and the gated fc1
    want = {"self_attention/qkv": ((4, hidden), ((heads + 2 * groups) * d, 4)),
            "self_attention/proj": ((4, heads * d), (hidden, 4)),
            "mlp/fc1": ((4, hidden), (2 * ffn, 4)),
            "mlp/fc2": ((4, ffn), (hidden, 4))}
    with h5py.File(latest_file(lora), "r") as f:
        for layer in (0, 1):
            for t, (sa, sb) in want.items():
                ga = f[f"model/layers/{layer}/{t}/lora_a"].shape
                gb = f[f"model/layers/{layer}/{t}/lora_b"].shape
                assert (ga, gb) == (sa, sb), f"layer {layer} {t}: lora_a {ga}, lora_b {gb}; expected {sa}, {sb}"
    print("adapter shapes: qkv B " + str(want["self_attention/qkv"][1]) + " (q heads, k and v groups), fc1 B "
          + str(want["mlp/fc1"][1]) + " (gate and up), proj A " + str(want["self_attention/proj"][0]) + ", fc2 A "
          + str(want["mlp/fc2"][0]))
    dump = os.path.join(c.path("dump"), "iter_0000006.h5")
    with h5py.File(dump, "r") as dd, h5py.File(latest_file(base), "r") as b:
        base_names = []
        b["model"].visititems(lambda n, o: base_names.append("model/" + n) if isinstance(o, h5py.Dataset) else None)
        assert "model/output_layer/weight" in base_names, "the base model has no untied output layer"
        changed = [n for n in base_names if dd[n][()].tobytes() != b[n][()].tobytes()]
        assert not changed, f"base tensors changed by LoRA training: {changed[:5]}"
        lora_b = []
        dd.visititems(lambda n, o: lora_b.append(n) if n.endswith("lora_b") else None)
        b_norm = sum(float(np.abs(dd[n][()]).sum()) for n in lora_b)
        assert len(lora_b) == 8 and b_norm > 0, "the adapters' B stayed zero: nothing trained"
        print(f"frozen base: {len(base_names)} base tensors (output_layer included) bitwise unchanged; "
              f"sum |B| over {len(lora_b)} adapters = {b_norm:.4g}")
    for name, extra in (("tp=2", ["--parallel.tp", "2"]),
                        ("tp=2 with sequence parallelism", ["--parallel.tp", "2", "--parallel.sequence_parallel",
                                                            "true"]),
                        ("pp=2", ["--parallel.pp", "2"])):
        lora_at_layout(c, "Llama", name, base, quiet, extra, ref)
    merge_scores_as_adapters(c, "Llama", base, lora, ("tp=2", ["--parallel.tp", "2"]))


def check_moe(c):
    """LoRA on a mixture-of-experts model (inputs/moe_tiny_ci.ini: 2 layers of 4 SwiGLU experts,
    top-2): adapters on the attention projections of every layer (and on fc1 / fc2 of dense
    layers and shared experts, none in this deck); the routed experts and the router belong to
    the frozen base. At initialisation the loss is the base model's; after training every base
    tensor (experts and router included) is bitwise unchanged; dp 2 x ep 2 and tp 2 + SP x ep 2
    give one rank's losses; the merge scores as the adapters."""
    import h5py
    import numpy as np
    c.deck = os.path.join(ROOT, "inputs", "moe_tiny_ci.ini")
    base = c.base("base", 20)
    quiet = ["--model.hidden_dropout", "0", "--model.attention_dropout", "0", "--log.interval", "1",
             "--optim.lr", "1e-2", "--optim.warmup_iters", "1"]
    lora, ref_csv = c.path("lora"), c.path("ref.csv")
    _, out, _ = c.lora(base, lora, 6, quiet + ["--log.metrics_file", ref_csv, "--debug.dump_params", c.path("dump"),
                                               "--debug.dump_params_iters", "6"])
    print([l for l in out.splitlines() if l.startswith("LoRA: rank")][0])
    c.gpt(["--checkpoint.load", base, "--checkpoint.finetune", "true", "--train.iters", "1", "--eval.interval", "0",
           "--log.metrics_file", c.path("plain.csv")] + quiet)
    ref, plain = losses(ref_csv), losses(c.path("plain.csv"))
    print(f"iteration 1 training loss: LoRA {ref[0]!r}, plain fine-tuning {plain[0]!r}")
    assert ref[0] == plain[0], "adapters at initialisation do not give the base model's loss exactly"
    with h5py.File(latest_file(lora), "r") as f:
        names = []
        f["model"].visititems(lambda n, o: names.append("model/" + n) if isinstance(o, h5py.Dataset) else None)
    want = sorted(f"model/layers/{i}/self_attention/{t}/{ab}" for i in (0, 1) for t in ("qkv", "proj")
                  for ab in ("lora_a", "lora_b"))
    assert sorted(names) == want, f"the LoRA checkpoint holds {sorted(names)}, expected the attention adapters {want}"
    print(f"LoRA checkpoint: {len(names)} tensors, the attention adapters of both MoE layers only")
    dump = os.path.join(c.path("dump"), "iter_0000006.h5")
    with h5py.File(dump, "r") as dd, h5py.File(latest_file(base), "r") as b:
        base_names = []
        b["model"].visititems(lambda n, o: base_names.append("model/" + n) if isinstance(o, h5py.Dataset) else None)
        experts = [n for n in base_names if "/mlp/experts/" in n or "/mlp/router/" in n]
        assert len(experts) == 2 * (4 * 2 + 1), f"the base's experts and routers: {experts}"
        changed = [n for n in base_names if dd[n][()].tobytes() != b[n][()].tobytes()]
        assert not changed, f"base tensors changed by LoRA training: {changed[:5]}"
        b_norm = sum(float(np.abs(dd[n][()]).sum()) for n in want if n.endswith("lora_b"))
        assert b_norm > 0, "the adapters' B stayed zero: nothing trained"
        print(f"frozen base: {len(base_names)} base tensors ({len(experts)} experts' and routers') bitwise unchanged; "
              f"sum |B| = {b_norm:.4g}")
    assert any(l.startswith(" iter") and "moe aux" in l for l in out.splitlines()), "no MoE metrics in the log"
    for name, extra in (("dp=2, ep=2", ["--parallel.ep", "2"]),
                        ("tp=2 + SP, ep=2", ["--parallel.tp", "2", "--parallel.sequence_parallel", "true",
                                             "--parallel.ep", "2"])):
        lora_at_layout(c, "MoE", name, base, quiet, extra, ref, check_layout=True)
    merge_scores_as_adapters(c, "MoE", base, lora, ("ep=2", ["--parallel.ep", "2"]))


def check_errors(c):
    base = c.base("base", 2)
    lora = c.path("lora")
    c.lora(base, lora, 2)
    exe = os.path.join(c.apps, "pretrain_gpt")
    common = ["--deck", DECK, "--data.train_shards", os.path.join(c.sample, "kjv_gpt2_*.h5"), "--train.iters", "2"]
    fin = ["--checkpoint.load", base, "--checkpoint.finetune", "true"]
    # a base model that changes after the adapters were trained on it
    moving = c.path("moving_base")
    shutil.copytree(base, moving)
    moved_lora = c.path("moved_lora")
    c.lora(moving, moved_lora, 2)
    shutil.copy(latest_file(c.base("other_base", 3)), latest_file(moving))  # another model in its place
    cases = [
        ("lora.rank without checkpoint.finetune", [exe] + common + ["--lora.rank", "4"], "set checkpoint.finetune"),
        ("unknown lora target", [exe] + common + fin + ["--lora.rank", "4", "--lora.targets", "qkv,attn"],
         "unknown projection 'attn'"),
        ("cross-attention target on GPT", [exe] + common + fin + ["--lora.rank", "4", "--lora.targets", "cross_q"],
         "no cross-attention"),
        ("overlap_grad_reduce with LoRA", [exe] + common + fin + ["--lora.rank", "4",
                                                                   "--parallel.overlap_grad_reduce", "true"],
         "overlap_grad_reduce does not apply"),
        ("LoRA checkpoint as a base model", [exe] + common + ["--checkpoint.load", lora, "--checkpoint.finetune",
                                                              "true"], "holds LoRA adapters only"),
        ("LoRA checkpoint to generate_gpt", c.app("generate_gpt") + [
            "--checkpoint", lora, "--vocab-file", c.vocab[0], "--merge-file", c.vocab[1], "--prompt", "In the",
            "--max-new-tokens", "2"], "merge them into plain weights first"),
        ("resume with another lora.rank", [exe] + common + fin + ["--lora.rank", "8", "--train.iters", "3",
                                                                   "--checkpoint.save", lora], "this run has 8"),
        ("adapters whose base model changed", [exe, "--deck", DECK, "--checkpoint.load", moved_lora, "--eval.only",
                                               "true", "--eval.shard", os.path.join(c.sample, "kjv_gpt2_00001.h5"),
                                               "--eval.windows", "4"], "which has changed since"),
        ("merge of plain weights", c.app("convert_checkpoint") + ["--to", "merged", "--input", base, "--output",
                                                                  c.path("no_merge")], "no LoRA adapters to merge"),
        ("LoRA with the MoE expert bias", [exe, "--deck", os.path.join(ROOT, "inputs", "moe_tiny_ci.ini"),
                                           "--data.train_shards", os.path.join(c.sample, "kjv_gpt2_*.h5")] + fin +
         ["--lora.rank", "4", "--moe.router_score_function", "sigmoid", "--moe.router_enable_expert_bias", "true"],
         "the expert bias is part of the frozen base"),
    ]
    failures = single_error_failures(cases)
    assert not os.path.exists(c.path("no_merge")), "a refused merge wrote its output"
    if failures:
        raise SystemExit(f"{len(failures)} error case(s) failed: {failures}")
    print(f"{len(cases)} error cases: one clear error each")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("check", choices=["gpt", "layouts", "llama", "moe", "errors"])
    p.add_argument("--build", required=True)
    p.add_argument("--sample", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--mpiexec", default="mpiexec")
    a = p.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    c = Ctx(a)
    {"gpt": check_gpt, "layouts": check_layouts, "llama": check_llama, "moe": check_moe,
     "errors": check_errors}[a.check](c)
    print(f"lora_{a.check}: PASS")


if __name__ == "__main__":
    main()
