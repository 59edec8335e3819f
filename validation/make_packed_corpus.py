#!/usr/bin/env python3
"""Short documents for the packed-sequence validation cases (validation/*_packed): every sentence
of the sample KJV (data/sample/kjv.jsonl, one chapter per line) becomes a document of its own,
about 5 to 60 GPT-2 tokens, so that a 32-token window holds one or more end-of-document tokens
and packing changes the attention, the positions and the counted targets of most windows. The
documents are tokenized by preprocess_data (GPT-2 BPE, --append-eod) into OUT/kjv_sentences_gpt2_*.h5.

usage: make_packed_corpus.py --sample data/sample --preprocess BUILD/apps/preprocess_data --out DIR
       [--mpiexec mpiexec]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sample", required=True)
    p.add_argument("--preprocess", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--mpiexec", default="mpiexec")
    a = p.parse_args()
    src = os.path.join(a.sample, "kjv.jsonl")
    if not os.path.isfile(src):
        sys.exit("make_packed_corpus: %s is missing (prepare the sample data first)" % src)
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    docs = os.path.join(a.out, "kjv_sentences.jsonl")
    n = 0
    with open(src, encoding="utf-8") as fin, open(docs, "w", encoding="utf-8") as fout:
        for line in fin:
            text = json.loads(line)["text"]
            for sentence in re.split(r"(?<=[.?!])\s+", text):
                if sentence.strip():
                    fout.write(json.dumps({"text": sentence.strip()}) + "\n")
                    n += 1
    gpt2 = os.path.join(a.sample, "gpt2")
    cmd = [a.mpiexec, "-n", "1", a.preprocess, "--input", docs, "--output-prefix",
           os.path.join(a.out, "kjv_sentences_gpt2"), "--tokenizer-type", "GPT2BPETokenizer",
           "--vocab-file", os.path.join(gpt2, "encoder.json"), "--merge-file", os.path.join(gpt2, "vocab.bpe"),
           "--append-eod"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit("make_packed_corpus: preprocess_data failed (exit %d):\n%s" % (r.returncode, r.stdout[-2000:]))
    print("make_packed_corpus: %d sentence documents -> %s/kjv_sentences_gpt2_*.h5" % (n, a.out))


if __name__ == "__main__":
    main()
