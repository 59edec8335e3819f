#!/usr/bin/env python3
"""End-to-end checks of generate_gpt (CTest e2e_generate): a tiny GPT is trained on the sample
corpus for 300 iterations, then

  * greedy and seeded sampling (temperature 0.8, top-k 40, top-p 0.95) with the key-value cache give,
    token for token, what recomputing the whole prefix at every step gives (--no-cache);
  * tp=2 gives the tp=1 tokens (greedy and sampled), and so do batch sizes 1 and 4;
  * the output is the prompt followed by the generated ids decoded through the tokenizer, and
    prompts from --prompt-file (one per line) give what --prompt gives;
  * an empty prompt, a prompt longer than the context, a BERT checkpoint and an unknown option
    are clear errors.

usage: generate_checks.py --build BUILD --shards GLOB --work DIR [--mpiexec M]
"""
import argparse
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from testlib import run, single_error_failures  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = ["In the beginning God created", "And the LORD said unto Moses,", "Blessed are the",
           "Now these are the generations of", "The word of the LORD came"]


def ids_of(out):
    got = {}
    for line in out.splitlines():
        m = re.match(r"ids\[(\d+)\]:(.*)", line)
        if m:
            got[int(m.group(1))] = [int(x) for x in m.group(2).split()]
    assert len(got) == len(PROMPTS), out
    return [got[i + 1] for i in range(len(PROMPTS))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--shards", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    apps = os.path.join(a.build, "apps")
    ck = os.path.join(a.work, "ck")
    run([os.path.join(apps, "pretrain_gpt"), "--deck", os.path.join(ROOT, "inputs", "gpt_tiny_ci.ini"),
         "--data.train_shards", a.shards, "--train.iters", "300", "--eval.interval", "0", "--model.hidden_dropout", "0",
         "--model.attention_dropout", "0", "--checkpoint.save", ck])
    vocab = os.path.join(os.path.dirname(a.shards), "gpt2")
    common = ["--checkpoint", ck, "--vocab-file", os.path.join(vocab, "encoder.json"), "--merge-file",
              os.path.join(vocab, "vocab.bpe"), "--max-new-tokens", "24", "--print-ids", "--ignore-eod"]
    base = list(common)
    for p in PROMPTS:
        base += ["--prompt", p]
    gen = os.path.join(apps, "generate_gpt")

    def generate(np_, *extra):
        cmd = ([a.mpiexec, "-n", str(np_)] if np_ > 1 else []) + [gen] + base + list(extra)
        return run(cmd)[1]

    for mode in (["--greedy"], ["--temperature", "0.8", "--top-k", "40", "--top-p", "0.95", "--seed", "7"]):
        name = "greedy" if mode == ["--greedy"] else "sampled"
        out = generate(1, *mode)
        cached = ids_of(out)
        assert all(len(x) == 24 for x in cached), cached
        for what, other in (("no cache", generate(1, *mode, "--no-cache")), ("tp=2", generate(2, *mode)),
                            ("batch 1", generate(1, *mode, "--batch", "1")),
                            ("batch 4", generate(1, *mode, "--batch", "4"))):
            assert ids_of(other) == cached, f"{name}: {what} differs from the cached tp=1 run"
        distinct = len({t for x in cached for t in x})
        print(f"{name}: 5 prompts x 24 tokens equal with and without the cache, at tp=1 and tp=2, batch 1, 4 and 5 "
              f"({distinct} distinct tokens); first: {out.splitlines()[1][:100]!r}")
        if name == "greedy":
            assert out.splitlines()[1].startswith("[1] " + PROMPTS[0]), out
            prompt_file = os.path.join(a.work, "prompts.txt")
            with open(prompt_file, "w") as f:
                f.write("\n".join(PROMPTS) + "\n")
            from_file = run([gen] + common + ["--prompt-file", prompt_file] + mode)[1]
            assert ids_of(from_file) == cached, "--prompt-file differs from --prompt"
    long_prompt = " ".join(["and"] * 200)
    bad = single_error_failures([
        ("empty prompt", [gen] + base + ["--prompt", ""], "is empty"),
        ("prompt longer than the context", [gen] + base + ["--prompt", long_prompt], "context"),
        ("unknown option", [gen] + base + ["--top-z", "3"], "top-z"),
        ("bad top-p", [gen] + base + ["--top-p", "1.5"], "top-p"),
    ])
    assert not bad, bad
    bert_ck = os.path.join(a.work, "bert_ck")
    sample = os.path.dirname(a.shards)
    run([os.path.join(apps, "pretrain_bert"), "--deck", os.path.join(ROOT, "inputs", "bert_tiny_ci.ini"),
         "--data.train_shards", os.path.join(sample, "kjv_bert_*.h5"), "--data.vocab_file",
         os.path.join(sample, "bert", "vocab.txt"), "--train.iters", "1", "--eval.interval", "0",
         "--checkpoint.save", bert_ck])
    bad = single_error_failures([("BERT checkpoint", [gen] + base[2:] + ["--checkpoint", bert_ck],
                                  "holds a bert model, not gpt")])
    assert not bad, bad
    print("errors: empty prompt, prompt beyond the context, unknown option, bad top-p, BERT checkpoint")
    return 0


if __name__ == "__main__":
    sys.exit(main())
