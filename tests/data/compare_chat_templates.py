#!/usr/bin/env python3
"""Trident's chat-template renderers and SFT loss masks against independent JavaScript libraries.

usage: compare_chat_templates.py --tool BIN --sample DIR --work DIR [--node node]

BIN is tests/data's sft_render (data/chat_template + data/sft_dataset's tokenize_chat). The
reference (tests/data/chat_template_js.mjs, run by node) renders the real chat_template text of each
tokenizer_config.json with @huggingface/jinja (DIR/hf-jinja), tokenizes the rendering with
@huggingface/tokenizers (DIR/hf-js) and finds the assistant spans by searching the rendering for each
family's turn markers. Tokenizers: Llama 3 (DIR/hf/llama3, the first Llama 3 Instruct template),
Llama 3.1 (DIR/hf/llama3_1, the template with add_generation_prompt), Qwen 3 (DIR/hf/qwen3) and
Mistral NeMo (DIR/hf/mistral_nemo, Mistral's v3 instruct format).
Records: 200 instruction records made from the KJV (validation/make_sft_corpus.py) and adversarial
conversations (white space around contents for Llama's trim, empty turns, emoji and mixed scripts,
CR LF, special-token strings inside contents, Qwen 3's <think> blocks and reasoning_content, a
system message that is not first, roles out of order, several turns, a conversation that ends with
the user). Each record is rendered without add_generation_prompt, and the adversarial ones and 20
of the KJV ones with it too. Must agree: the rendered
text, the token ids and the learned (assistant) mask of every record, and which records are refused.
Records where @huggingface/jinja departs from Python's Jinja (PYTHON_ONLY below) are checked against
the Python result instead. Also: a template Trident does not know (Llama 3's with one character
changed) is refused naming its digest.
Exit 0 when everything agrees; 77 when node or the sample's JavaScript packages are missing.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "validation"))
import make_sft_corpus  # noqa: E402

TEMPLATES = {  # name: (assistant marker, end of turn)
    "llama3": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    "llama3_1": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    "qwen3": ("<|im_start|>assistant\n", "<|im_end|>"),
    "mistral_nemo": ("[/INST]", "</s>"),
}


def msgs(*pairs):
    return {"messages": [{"role": r, "content": c} for r, c in pairs]}


def adversarial():
    u, a, s = "user", "assistant", "system"
    recs = [
        dict(msgs((u, "  padded question \n"), (a, "\n\t answer with space around \u00a0\u3000 ")), id="padded"),
        msgs((u, "empty answer next"), (a, "")),
        msgs((u, ""), (a, "answer to nothing")),
        msgs((u, "Emoji 👨‍👩‍👧‍👦 🇫🇷 and scripts: Ελληνικά, العربية, 日本語"), (a, "Réponse: ✔️ 한국어 १२३")),
        msgs((u, "line\r\nends\rand\n\nnewlines\n"), (a, "one\r\ntwo\n\n\nthree")),
        msgs((u, "specials inside: <|endoftext|> <s> <think> [INST] <|begin_of_text|>"),
             (a, "literal <|end_of_text|> and <tool_call> text")),
        msgs((s, "Be brief."), (u, "q1"), (a, "a1"), (u, "q2"), (a, "a2"), (u, "q3"), (a, "a3")),
        msgs((u, "q1"), (a, "<think>\nfirst thoughts\n</think>\n\nfirst answer"), (u, "q2"),
             (a, "<think>\nsecond thoughts\n</think>\n\nsecond answer")),
        msgs((u, "q"), (a, "\n\n<think>\n\nreasoning\n\n</think>\n\n\nanswer after newlines")),
        dict(msgs((u, "q"), (a, "no think but a </think> close only")), id="close-only"),
        {"messages": [{"role": "user", "content": "q1"},
                      {"role": "assistant", "content": "a1", "reasoning_content": "kept only after the last query"},
                      {"role": "user", "content": "q2"},
                      {"role": "assistant", "content": "a2", "reasoning_content": "\nthe final reasoning\n"}]},
        msgs((u, "q1"), (a, "a1"), (s, "a system turn in the middle"), (u, "q2"), (a, "a2")),
        dict(msgs((u, "q1"), (u, "q2 right after"), (a, "a")), id="user-user"),
        msgs((a, "the assistant speaks first"), (u, "then the user"), (a, "and again")),
        msgs((u, "q1"), (a, "a1"), (u, "a question left open")),
        msgs((u, "<tool_response>\nnot really a tool\n</tool_response>"), (a, "after the fake tool response")),
        {"prompt": "a prompt", "response": "a response"},
        {"system": "A system line.", "prompt": "prompted", "response": "responded"},
    ]
    return recs


# Where @huggingface/jinja 0.5.13 departs from Python's Jinja (jinja2, what transformers'
# apply_chat_template runs), Trident follows Python; these records are checked against the Python
# result written out here instead of against the reference:
#   - str.strip / lstrip / rstrip with an argument (Qwen 3's .lstrip('\n'), .strip('\n')): the
#     library strips all white space (JavaScript's trim), Python only the characters given;
#   - selectattr("tool_calls", "undefined") (Mistral's role-alternation check): the library keeps
#     no message, so roles out of order render instead of raising the template's exception.
PYTHON_ONLY = {
    ("qwen3", "padded"): {"text": "<|im_start|>user\n  padded question \n<|im_end|>\n<|im_start|>assistant\n<think>\n\n"
                                  "</think>\n\n\t answer with space around \u00a0\u3000 <|im_end|>\n"},
    ("qwen3", "close-only"): {"text": "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nno think but a \n"
                                      "</think>\n\n close only<|im_end|>\n"},
    ("mistral_nemo", "user-user"): {"error": "After the optional system message, conversation roles must alternate "
                                             "user/assistant/user/assistant/..."},
}


def run(cmd, what):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit("%s failed (exit %d):\n%s%s" % (what, r.returncode, r.stdout[-3000:], r.stderr[-3000:]))
    return r


def read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(x) for x in f if x.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--sample", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--node", default="node")
    a = ap.parse_args()
    jinja = os.path.join(a.sample, "hf-jinja", "index.js")
    tokjs = os.path.join(a.sample, "hf-js", "tokenizers.mjs")
    if not a.node or shutil.which(a.node) is None:
        print(f"SKIPPED (77): node ({a.node}) is not installed; the reference libraries run on it")
        return 77
    for f in (jinja, tokjs):
        if not os.path.isfile(f):
            print("SKIP: %s is missing (data/prepare_sample.sh fetches it)" % f)
            return 77
    os.makedirs(a.work, exist_ok=True)
    records = []
    with open(os.path.join(a.sample, "kjv.jsonl"), encoding="utf-8") as f:
        for k, line in enumerate(f):
            records.extend(make_sft_corpus.records(json.loads(line)["text"]))
            if len(records) >= 200:
                break
    records = records[:200] + adversarial()
    rec_path = os.path.join(a.work, "records.jsonl")
    with open(rec_path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    # with the generation prompt: the adversarial records and the first 20 KJV ones (suite time)
    gen_records = records[:20] + records[200:]
    gen_path = os.path.join(a.work, "records_gen.jsonl")
    with open(gen_path, "w", encoding="utf-8") as f:
        for r in gen_records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")

    failures = []
    for name, (marker, end) in TEMPLATES.items():
        d = os.path.join(a.sample, "hf", name)
        for gen in (False, True):
            flag = ["--generation-prompt"] if gen else []
            recs, path = (gen_records, gen_path) if gen else (records, rec_path)
            ours, theirs = (os.path.join(a.work, "%s%s.%s.jsonl" % (name, "_gen" if gen else "", w))
                            for w in ("trident", "js"))
            r = run([a.tool, d, path, ours] + flag, "sft_render " + name)
            run([a.node, os.path.join(HERE, "chat_template_js.mjs"), jinja, tokjs, d, path, theirs, marker, end]
                + flag, "chat_template_js " + name)
            A, B = read(ours), read(theirs)
            if len(A) != len(B) or len(A) != len(recs):
                failures.append("%s: %d Trident lines, %d reference lines, %d records" %
                                (name, len(A), len(B), len(recs)))
                continue
            bad = refused = tokens = learned = python_only = 0
            for i, (x, y) in enumerate(zip(A, B)):
                want = PYTHON_ONLY.get((name, recs[i].get("id")))
                if want is not None:
                    python_only += 1
                    if "error" in want:
                        ok = x.get("error") == want["error"]
                    else:
                        ok = x.get("text") == want["text"] + ("<|im_start|>assistant\n" if gen else "")
                    if not ok:
                        bad += 1
                        failures.append("%s record %d: Trident gives %r, Python's Jinja %r" % (name, i + 1, x, want))
                    continue
                if ("error" in x) != ("error" in y):
                    bad += 1
                    failures.append("%s record %d: Trident %s, the reference %s" % (
                        name, i + 1, "refuses (%s)" % x["error"] if "error" in x else "renders",
                        "refuses (%s)" % y["error"] if "error" in y else "renders"))
                    continue
                if "error" in x:
                    refused += 1
                    continue
                for key in ("text", "ids", "learned"):
                    if x[key] != y[key]:
                        bad += 1
                        failures.append("%s%s record %d: %s differs\n  Trident:   %r\n  reference: %r" % (
                            name, " (generation prompt)" if gen else "", i + 1, key, x[key], y[key]))
                        break
                tokens += len(x["ids"])
                learned += sum(x["learned"])
            print("%-13s %-18s %s: %d records (%d refused by both, %d checked against Python's Jinja), %d tokens, "
                  "%d learned: %d mismatches" % (
                      name, r.stderr.strip().replace("sft_render: ", ""),
                      "generation prompt" if gen else "training         ", len(recs), refused, python_only, tokens,
                      learned, bad))
    # a template Trident does not know (Llama 3's with one character changed) is refused by its digest
    other = os.path.join(a.work, "edited_template")
    os.makedirs(other, exist_ok=True)
    with open(os.path.join(a.sample, "hf", "llama3", "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["chat_template"] = cfg["chat_template"].replace("| trim", "|trim")
    with open(os.path.join(other, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    if not os.path.exists(os.path.join(other, "tokenizer.json")):
        os.symlink(os.path.abspath(os.path.join(a.sample, "hf", "llama3", "tokenizer.json")),
                   os.path.join(other, "tokenizer.json"))
    q = subprocess.run([a.tool, other, rec_path, os.path.join(a.work, "edited.jsonl")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if q.returncode != 1 or "unknown chat template (sha256 " not in q.stderr:
        failures.append("an edited template: expected exit 1 and 'unknown chat template (sha256 ...', got %d: %s" %
                        (q.returncode, q.stderr.strip()))
    else:
        print("edited Llama 3 template: refused: %s" % q.stderr.strip()[:200])
    if failures:
        print("\nFAILED (%d):\n%s" % (len(failures), "\n".join(failures[:30])))
        return 1
    print("OK: every rendering, token and mask agrees with @huggingface/jinja + @huggingface/tokenizers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
