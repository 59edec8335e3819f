#!/usr/bin/env python3
"""Trident's Hugging Face tokenizer against the JavaScript implementation of the library.

usage: compare_hf_tokenizers.py --tool BIN --sample DIR --work DIR [--node node] [--tokenizers llama2,llama3,qwen3]
                                [--rates] [--gpt2-tool BIN] [--report FILE] [--chapters-every N]

BIN is tests/data's hf_tokenize (trident::HfTokenizer); the reference is @huggingface/tokenizers
(DIR/hf-js/tokenizers.mjs, an npm package written independently of Trident) run by node
(tests/data/hf_tokenize_js.mjs), on the real tokenizer files in DIR/hf/<name>/. Documents: the
1189 chapters of the King James Bible (DIR/kjv.jsonl), and adversarial text: mixed scripts, emoji
(with skin tones, ZWJ sequences, flags), digits in runs, white-space runs of every kind (tabs, NBSP,
U+3000, U+2028, NEL, vertical tab), CR LF and lone CR, literal special-token strings and parts of
them, contractions in every case, combining marks and decomposed Hangul (NFC), code and URLs, long
words, empty and white-space-only documents, invalid UTF-8 (lone continuation bytes, truncated and
overlong sequences, encoded surrogates, bytes above U+10FFFF, FE/FF), and seeded random Unicode.
For each tokenizer, both sides encode every document (with the post-processor's special tokens, the
library's default) and decode the ids; the ids and the decoded text must be identical: 0 mismatches.
With --rates (the measurement of perf/results/hf_tokenizers_*.md), also prints each side's rate over
these documents (tokens/s on one core, after a warm-up pass over them) and, for scale, that of
Trident's GPT-2 BPE on the KJV (tests/data/encode_file, when --gpt2-tool is given). Without it (CTest
tokenizers_hf_vs_js: the rates are no assertion) the JavaScript side encodes each document once,
which halves its time, the most of this comparison's, and --gpt2-tool is not run; CTest also takes
every fourth chapter (--chapters-every 4: 298 chapters, the suite's time).
Exit status 0 when every document agrees; 77 (skipped) with the reason when node or DIR/hf-js is missing.
"""
import argparse
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def adversarial_docs():
    """(name, bytes) of the adversarial documents."""
    docs = []

    def add(name, text):
        docs.append((name, text.encode("utf-8") if isinstance(text, str) else text))

    add("empty", "")
    add("spaces only", "     ")
    add("newlines only", "\n\n\n")
    add("mixed scripts", "English, Ελληνικά, Русский, العربية, עברית, हिन्दी, ไทย, 한국어, 日本語のテキスト, 中文文本, "
        "Tiếng Việt, ქართული, Ꭰ Ꭱ Ꭲ, ᠮᠣᠩᠭᠣᠯ.")
    add("emoji", "I ❤️ 🍕! 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵 🧑🏿‍🚀 ☃ ✔️ 😀😃😄 #️⃣ 🫠")
    add("digits", "1 12 123 1234 12345 123456 1234567890 3.14159265 1,000,000 -42 +7 1e-9 0x1F ١٢٣٤ ０１２３ ²³ ½ "
        "Ⅻ 2024-12-04T17:09:35Z 192.168.0.1 $1,234.56 99%")
    add("white space", "a  b   c\td\t\te\u00a0f\u3000g\u2028h\u2029i\u0085j\u000bk\u000cl \u200bm\u2003n\u202fo"
        "\u205fp\ufeffq   \n  r\t\n\ts   ")
    add("line ends", "one\r\ntwo\r\n\r\nthree\rfour\n\rfive\r\r\nsix\n")
    add("specials", "<s> </s> <unk> <|endoftext|> <|begin_of_text|> <|end_of_text|> <|im_start|>user\nhi<|im_end|> "
        "<think>x</think> <|eot_id|> <s><s></s> <|endof <|endoftext <|im_start |> < s > <S> <|reserved_special_token_3|>"
        "text<|endoftext|>text")
    add("contractions", "don't DON'T Don't it's IT'S we're WE'RE I've I'VE I'm I'M you'll YOU'LL he'd HE'D "
        "'s 'S 'll ''s it’s we’re o'clock rock 'n' roll '''")
    add("combining", "e\u0301 cafe\u0301 Åström n\u0303 \u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af "
        "ﬁ ﬀ Å K Ω ẛ\u0323 \u0958 \u2126 Ǆ ǅ ǆ İstanbul ß ẞ ſ")
    add("code", "def f(x):\n    return x**2  # square\n\nint main() { printf(\"%d\\n\", 42); }\n"
        "for (i = 0; i < n; ++i) {{ a[i] += b[i]; }}\n\t\tif x != y and z >= 3: pass\n<div class=\"a\">&amp;</div>")
    add("urls", "https://example.com/path?q=1&r=two#frag mailto:someone@example.org ftp://a.b/c.d "
        "C:\\Program Files\\x.exe /usr/local/bin/python3")
    add("long words", "Pneumonoultramicroscopicsilicovolcanoconiosis " * 3 + "a" * 300 + " " + "ab" * 200 + " " +
        "€" * 120 + " " + "1" * 64)
    add("punctuation", "...!!!???,,,;;;:::---___***~~~```'''\"\"\"((()))[[[]]]{{{}}}<<<>>>|||///\\\\\\@@@###$$$%%%^^^&&&")
    add("invalid utf-8", b"ok \x80 lone continuation, \xc3 truncated 2, \xe2\x82 truncated 3, \xf0\x9f\x98 "
        b"truncated 4, \xc0\xaf overlong, \xe0\x80\xaf overlong 3, \xed\xa0\x80 surrogate, \xf4\x90\x80\x80 "
        b"above U+10FFFF, \xfe\xff bytes, \xf8\x88\x80\x80\x80 5-byte, end\xc3")
    add("invalid between specials", b"<s>\xff</s>\x80<|endoftext|>\xe2\x82<|im_start|>")
    add("bom and controls", "\ufeffstart \x00 nul \x07 bell \x1b[31mred\x1b[0m \x7f del \u200d zwj \u200c zwnj")
    add("case", "HELLO hello HeLLo ÉCOLE école İI ıi ΣΑΣ σας STRASSE straße")
    # seeded random Unicode from several planes (assigned and unassigned code points, no surrogates)
    rng = random.Random(1234)
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F),
              (0x1100, 0x11FF), (0x2000, 0x206F), (0x3000, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xAFFF),
              (0xFE00, 0xFFFD), (0x1F300, 0x1F6FF), (0x1F900, 0x1F9FF), (0x20000, 0x2001F)]
    for k in range(40):
        chars = []
        for _ in range(rng.randint(1, 200)):
            lo, hi = rng.choice(ranges)
            chars.append(chr(rng.randint(lo, hi)))
            if rng.random() < 0.15:
                chars.append(rng.choice([" ", "  ", "\n", "\t", "'s", "<s>", "1234", "\r\n"]))
        add(f"random {k}", "".join(chars))
    # random bytes (mostly invalid UTF-8)
    for k in range(10):
        add(f"random bytes {k}", bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 120))))
    return docs


def write_docs(path, docs):
    with open(path, "wb") as f:
        for _, b in docs:
            f.write(struct.pack("<Q", len(b)) + b)


def read_out(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def rate(stderr, prefix):
    m = re.search(prefix + r": .* (\d+) tokens/s, ([\d.]+) MB/s", stderr)
    return (int(m.group(1)), float(m.group(2))) if m else (None, None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--sample", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--node", default="node")
    ap.add_argument("--tokenizers", default="llama2,llama3,qwen3")
    ap.add_argument("--rates", action="store_true",
                    help="also measure each side's rate (a warm-up pass, then a timed one) and the GPT-2 BPE's")
    ap.add_argument("--gpt2-tool", help="tests/data's encode_file, for Trident's GPT-2 BPE rate on the KJV (--rates)")
    ap.add_argument("--report")
    ap.add_argument("--chapters-every", type=int, default=1, metavar="N",
                    help="take every N-th KJV chapter (CTest: 4, for the suite's time; the adversarial "
                         "documents are always all taken)")
    a = ap.parse_args()
    if shutil.which(a.node) is None:
        print(f"SKIPPED (77): node ({a.node}) is not installed; the JavaScript library runs on it")
        return 77
    os.makedirs(a.work, exist_ok=True)
    lib = os.path.join(a.sample, "hf-js", "tokenizers.mjs")
    if not os.path.exists(lib):
        print(f"skipped: {lib} is missing (data/prepare_sample.sh fetches it)")
        return 77
    kjv = [("kjv " + json.loads(line)["title"], json.loads(line)["text"].encode("utf-8"))
           for line in open(os.path.join(a.sample, "kjv.jsonl"), encoding="utf-8")][::max(1, a.chapters_every)]
    adv = adversarial_docs()
    docs = kjv + adv
    docs_path = os.path.join(a.work, "docs.bin")
    write_docs(docs_path, docs)
    total_bytes = sum(len(b) for _, b in docs)
    print(f"{len(docs)} documents ({len(kjv)} KJV chapters, {len(adv)} adversarial), {total_bytes} bytes")
    failures, lines = 0, []
    for name in a.tokenizers.split(","):
        d = os.path.join(a.sample, "hf", name)
        ours, theirs = os.path.join(a.work, f"{name}_trident.jsonl"), os.path.join(a.work, f"{name}_js.jsonl")
        p = subprocess.run([a.tool, "HuggingFaceTokenizer", os.path.join(d, "tokenizer.json"), docs_path, ours],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            print(p.stdout, p.stderr)
            return 1
        q = subprocess.run([a.node, os.path.join(HERE, "hf_tokenize_js.mjs"), lib, d, docs_path, theirs] +
                           (["--rate"] if a.rates else []),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if q.returncode != 0:
            print(q.stdout, q.stderr)
            return 1
        r_ours, r_js = rate(p.stderr, "hf_tokenize"), rate(q.stderr, "hf_tokenize_js")
        A, B = read_out(ours), read_out(theirs)
        assert len(A) == len(B) == len(docs), (len(A), len(B), len(docs))
        id_bad = [k for k in range(len(docs)) if A[k]["ids"] != B[k]["ids"]]
        text_bad = [k for k in range(len(docs)) if A[k]["decoded"] != B[k]["decoded"]]
        tokens = sum(len(x["ids"]) for x in A)
        ok = not id_bad and not text_bad
        failures += 0 if ok else 1
        line = (f"{name}: {len(docs)} documents, {tokens} tokens: {len(id_bad)} id mismatches, {len(text_bad)} decode "
                "mismatches")
        if a.rates:
            line += (f"; rate (one core, warm) Trident {r_ours[0]} tokens/s ({r_ours[1]} MB/s), JS {r_js[0]} tokens/s "
                     f"({r_js[1]} MB/s), ratio {r_ours[0] / r_js[0] if r_ours[0] and r_js[0] else float('nan'):.2f}")
        print(line)
        lines.append(line)
        for k in (id_bad + [k for k in text_bad if k not in id_bad])[:6]:
            x, y = A[k]["ids"], B[k]["ids"]
            first = next((i for i in range(min(len(x), len(y))) if x[i] != y[i]), min(len(x), len(y)))
            print(f"  document {k} ({docs[k][0]}): ids differ at {first}: Trident {x[max(0, first - 3):first + 6]} "
                  f"JS {y[max(0, first - 3):first + 6]} (lengths {len(x)}, {len(y)})")
            if A[k]["decoded"] != B[k]["decoded"]:
                print(f"    decoded: Trident {A[k]['decoded'][:160]!r}\n             JS      {B[k]['decoded'][:160]!r}")
    if a.rates and a.gpt2_tool:
        p = subprocess.run([a.gpt2_tool, os.path.join(a.sample, "gpt2", "encoder.json"),
                            os.path.join(a.sample, "gpt2", "vocab.bpe"), os.path.join(a.sample, "kjv.txt"),
                            os.path.join(a.work, "gpt2_ids.txt")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        line = "GPT-2 BPE (Trident, kjv.txt): " + " ".join(l.strip() for l in p.stdout.splitlines() if "tokens/s" in l)
        print(line)
        lines.append(line)
    if a.report:
        with open(a.report, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
