#!/usr/bin/env python3
"""End-to-end checks of preprocess_data (run by CTest; needs h5py, i.e. Debian's python3).

usage: check_preprocess.py invariance|errors --preprocess BIN --encode-file BIN --mpiexec MPIEXEC
                           --np-flag=-n --sample DIR --work DIR

invariance: on the sample corpus (DIR/kjv.jsonl), 1 and 2 ranks give the same concatenated
  tokens and document offsets (whatever the shard boundaries), also with --split-sentences (then
  the sentence offsets agree too, and the tokens equal those without splitting); every document
  is the tokenizer's ids of its text plus EOD (checked with encode_file); the shards of
  prepare_sample.sh hold the same tokens. Mixed plain-text / JSON-lines inputs with a glob: 1,
  2 and 3 ranks agree and keep the input order.
compressed: kjv.jsonl cut into 3 files compressed with gzip, zstd and xz gives, at 1, 2 and 3
  ranks (and as one zstd file at 2 ranks), shards identical (datasets and attributes) to the same run on
  the uncompressed files; several --json-keys give one shard set per key, each identical to a
  run with that key alone.
errors: bad inputs give one clear message, exit status 1, no hang and no files left behind.
"""
import argparse
import glob
import gzip
import hashlib
import lzma
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL: " + what)
    return cond


def run_pp(a, np_, args, timeout=120):
    cmd = [a.mpiexec, a.np_flag, str(np_), a.preprocess] + args
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return r


def gpt2_args(a, tokenizer="GPT2BPETokenizer", vocab=None):
    return ["--tokenizer-type", tokenizer, "--vocab-file", vocab or os.path.join(a.sample, "gpt2", "encoder.json"),
            "--merge-file", os.path.join(a.sample, "gpt2", "vocab.bpe")]


def tokenizer_digest(type_, files, extra_ids=0):
    """docs/DESIGN.md "Token shards": SHA-256 of the type, the extra ids and each file's SHA-256, one per line."""
    import hashlib
    text = type_ + "\n" + str(extra_ids) + "\n"
    for f in files:
        text += hashlib.sha256(open(f, "rb").read()).hexdigest() + "\n"
    return hashlib.sha256(text.encode()).hexdigest()


def load(prefix):
    """Concatenation of the shards <prefix>_NNNNN.h5 in name order: tokens, offsets, sentences."""
    files = sorted(glob.glob(prefix + "_[0-9][0-9][0-9][0-9][0-9].h5"))
    toks, docs, sents, base, meta = [], [0], [0], 0, None
    for f in files:
        with h5py.File(f, "r") as h:
            attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in h.attrs.items()}
            attrs = {k: (str(v) if isinstance(v, (str, np.str_)) else int(v)) for k, v in attrs.items()}
            t = h["tokens"][...]
            # max_token_id is the shard's own (format_version 2), checked here against its tokens;
            # the other attributes are the same in every shard
            check(attrs.pop("max_token_id", None) == (int(t.max()) if len(t) else -1),
                  "%s: max_token_id is not the largest token id" % f)
            check(h["tokens"].fletcher32, "%s: /tokens has no Fletcher-32 checksums" % f)
            if meta is None:
                meta = attrs
            check(attrs == meta, "%s: attributes %s differ from the first shard's %s" % (f, attrs, meta))
            off = h["document_offsets"][...]
            check(off[0] == 0 and off[-1] == len(t), "%s: document offsets do not span /tokens" % f)
            check(len(off) > 1, "%s: a shard without documents" % f)
            toks.append(t.astype(np.int64))
            docs.extend((off[1:] + base).tolist())
            if "sentence_offsets" in h:
                s = h["sentence_offsets"][...]
                sents.extend((s[1:] + base).tolist())
            base += len(t)
    tokens = np.concatenate(toks) if toks else np.zeros(0, np.int64)
    return files, tokens, docs, (sents if len(sents) > 1 else None), meta


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def invariance(a):
    kjv = os.path.join(a.sample, "kjv.jsonl")
    work = fresh(a.work)
    results = {}
    for split in (False, True):
        for n in (1, 2):
            prefix = os.path.join(work, "kjv_np%d%s" % (n, "_split" if split else ""))
            args = ["--input", kjv, "--output-prefix", prefix, "--append-eod", "--shard-tokens", "150000",
                    "--log-interval", "0"] + gpt2_args(a) + (["--split-sentences"] if split else [])
            r = run_pp(a, n, args)
            if not check(r.returncode == 0, "preprocess_data np=%d split=%s failed:\n%s%s" % (n, split, r.stdout,
                                                                                               r.stderr)):
                return
            print(r.stdout.strip().splitlines()[-2])
            results[(split, n)] = load(prefix)
    f1, t1, d1, s1, m1 = results[(False, 1)]
    f2, t2, d2, s2, m2 = results[(False, 2)]
    gpt2_files = [os.path.join(a.sample, "gpt2", "encoder.json"), os.path.join(a.sample, "gpt2", "vocab.bpe")]
    check(m1 == {"format": "trident.tokens", "format_version": 3, "tokenizer": "GPT2BPETokenizer",
                 "tokenizer_digest": tokenizer_digest("GPT2BPETokenizer", gpt2_files), "vocab_size": 50257,
                 "eod_id": 50256}, "attributes: %s" % m1)
    check(len(f1) >= 5 and len(f2) >= 6, "expected several shards, got %d (np=1) and %d (np=2)" % (len(f1), len(f2)))
    check(len(d1) == 1190, "1189 documents expected, got %d" % (len(d1) - 1))
    check(np.array_equal(t1, t2), "np=1 and np=2 tokens differ")
    check(d1 == d2, "np=1 and np=2 document offsets differ")
    check(s1 is None and s2 is None, "sentence offsets without --split-sentences")
    check(all(t1[e - 1] == 50256 for e in d1[1:]), "a document does not end with EOD")
    fs1, ts1, ds1, ss1, _ = results[(True, 1)]
    fs2, ts2, ds2, ss2, _ = results[(True, 2)]
    check(np.array_equal(ts1, t1) and np.array_equal(ts2, t1), "--split-sentences changed the tokens")
    check(ds1 == d1 and ds2 == d1, "--split-sentences changed the document offsets")
    check(ss1 is not None and ss1 == ss2, "np=1 and np=2 sentence offsets differ")
    if ss1:
        check(set(d1) <= set(ss1), "a document boundary is not a sentence boundary")
        check(len(ss1) > 5 * len(d1), "too few sentences: %d for %d documents" % (len(ss1) - 1, len(d1) - 1))
        check(all(x < y for x, y in zip(ss1, ss1[1:])), "sentence offsets not strictly increasing")
    # Every document = tokenizer(text) + EOD.
    expect = os.path.join(work, "kjv.expected")
    subprocess.run([a.encode_file, os.path.join(a.sample, "gpt2", "encoder.json"),
                    os.path.join(a.sample, "gpt2", "vocab.bpe"), kjv, expect, "--jsonl", "text"], check=True)
    want = [[int(x) for x in line.split()] + [50256] for line in open(expect)]
    got = [t1[d1[k]:d1[k + 1]].tolist() for k in range(len(d1) - 1)]
    bad = [k for k in range(min(len(want), len(got))) if want[k] != got[k]]
    check(len(want) == len(got) and not bad, "documents differ from encode_file's ids (first: %s)" % bad[:3])
    # The sample shards (prepare_sample.sh) hold the same tokens.
    _, tsample, dsample, _, _ = load(os.path.join(a.sample, "kjv_gpt2"))
    check(np.array_equal(tsample, t1) and dsample == d1, "the sample shards differ from np=1's")
    print("kjv: %d tokens, %d documents, %d / %d shards (np=1 / np=2), %d sentences" %
          (len(t1), len(d1) - 1, len(f1), len(f2), len(ss1) - 1 if ss1 else 0))

    # WordPiece (lower case) with sentences: np=1 == np=2 == the sample shards; special-token
    # attributes; sentences tile the documents.
    bert = []
    for n in (1, 2):
        prefix = os.path.join(work, "bert_np%d" % n)
        r = run_pp(a, n, ["--input", kjv, "--output-prefix", prefix, "--split-sentences", "--shard-tokens", "300000",
                          "--tokenizer-type", "BertWordPieceLowerCase",
                          "--vocab-file", os.path.join(a.sample, "bert", "vocab.txt")])
        if not check(r.returncode == 0, "WordPiece np=%d failed:\n%s%s" % (n, r.stdout, r.stderr)):
            return
        bert.append(load(prefix))
    (_, tb1, db1, sb1, mb1), (_, tb2, db2, sb2, _) = bert
    check(np.array_equal(tb1, tb2) and db1 == db2 and sb1 == sb2, "WordPiece: np=1 and np=2 differ")
    check(mb1 == {"format": "trident.tokens", "format_version": 3, "tokenizer": "BertWordPieceLowerCase",
                  "tokenizer_digest": tokenizer_digest("BertWordPieceLowerCase",
                                                       [os.path.join(a.sample, "bert", "vocab.txt")]),
                  "vocab_size": 30522, "eod_id": 102, "cls_id": 101, "sep_id": 102, "mask_id": 103, "pad_id": 0},
          "WordPiece attributes: %s" % mb1)
    check(len(db1) == 1190 and sb1 is not None and set(db1) <= set(sb1), "WordPiece: documents / sentences")
    check(int(tb1.max()) < 30522 and not np.isin(tb1, [0, 101, 102, 103]).any(), "WordPiece: special ids in text")
    _, tsb, dsb, ssb, _ = load(os.path.join(a.sample, "kjv_bert"))
    check(np.array_equal(tsb, tb1) and dsb == db1 and ssb == sb1, "the WordPiece sample shards differ from np=1's")
    # --vocab-extra-ids 100 (the T5 sample shards): the same tokens, the vocabulary extended by
    # [BOS], [EOS] and 100 sentinels
    _, tt5, dt5, st5, mt5 = load(os.path.join(a.sample, "kjv_t5"))
    check(np.array_equal(tt5, tb1) and dt5 == db1 and st5 == sb1, "the T5 sample shards' tokens differ from WordPiece's")
    check(mt5 == dict(mb1, vocab_size=30624, bos_id=30522, eos_id=30523, sentinel_id=30524, num_sentinels=100,
                      tokenizer_digest=tokenizer_digest("BertWordPieceLowerCase",
                                                        [os.path.join(a.sample, "bert", "vocab.txt")], 100)),
          "T5 attributes: %s" % mt5)
    print("kjv (WordPiece): %d tokens, %d sentences" % (len(tb1), len(sb1) - 1))

    # Mixed inputs, with a glob, an empty file and a blank / empty-text JSON line.
    src = fresh(os.path.join(work, "mixed_in"))
    texts = {"a.txt": "First plain document.\nIt has two lines.\n", "b.txt": "Second one: don't stop!  ",
             "c.txt": "", "z.md": "# Markdown\n\nLast document, plain text.\n"}
    for name, t in texts.items():
        open(os.path.join(src, name), "w", encoding="utf-8").write(t)
    lines = [json.dumps({"text": "JSON document %d: %s" % (k, "word " * (k % 7)), "id": k}) for k in range(40)]
    lines.insert(10, "")                                  # blank line: skipped
    lines.insert(20, json.dumps({"text": ""}))            # empty text: skipped
    open(os.path.join(src, "d.jsonl"), "w", encoding="utf-8").write("\n".join(lines) + "\n")
    inputs = [os.path.join(src, "*.txt"), os.path.join(src, "d.jsonl"), os.path.join(src, "z.md")]
    ref = None
    for n in (1, 2, 3):
        prefix = os.path.join(work, "mixed_np%d" % n)
        r = run_pp(a, n, ["--input"] + inputs + ["--output-prefix", prefix, "--append-eod", "--shard-tokens", "60"]
                   + gpt2_args(a))
        if not check(r.returncode == 0, "mixed inputs np=%d failed:\n%s%s" % (n, r.stdout, r.stderr)):
            return
        check("(2 empty skipped)" in r.stdout, "mixed np=%d: expected 2 skipped documents:\n%s" % (n, r.stdout))
        _, t, d, _, _ = load(prefix)
        check(len(d) - 1 == 2 + 40 + 1, "mixed np=%d: %d documents, expected 43" % (n, len(d) - 1))
        if ref is None:
            ref = (t, d)
        else:
            check(np.array_equal(t, ref[0]) and d == ref[1], "mixed inputs: np=%d differs from np=1" % n)
        check(not glob.glob(prefix + ".part*") and not glob.glob(prefix + "*.tmp"), "temporary files left")
    # Order: a.txt, b.txt (c.txt empty), the JSON lines, z.md.
    t, d = ref
    vocab, merges = os.path.join(a.sample, "gpt2", "encoder.json"), os.path.join(a.sample, "gpt2", "vocab.bpe")
    for k, name in ((0, "a.txt"), (1, "b.txt"), (42, "z.md")):
        out = os.path.join(work, name + ".ids")
        subprocess.run([a.encode_file, vocab, merges, os.path.join(src, name), out], check=True, capture_output=True)
        want = [int(x) for x in open(out).read().split()] + [50256]
        check(t[d[k]:d[k + 1]].tolist() == want, "mixed inputs: document %d is not %s" % (k, name))
    # Existing shards are never replaced without --overwrite; an empty input never deletes them.
    prefix = os.path.join(work, "mixed_np1")
    before = sorted(glob.glob(prefix + "_*.h5"))
    digest = {f: hashlib.sha256(open(f, "rb").read()).hexdigest() for f in before}
    unchanged = lambda: {f: hashlib.sha256(open(f, "rb").read()).hexdigest()
                         for f in sorted(glob.glob(prefix + "_*.h5"))} == digest
    r = run_pp(a, 1, ["--input"] + inputs + ["--output-prefix", prefix, "--append-eod"] + gpt2_args(a))
    check(r.returncode == 1 and "pass --overwrite" in r.stderr and unchanged(),
          "rerun without --overwrite: exit %d, shards unchanged %s:\n%s" % (r.returncode, unchanged(), r.stderr))
    empty = os.path.join(src, "empty.jsonl")
    open(empty, "w").close()
    r = run_pp(a, 1, ["--input", empty, "--output-prefix", prefix, "--append-eod", "--overwrite"] + gpt2_args(a))
    check(r.returncode == 0 and "no shard written" in r.stdout and unchanged(),
          "empty input with --overwrite: exit %d, shards unchanged %s:\n%s" % (r.returncode, unchanged(), r.stdout))
    # Rerun with --overwrite and a bigger shard size: fewer shards, stale higher-numbered ones removed.
    r = run_pp(a, 1, ["--input"] + inputs + ["--output-prefix", prefix, "--append-eod", "--overwrite"] + gpt2_args(a))
    after = sorted(glob.glob(prefix + "_*.h5"))
    check(r.returncode == 0 and len(before) > 1 and len(after) == 1,
          "rerun: %d shards before, %s after" % (len(before), after))
    check("stale" in r.stdout, "rerun did not report the removed stale shards:\n" + r.stdout)


def shard_sets_equal(p, q):
    """The shards <p>_NNNNN.h5 and <q>_NNNNN.h5: as many, each pair with equal datasets and
    attributes."""
    fp = sorted(glob.glob(p + "_[0-9][0-9][0-9][0-9][0-9].h5"))
    fq = sorted(glob.glob(q + "_[0-9][0-9][0-9][0-9][0-9].h5"))
    if not check(len(fp) == len(fq) and fp, "%s: %d shards, %s: %d" % (p, len(fp), q, len(fq))):
        return False
    for x, y in zip(fp, fq):
        with h5py.File(x, "r") as hx, h5py.File(y, "r") as hy:
            same = sorted(hx) == sorted(hy) and all(np.array_equal(hx[k][...], hy[k][...]) for k in hx)
            same = same and sorted(hx.attrs) == sorted(hy.attrs) and all(
                np.array_equal(hx.attrs[k], hy.attrs[k]) for k in hx.attrs)
            if not check(same, "%s differs from %s" % (y, x)):
                return False
    return True


def compress(path, kind):
    """path.zst / .gz / .xz next to path (zstd with the zstd tool, the others with Python)."""
    out = path + {"zstd": ".zst", "gzip": ".gz", "xz": ".xz"}[kind]
    data = open(path, "rb").read()
    if kind == "gzip":
        open(out, "wb").write(gzip.compress(data))
    elif kind == "xz":
        open(out, "wb").write(lzma.compress(data))
    else:
        subprocess.run(["zstd", "-q", "-f", path, "-o", out], check=True)
    return out


def compressed(a):
    if shutil.which("zstd") is None:
        print("SKIP: the zstd tool is missing (scripts/bootstrap.sh test installs it)")
        sys.exit(77)
    work = fresh(a.work)
    lines = open(os.path.join(a.sample, "kjv.jsonl"), "rb").read().splitlines(keepends=True)
    whole = os.path.join(work, "kjv.jsonl")
    open(whole, "wb").write(b"".join(lines))
    parts = []
    for k, (lo, hi) in enumerate(((0, 400), (400, 800), (800, len(lines)))):
        parts.append(os.path.join(work, "part%d.jsonl" % k))
        open(parts[-1], "wb").write(b"".join(lines[lo:hi]))
    sets = {
        "one zstd file": ([whole], [compress(whole, "zstd")]),
        "gzip + zstd + xz files": (parts, [compress(parts[0], "gzip"), compress(parts[1], "zstd"),
                                            compress(parts[2], "xz")]),
    }
    for name, (plain, packed) in sets.items():
        for n in ((1, 2, 3) if name == "gzip + zstd + xz files" else (2,)):
            prefixes = []
            for kind, inputs in (("plain", plain), ("packed", packed)):
                prefix = os.path.join(work, "%s_np%d_%s" % (name.replace(" ", "_").replace("+", ""), n, kind))
                r = run_pp(a, n, ["--input"] + inputs + ["--output-prefix", prefix, "--append-eod", "--shard-tokens",
                                                         "150000", "--log-interval", "0"] + gpt2_args(a))
                if not check(r.returncode == 0, "%s np=%d %s failed:\n%s%s" % (name, n, kind, r.stdout, r.stderr)):
                    return
                if kind == "packed":
                    print(r.stdout.strip().splitlines()[1])
                prefixes.append(prefix)
            if shard_sets_equal(*prefixes):
                print("ok   %-24s np=%d: shards identical to the uncompressed run's" % (name, n))
    # several keys: one set each, equal to the single-key runs
    both = os.path.join(work, "keys")
    r = run_pp(a, 2, ["--input", sets["one zstd file"][1][0], "--output-prefix", both, "--json-keys", "text", "title",
                      "--append-eod", "--log-interval", "0"] + gpt2_args(a))
    if not check(r.returncode == 0, "--json-keys text title failed:\n%s%s" % (r.stdout, r.stderr)):
        return
    for key in ("text", "title"):
        single = os.path.join(work, "key_" + key)
        r = run_pp(a, 2, ["--input", whole, "--output-prefix", single, "--json-keys", key, "--append-eod",
                          "--log-interval", "0"] + gpt2_args(a))
        check(r.returncode == 0, "--json-keys %s failed:\n%s" % (key, r.stderr))
        if shard_sets_equal(single, both + "_" + key):
            print("ok   --json-keys text title: the '%s' shards equal a run with that key alone" % key)


def errors(a):
    work = fresh(a.work)
    good = [json.dumps({"text": "line %d" % k}) for k in range(300)]
    def write(name, lines):
        p = os.path.join(work, name)
        open(p, "w").write("\n".join(lines) + "\n")
        return p
    bad_json = write("bad.jsonl", good[:2] + ['{"text": "unterminated'] + good[3:])
    bad_late = write("bad_late.jsonl", good[:290] + ["not json at all"] + good[291:])   # rank 1's part
    no_key = write("no_key.jsonl", good[:1] + [json.dumps({"body": "x"})] + good[2:])
    not_str = write("not_str.jsonl", good[:4] + [json.dumps({"text": 5})] + good[5:])
    ok = write("ok.jsonl", good)
    plain = write("plain.txt", ["some text"])
    big = "\n".join(json.dumps({"text": "line %d " % k + "x" * (k % 97)}) for k in range(20000)).encode() + b"\n"
    packed_gz = gzip.compress(big)
    big_path = os.path.join(work, "big.jsonl")
    open(big_path, "wb").write(big)
    trunc_zst = os.path.join(work, "trunc.jsonl.zst")
    if shutil.which("zstd"):
        subprocess.run(["zstd", "-q", "-f", big_path, "-o", trunc_zst + ".full"], check=True)
        open(trunc_zst, "wb").write(open(trunc_zst + ".full", "rb").read()[:-40])
        os.remove(trunc_zst + ".full")
    os.remove(big_path)
    fake_zst = os.path.join(work, "fake.jsonl.zst")
    open(fake_zst, "wb").write(packed_gz)
    bad_gz = os.path.join(work, "bad.jsonl.gz")
    open(bad_gz, "wb").write(packed_gz[:2000] + bytes(64) + packed_gz[2064:])
    trunc_xz = os.path.join(work, "trunc.jsonl.xz")
    open(trunc_xz, "wb").write(lzma.compress(big)[:-100])
    out = os.path.join(work, "out", "x")
    cases = [
        ("invalid JSON", [bad_json], [], "bad.jsonl:3: invalid JSON"),
        ("invalid JSON on rank 1", [bad_late], [], "bad_late.jsonl:291: invalid JSON"),
        ("missing key", [no_key], [], "no_key.jsonl:2: the JSON line has no key 'text'"),
        ("non-string text", [not_str], [], "not_str.jsonl:5: the JSON line has a non-string value under key 'text'"),
        ("other key", [ok], ["--json-keys", "content"], "ok.jsonl:1: the JSON line has no key 'content'"),
        ("missing input", [os.path.join(work, "nope.jsonl")], [], "nope.jsonl' does not exist"),
        ("empty glob", [os.path.join(work, "*.parquet")], [], "matches no file"),
        ("bad vocab", [ok], {"vocab": os.path.join(work, "nope.json")}, "cannot open GPT-2 vocabulary file"),
        ("bad WordPiece vocab", [ok], {"tokenizer": "BertWordPieceLowerCase", "vocab": os.path.join(work, "nope.txt")},
         "WordPiece vocabulary"),
        ("unknown tokenizer", [ok], {"tokenizer": "Foo"}, "unknown --tokenizer-type 'Foo'"),
        ("unknown flag", [ok], ["--frobnicate"], "frobnicate"),
        ("repeated key", [ok], ["--json-keys", "text", "text"], "--json-keys lists 'text' twice"),
        ("plain text with two keys", [ok, plain], ["--json-keys", "text", "title"], "plain.txt' is plain text"),
        ("truncated zstd", [trunc_zst], [], "truncated zstd data"),
        ("gzip named .zst", [fake_zst], [], "not zstd data"),
        ("corrupt gzip", [bad_gz], [], "corrupt gzip data"),
        ("truncated xz", [trunc_xz], [], "truncated xz data"),
    ]
    for name, inputs, extra, expect in cases:
        if not all(os.path.exists(i) for i in inputs) and name == "truncated zstd":
            print("skip %-24s (no zstd tool)" % name)
            continue
        overrides = extra if isinstance(extra, dict) else {}
        extra = extra if isinstance(extra, list) else []
        args = ["--input"] + inputs + ["--output-prefix", out, "--append-eod"] + gpt2_args(a, **overrides) + extra
        try:
            r = run_pp(a, 2, args, timeout=60)
        except subprocess.TimeoutExpired:
            check(False, "%s: preprocess_data hung (no exit within 60 s)" % name)
            continue
        msg = r.stderr
        ok_ = check(r.returncode == 1, "%s: exit status %d, expected 1\n%s" % (name, r.returncode, msg))
        ok_ &= check(expect in msg, "%s: message lacks %r:\n%s" % (name, expect, msg))
        nlines = sum(1 for line in msg.splitlines() if line.startswith("error"))
        ok_ &= check(nlines == 1, "%s: the error should be printed once:\n%s" % (name, msg))
        leftovers = [p for p in glob.glob(os.path.join(work, "out", "*"))]
        ok_ &= check(not leftovers, "%s: files left behind: %s" % (name, leftovers))
        if ok_:
            print("ok   %-24s %s" % (name, msg.strip()))
    r = run_pp(a, 2, ["--help"], timeout=60)
    check(r.returncode == 0 and "--shard-tokens" in r.stdout and r.stdout.count("--shard-tokens") == 1,
          "--help: exit %d, printed once by rank 0:\n%s" % (r.returncode, r.stdout))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["invariance", "compressed", "errors"])
    ap.add_argument("--preprocess", required=True)
    ap.add_argument("--encode-file", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--np-flag", default="-n")
    ap.add_argument("--sample", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    {"invariance": invariance, "compressed": compressed, "errors": errors}[a.mode](a)
    if FAILURES:
        print("check_preprocess.py %s: %d failure(s)" % (a.mode, len(FAILURES)))
        return 1
    print("check_preprocess.py %s: all checks passed" % a.mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
