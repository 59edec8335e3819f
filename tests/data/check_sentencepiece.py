#!/usr/bin/env python3
"""Trident's SentencePiece tokenizer against the SentencePiece command line (the same library:
this checks the integration, not the algorithm, which compare_hf_tokenizers.py checks with the
Hugging Face form of Llama 2's SentencePiece model).

usage: check_sentencepiece.py --tool BIN --sample DIR --work DIR

spm_train (Debian's sentencepiece package) trains a unigram model of 1000 pieces with byte
fallback on the KJV; then every KJV line and a set of single-line adversarial texts (mixed scripts,
emoji, digits, white space, the model's own control strings, invalid UTF-8) are encoded by
tests/data's hf_tokenize (trident::SentencePieceTokenizer: <s> first) and by `spm_encode
--output_format=id --extra_options=bos`, and decoded by both (`spm_decode --input_format=id`):
identical ids and text, line for line. Exit 0 when all agree, 77 when spm_train is not installed.
"""
import argparse
import os
import shutil
import struct
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--sample", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    for prog in ("spm_train", "spm_encode", "spm_decode"):
        if shutil.which(prog) is None:
            print(f"skipped: {prog} is not installed (apt-get install sentencepiece)")
            return 77
    os.makedirs(a.work, exist_ok=True)
    prefix = os.path.join(a.work, "kjv_unigram")
    subprocess.run(["spm_train", f"--input={os.path.join(a.sample, 'kjv.txt')}", f"--model_prefix={prefix}",
                    "--vocab_size=1000", "--model_type=unigram", "--byte_fallback=true", "--character_coverage=1.0",
                    "--input_sentence_size=40000", "--shuffle_input_sentence=false", "--num_threads=1",
                    "--minloglevel=2"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    model = prefix + ".model"
    lines = [l for l in open(os.path.join(a.sample, "kjv.txt"), "rb").read().split(b"\n") if l.strip()][:3000]
    lines += [s.encode("utf-8") for s in (
        "English, Ελληνικά, Русский, العربية, 日本語, 中文, हिन्दी, 😀 👍🏽 👨‍👩‍👧",
        "1 12 123 1234567890 3.14159 ١٢٣ ０１２",
        "tabs\tand  double  spaces\u00a0nbsp\u3000ideographic",
        "<s> </s> <unk> literal control strings",
        "don't DON'T it's", "ﬁ ﬀ e\u0301 Å", "   leading and trailing   ")]
    lines += [b"invalid \xff\xfe bytes \xc3 and \xe2\x82 truncated", b"\x80\x80\x80"]
    docs = os.path.join(a.work, "lines.bin")
    with open(docs, "wb") as f:
        for l in lines:
            f.write(struct.pack("<Q", len(l)) + l)
    txt = os.path.join(a.work, "lines.txt")
    with open(txt, "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    ours_path = os.path.join(a.work, "trident.jsonl")
    subprocess.run([a.tool, "SentencePieceTokenizer", model, docs, ours_path], check=True)
    import json
    ours = [json.loads(l) for l in open(ours_path, encoding="utf-8")]
    enc = subprocess.run(["spm_encode", f"--model={model}", "--output_format=id", "--extra_options=bos",
                          f"--input={txt}"], check=True, stdout=subprocess.PIPE).stdout.decode("utf-8").split("\n")
    theirs = [[int(x) for x in l.split()] for l in enc[:len(lines)]]
    ids_path = os.path.join(a.work, "ids.txt")
    with open(ids_path, "w") as f:
        f.write("\n".join(" ".join(map(str, x["ids"])) for x in ours) + "\n")
    dec = subprocess.run(["spm_decode", f"--model={model}", "--input_format=id", f"--input={ids_path}"], check=True,
                         stdout=subprocess.PIPE).stdout.decode("utf-8").split("\n")[:len(lines)]
    id_bad = [k for k in range(len(lines)) if ours[k]["ids"] != theirs[k]]
    text_bad = [k for k in range(len(lines)) if ours[k]["decoded"] != dec[k]]
    tokens = sum(len(x["ids"]) for x in ours)
    print(f"SentencePiece (unigram, 1000 pieces, byte fallback, trained here on the KJV): {len(lines)} lines, "
          f"{tokens} tokens: {len(id_bad)} id mismatches, {len(text_bad)} decode mismatches against spm_encode / "
          f"spm_decode")
    for k in (id_bad + text_bad)[:5]:
        print(f"  line {k} {lines[k][:80]!r}: Trident {ours[k]['ids'][:12]} {ours[k]['decoded'][:60]!r}; "
              f"spm {theirs[k][:12]} {dec[k][:60]!r}")
    return 0 if not id_bad and not text_bad else 1


if __name__ == "__main__":
    sys.exit(main())
