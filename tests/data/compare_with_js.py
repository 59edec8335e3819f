#!/usr/bin/env python3
"""Compares Trident's GPT-2 tokenizer with the independent JavaScript encoder (gpt-3-encoder).

usage: compare_with_js.py --encode-file BIN --sample DIR --work DIR [--node node]

Texts: DIR/kjv.txt (the whole King James Bible as `bible` prints it), a generated stress text
(make_stress_text.py) and real text found on the machine (/usr/share/common-licenses and a
bounded amount of Debian changelogs). For each, the id sequences of build/encode_file and of
node tests/data/encode_js.js must be identical; on a mismatch the first differing position is
printed with the tokens around it. Exit status 0 when all agree.
"""
import argparse
import glob
import gzip
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def byte_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def read_ids(path):
    with open(path) as f:
        return [int(x) for x in f.read().split()]


def show(ids, lo, hi, vocab, bdec):
    out = []
    for k in range(lo, min(hi, len(ids))):
        tok = vocab.get(ids[k])
        raw = bytes(bdec[c] for c in tok) if tok is not None and all(c in bdec for c in tok) else None
        out.append("%d:%d=%r" % (k, ids[k], raw if raw is not None else tok))
    return " ".join(out)


def real_texts(work):
    """Real-world text present on Debian machines (licenses, changelogs), bounded in size."""
    out = []
    lic = sorted(glob.glob("/usr/share/common-licenses/*"))
    lic = [p for p in lic if os.path.isfile(p) and not os.path.islink(p)]
    if lic:
        path = os.path.join(work, "licenses.txt")
        with open(path, "wb") as f:
            for p in lic:
                f.write(open(p, "rb").read())
        out.append(path)
    logs = sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz"))
    if logs:
        path = os.path.join(work, "changelogs.txt")
        total = 0
        with open(path, "wb") as f:
            for p in logs:
                try:
                    data = gzip.open(p).read()
                    data.decode("utf-8")  # the JS reader needs valid UTF-8
                except (OSError, UnicodeDecodeError):
                    continue
                data = data[:20000]
                data = data[: len(data.decode("utf-8", "ignore").encode("utf-8"))]
                f.write(data)
                total += len(data)
                if total > 600000:
                    break
        out.append(path)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--encode-file", required=True)
    ap.add_argument("--sample", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--node", default="node")
    a = ap.parse_args()
    if shutil.which(a.node) is None:
        print("compare_with_js.py: node not found (%s); skipped" % a.node)
        return 77
    os.makedirs(a.work, exist_ok=True)
    vocab_json = os.path.join(a.sample, "gpt2", "encoder.json")
    merges = os.path.join(a.sample, "gpt2", "vocab.bpe")
    encoder_js = os.path.join(a.sample, "gpt2-js", "package", "Encoder.js")
    for p in (vocab_json, merges, encoder_js, os.path.join(a.sample, "kjv.txt")):
        if not os.path.exists(p):
            sys.exit("compare_with_js.py: missing %s (run data/prepare_sample.sh)" % p)
    vocab = {v: k for k, v in json.load(open(vocab_json, encoding="utf-8")).items()}
    bdec = byte_decoder()

    stress = os.path.join(a.work, "stress.txt")
    subprocess.run([sys.executable, os.path.join(HERE, "make_stress_text.py"), stress], check=True)
    texts = [os.path.join(a.sample, "kjv.txt"), stress] + real_texts(a.work)

    failed = 0
    for text in texts:
        name = os.path.basename(text)
        ours, theirs = os.path.join(a.work, name + ".trident.ids"), os.path.join(a.work, name + ".js.ids")
        t0 = time.time()
        r = subprocess.run([a.encode_file, vocab_json, merges, text, ours], capture_output=True, text=True)
        sys.stdout.write(r.stderr)
        if r.returncode != 0:
            print("FAIL %s: encode_file exited %d" % (name, r.returncode))
            failed += 1
            continue
        r = subprocess.run([a.node, os.path.join(HERE, "encode_js.js"), encoder_js, text, theirs], capture_output=True,
                           text=True)
        sys.stdout.write(r.stderr)
        if r.returncode != 0:
            print("FAIL %s: encode_js.js exited %d" % (name, r.returncode))
            failed += 1
            continue
        x, y = read_ids(ours), read_ids(theirs)
        if x == y:
            print("OK   %s: %d bytes, %d identical tokens (%.1f s)" % (name, os.path.getsize(text), len(x),
                                                                      time.time() - t0))
            continue
        failed += 1
        k = next((i for i in range(min(len(x), len(y))) if x[i] != y[i]), min(len(x), len(y)))
        offset = 0
        for i in range(k):
            tok = vocab[x[i]]
            offset += len(bytes(bdec[c] for c in tok)) if all(c in bdec for c in tok) else len(tok.encode())
        print("FAIL %s: %d tokens (Trident) vs %d (JS); first difference at token %d, byte %d of the text"
              % (name, len(x), len(y), k, offset))
        print("  text   : %r" % open(text, "rb").read()[max(0, offset - 40):offset + 60])
        print("  Trident: " + show(x, max(0, k - 5), k + 8, vocab, bdec))
        print("  JS     : " + show(y, max(0, k - 5), k + 8, vocab, bdec))
    print("compare_with_js: %d text(s) agree, %d differ" % (len(texts) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
