#!/usr/bin/env python3
"""Instruction data for the fine-tuning tests and validation cases, made from the sample KJV
(data/sample/kjv.jsonl, one chapter per line): JSON lines of chat records in the forms Trident reads
(docs/DESIGN.md "Instruction fine-tuning"), deterministic, in three kinds that a small model learns
quickly because the answers follow from the prompts:
  continue   {"prompt": "Continue the verse: <first words>", "response": "<the rest of the sentence>"}
  last word  {"messages": [system, user "Which word ends this sentence? <sentence without it>",
              assistant "<the word>"]}
  two turns  {"messages": [user "Say the sentence after this one: <s1>", assistant "<s2>",
              user "And the one after that?", assistant "<s3>"]}
Chapters whose index is a multiple of 10 give the held-out file, the others the training file.

usage: make_sft_corpus.py --sample data/sample --out DIR [--train N] [--valid N]
writes DIR/sft_train.jsonl and DIR/sft_valid.jsonl (at most N records each)
"""
import argparse
import json
import os
import re
import sys

SYSTEM = "You answer with words from the King James Bible."


def records(chapter_text):
    sentences = [s.strip() for s in re.split(r"(?<=[.?!])\s+", chapter_text) if s.strip()]
    out = []
    for i, s in enumerate(sentences):
        words = s.split()
        kind = i % 3
        if kind == 0 and len(words) >= 6:
            cut = len(words) // 2
            out.append({"prompt": "Continue the verse: " + " ".join(words[:cut]),
                        "response": " ".join(words[cut:])})
        elif kind == 1 and len(words) >= 4:
            out.append({"messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Which word ends this sentence? " + " ".join(words[:-1])},
                {"role": "assistant", "content": words[-1].strip(".,;:?!")}]})
        elif kind == 2 and i + 2 < len(sentences) and max(len(sentences[i + k].split()) for k in range(3)) <= 30:
            out.append({"messages": [
                {"role": "user", "content": "Say the sentence after this one: " + s},
                {"role": "assistant", "content": sentences[i + 1]},
                {"role": "user", "content": "And the one after that?"},
                {"role": "assistant", "content": sentences[i + 2]}]})
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sample", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--train", type=int, default=2000)
    p.add_argument("--valid", type=int, default=200)
    a = p.parse_args()
    src = os.path.join(a.sample, "kjv.jsonl")
    if not os.path.isfile(src):
        sys.exit("make_sft_corpus: %s is missing (prepare the sample data first)" % src)
    os.makedirs(a.out, exist_ok=True)
    train, valid = [], []
    with open(src, encoding="utf-8") as fin:
        for k, line in enumerate(fin):
            (valid if k % 10 == 0 else train).extend(records(json.loads(line)["text"]))
            if len(train) >= a.train and len(valid) >= a.valid:
                break
    for name, recs, n in (("sft_train.jsonl", train, a.train), ("sft_valid.jsonl", valid, a.valid)):
        with open(os.path.join(a.out, name), "w", encoding="utf-8") as f:
            for r in recs[:n]:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print("make_sft_corpus: %d training and %d held-out records in %s" %
          (min(len(train), a.train), min(len(valid), a.valid), a.out))


if __name__ == "__main__":
    main()
