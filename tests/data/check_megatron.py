#!/usr/bin/env python3
"""Megatron indexed datasets (.bin/.idx) as Trident corpora (docs/DESIGN.md "Megatron indexed
datasets"), checked against validation/megatron_indexed.py, a writer and reader of the format
made from its public description with numpy alone.

  formats  the sample's GPT-2, WordPiece (sentences) and T5 shards: convert_dataset's pairs are
           byte for byte the independent writer's; the independent writer's pairs converted
           back to HDF5 equal the original shards (tokens, offsets, attributes); a vocabulary
           over 65535 (a synthetic 70000-entry WordPiece vocabulary) takes the int32 path both
           ways; output paths that exist are refused
  train    pretrain_gpt, 20 iterations: the HDF5 shards and the independent writer's pairs give the
           same losses, row for row (same samples token for token), and two shards of each format
           mixed the same first 10 rows; the evaluation mode scores a pair as it scores the shard; pretrain_bert on
           sentence pairs equals pretrain_bert on the shards
  errors   a pair without data.tokenizer_type, a wrong magic, an unknown dtype code, a truncated
           .bin, document indices that do not add up: one error naming the problem (np=2)
"""
import argparse
import csv
import glob
import os
import shutil
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "validation"))
import megatron_indexed as mi  # noqa: E402
from testlib import run, single_error_failures  # noqa: E402


def shards_equal(a, b):
    """Two Trident HDF5 shards hold the same datasets and attributes."""
    import h5py
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        assert sorted(fa) == sorted(fb), (a, b, list(fa), list(fb))
        for k in fa:
            x, y = fa[k][:], fb[k][:]
            assert x.dtype == y.dtype and np.array_equal(x, y), f"{a} vs {b}: /{k} differs"
        ka, kb = dict(fa.attrs), dict(fb.attrs)
        assert ka.keys() == kb.keys(), (a, b, sorted(ka), sorted(kb))
        for k in ka:
            assert np.array_equal(ka[k], kb[k]), f"{a} vs {b}: attribute {k}: {ka[k]} vs {kb[k]}"


def tokenizer_flags(kind, sample):
    if kind == "gpt2":
        return ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", f"{sample}/gpt2/encoder.json",
                "--merge-file", f"{sample}/gpt2/vocab.bpe"]
    extra = ["--vocab-extra-ids", "100"] if kind == "t5" else []
    return ["--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", f"{sample}/bert/vocab.txt"] + extra


def check_formats(a):
    conv = os.path.join(a.build, "apps", "convert_dataset")
    for kind in ("gpt2", "bert", "t5"):
        shards = sorted(glob.glob(f"{a.sample}/kjv_{kind}_*.h5"))
        d = os.path.join(a.work, kind)
        for sub in ("trident", "independent", "back"):
            os.makedirs(os.path.join(d, sub))
        run([conv, "--input", f"{a.sample}/kjv_{kind}_*.h5", "--output-prefix", f"{d}/trident/kjv"])
        run([sys.executable, os.path.join(ROOT, "validation", "megatron_indexed.py"), "from-hdf5", *shards,
             "--output-prefix", f"{d}/independent/kjv"])
        for k in range(len(shards)):
            for ext in (".bin", ".idx"):
                p, q = f"{d}/trident/kjv_{k:05d}{ext}", f"{d}/independent/kjv_{k:05d}{ext}"
                assert open(p, "rb").read() == open(q, "rb").read(), f"{p} differs from the independent {q}"
        dtype = mi.read(f"{d}/independent/kjv_00000")[0]
        assert dtype == np.uint16, dtype
        run([conv, "--input", f"{d}/independent/kjv_*.idx", "--output-prefix", f"{d}/back/kjv",
             *tokenizer_flags(kind, a.sample)])
        for k, s in enumerate(shards):
            shards_equal(s, f"{d}/back/kjv_{k:05d}.h5")
        print(f"{kind}: {len(shards)} shards -> pairs identical to the independent writer's -> HDF5 identical")

    # int32: a WordPiece vocabulary of 70000 entries; a shard of its tokens written by
    # convert_dataset from pairs of the independent writer, and back.
    d = os.path.join(a.work, "wide")
    os.makedirs(d)
    words = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words += [f"w{i}" for i in range(70000 - len(words))]
    with open(f"{d}/vocab.txt", "w") as f:
        f.write("\n".join(words) + "\n")
    rng = np.random.default_rng(7)
    docs = [[rng.integers(0, 70000, size=int(rng.integers(1, 50))) for _ in range(int(rng.integers(1, 4)))]
            for _ in range(200)]
    docs[5] = []  # an empty document
    docs[6][0][:3] = [69999, 65535, 65536]
    mi.write(f"{d}/wide_text_sentence", docs, mi.megatron_dtype(70000))
    assert mi.read(f"{d}/wide_text_sentence")[0] == np.int32
    flags = ["--tokenizer-type", "BertWordPieceCase", "--vocab-file", f"{d}/vocab.txt"]
    run([conv, "--input", f"{d}/wide_text_sentence", "--output-prefix", f"{d}/wide", *flags])
    os.makedirs(f"{d}/again")
    run([conv, "--input", f"{d}/wide.h5", "--output-prefix", f"{d}/again/wide_text_sentence"])
    for ext in (".bin", ".idx"):
        assert open(f"{d}/wide_text_sentence{ext}", "rb").read() == open(f"{d}/again/wide_text_sentence{ext}",
                                                                        "rb").read(), ext
    import h5py
    with h5py.File(f"{d}/wide.h5", "r") as f:
        assert f["tokens"].dtype == np.int32 and int(f.attrs["max_token_id"]) == 69999
        assert f["tokens"].size == sum(s.size for doc in docs for s in doc)
    print("vocabulary 70000: int32 pair -> HDF5 (int32) -> pair byte-identical")

    # outputs that exist are refused, and nothing is touched
    before = open(f"{d}/wide.h5", "rb").read()
    rc, out, _ = run([conv, "--input", f"{d}/wide_text_sentence", "--output-prefix", f"{d}/wide", *flags],
                     expect_ok=False)
    assert rc != 0 and "exists" in out and open(f"{d}/wide.h5", "rb").read() == before, out
    print("formats: passed")


def metrics(path):
    with open(path) as f:
        return [(r["iteration"], r["loss"]) for r in csv.DictReader(f)]


def check_train(a):
    gpt = os.path.join(a.build, "apps", "pretrain_gpt")
    bert = os.path.join(a.build, "apps", "pretrain_bert")
    d = a.work
    os.makedirs(f"{d}/pairs")
    run([sys.executable, os.path.join(ROOT, "validation", "megatron_indexed.py"), "from-hdf5",
         *sorted(glob.glob(f"{a.sample}/kjv_gpt2_*.h5")), "--output-prefix", f"{d}/pairs/kjv_text_document"])
    tok = ["--data.tokenizer_type", "GPT2BPETokenizer", "--data.vocab_file", f"{a.sample}/gpt2/encoder.json",
           "--data.merges_file", f"{a.sample}/gpt2/vocab.bpe"]
    deck = os.path.join(ROOT, "inputs", "gpt_tiny_ci.ini")
    h5 = sorted(glob.glob(f"{a.sample}/kjv_gpt2_*.h5"))
    runs = {
        "hdf5": " ".join(h5),
        "megatron": f"{d}/pairs/kjv_text_document_*.idx",
        "mixed": " ".join([h5[0], f"{d}/pairs/kjv_text_document_00001", h5[2], f"{d}/pairs/kjv_text_document_00003.bin"]),
    }
    got = {}
    for name, spec in runs.items():
        m = f"{d}/{name}.csv"
        extra = ["--checkpoint.save", f"{d}/ck"] if name == "hdf5" else []
        iters = "10" if name == "mixed" else "20"  # the mix: the first 10 rows (suite time)
        _, out, _ = run([gpt, "--deck", deck, "--data.train_shards", spec, "--train.iters", iters,
                         "--optim.decay_iters", "20", "--log.metrics_file", m, *tok, *extra])
        got[name] = metrics(m)
        assert len(got[name]) >= 10, got[name]
    assert got["megatron"] == got["hdf5"], f"megatron: {got['megatron']} != hdf5: {got['hdf5']}"
    assert got["mixed"] == got["hdf5"][:len(got["mixed"])], f"mixed: {got['mixed']} != hdf5: {got['hdf5']}"
    print(f"pretrain_gpt: HDF5, Megatron pairs and a mix give the same {len(got['hdf5'])} loss rows, "
          f"last {got['hdf5'][-1]}")

    evals = {}
    for name, shard in (("hdf5", h5[1]), ("megatron", f"{d}/pairs/kjv_text_document_00001")):
        _, out, _ = run([gpt, "--deck", deck, "--checkpoint.load", f"{d}/ck", "--eval.only", "true", "--eval.shard",
                         shard, "--eval.windows", "16", *tok])
        evals[name] = [l for l in out.splitlines() if l.startswith("eval loss:")]
    assert evals["hdf5"] and evals["hdf5"] == evals["megatron"], evals
    print(f"evaluation mode: {evals['hdf5'][0]} on the shard and on its pair")

    os.makedirs(f"{d}/bert_pairs")
    run([sys.executable, os.path.join(ROOT, "validation", "megatron_indexed.py"), "from-hdf5",
         *sorted(glob.glob(f"{a.sample}/kjv_bert_*.h5")), "--output-prefix", f"{d}/bert_pairs/kjv_text_sentence"])
    bdeck = os.path.join(ROOT, "inputs", "bert_tiny_ci.ini")
    btok = ["--data.tokenizer_type", "BertWordPieceLowerCase", "--data.vocab_file", f"{a.sample}/bert/vocab.txt"]
    bgot = {}
    for name, spec in (("hdf5", f"{a.sample}/kjv_bert_*.h5"), ("megatron", f"{d}/bert_pairs/kjv_text_sentence_*")):
        m = f"{d}/bert_{name}.csv"
        run([bert, "--deck", bdeck, "--data.train_shards", spec, "--train.iters", "5", "--log.metrics_file", m, *btok])
        bgot[name] = metrics(m)
    assert bgot["hdf5"] == bgot["megatron"], bgot
    print(f"pretrain_bert: sentence pairs give the shards' {len(bgot['hdf5'])} loss rows")
    print("train: passed")


def check_errors(a):
    gpt = os.path.join(a.build, "apps", "pretrain_gpt")
    d = a.work
    src = sorted(glob.glob(f"{a.sample}/kjv_gpt2_*.h5"))[0]
    run([sys.executable, os.path.join(ROOT, "validation", "megatron_indexed.py"), "from-hdf5", src,
         "--output-prefix", f"{d}/good"])
    idx = open(f"{d}/good.idx", "rb").read()
    binary = open(f"{d}/good.bin", "rb").read()

    def pair(name, idx_bytes, bin_bytes):
        with open(f"{d}/{name}.idx", "wb") as f:
            f.write(idx_bytes)
        with open(f"{d}/{name}.bin", "wb") as f:
            f.write(bin_bytes)
        return f"{d}/{name}"

    n_seq, n_doc = struct.unpack_from("<QQ", idx, 18)
    last_doc = 34 + 12 * n_seq + 8 * (n_doc - 1)
    cases = {
        "magic": (pair("magic", b"NOTANIDX\x00" + idx[9:], binary), "wrong magic"),
        "dtype": (pair("dtype", idx[:17] + bytes([9]) + idx[18:], binary), "unknown dtype code 9"),
        "float": (pair("float", idx[:17] + bytes([7]) + idx[18:], binary), "holds no token ids"),
        "truncated_bin": (pair("truncated_bin", idx, binary[:-100]), "truncated"),
        "truncated_idx": (pair("truncated_idx", idx[:-8], binary), "truncated or corrupt"),
        "doc_indices": (pair("doc_indices", idx[:last_doc] + struct.pack("<q", n_seq - 1), binary),
                        "the last document index"),
    }
    tok = ["--data.tokenizer_type", "GPT2BPETokenizer", "--data.vocab_file", f"{a.sample}/gpt2/encoder.json",
           "--data.merges_file", f"{a.sample}/gpt2/vocab.bpe"]
    deck = os.path.join(ROOT, "inputs", "gpt_tiny_ci.ini")
    mpi = [a.mpiexec, "-n", "2"]
    runs = [("no tokenizer", mpi + [gpt, "--deck", deck, "--data.train_shards", f"{d}/good", "--train.iters", "2"],
             "data.tokenizer_type")]
    for name, (prefix, needle) in cases.items():
        runs.append((name, mpi + [gpt, "--deck", deck, "--data.train_shards", prefix, "--train.iters", "2", *tok],
                     needle))
    failures = single_error_failures(runs)
    assert not failures, failures
    print("errors: passed")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("check", choices=["formats", "train", "errors"])
    p.add_argument("--build", required=True)
    p.add_argument("--sample", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--mpiexec", default="mpiexec")
    a = p.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    {"formats": check_formats, "train": check_train, "errors": check_errors}[a.check](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
