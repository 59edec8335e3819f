#!/usr/bin/python3
"""Generation throughput with and without the key-value cache, in the same run: runs
generate_gpt on the same prompts, greedy, the same number of new tokens, first with the cache and
then with --no-cache (the whole prefix recomputed at every step), and prints tokens/s and their
ratio; checks that both generated the same tokens. Without --checkpoint it first trains the small
deck (inputs/gpt_small.ini, 4 layers, hidden 128, context 128) for 50 iterations.

--smoke (CTest perf_smoke's perf_generate_smoke): every piece on a tiny shape, to show that the
benchmark runs: the tiny CI deck trained for 1 iteration, 2 prompts x 4 new tokens; exit 0 when
both paths ran and printed their rate and one line of ids per prompt. The tokens are not compared
there (an untrained model's near-ties; the cache's correctness is e2e_generate's check).

  /usr/bin/python3 perf/bench_generate.py [--build build] [--checkpoint DIR] [--new-tokens 96] [--prompts 8] [--smoke]
"""
import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--checkpoint")
    ap.add_argument("--new-tokens", type=int)
    ap.add_argument("--prompts", type=int)
    ap.add_argument("--smoke", action="store_true", help="the tiny shape, no comparison of the tokens (CTest)")
    ap.add_argument("--np", type=int, default=1)
    ap.add_argument("--out", help="write the table (markdown) here too")
    a = ap.parse_args()
    if a.new_tokens is None:
        a.new_tokens = 4 if a.smoke else 96
    if a.prompts is None:
        a.prompts = 2 if a.smoke else 8
    sample = os.path.join(ROOT, "data", "sample")
    ck = a.checkpoint
    if not ck:
        ck = os.path.join(a.build, "perf", "bench_generate_smoke_ck" if a.smoke else "bench_generate_ck")
        deck, iters = ("gpt_tiny_ci.ini", "1") if a.smoke else ("gpt_small.ini", "50")
        subprocess.run([os.path.join(a.build, "apps", "pretrain_gpt"), "--deck", os.path.join(ROOT, "inputs", deck),
                        "--data.train_shards", os.path.join(sample, "kjv_gpt2_*.h5"), "--train.iters", iters,
                        "--eval.interval", "0", "--checkpoint.save", ck, "--checkpoint.overwrite", "true",
                        "--log.metrics_file="],  # its own scratch checkpoint, remade each time
                       check=True, capture_output=True)
    prompts = ["In the beginning", "And it came to pass", "The LORD is my shepherd", "Blessed are",
               "And God said", "Now the serpent was", "Hear, O Israel", "For God so loved"]
    cmd = [os.path.join(a.build, "apps", "generate_gpt"), "--checkpoint", ck,
           "--vocab-file", os.path.join(sample, "gpt2", "encoder.json"),
           "--merge-file", os.path.join(sample, "gpt2", "vocab.bpe"), "--greedy", "--ignore-eod", "--print-ids",
           "--max-new-tokens", str(a.new_tokens), "--batch", str(a.prompts)]
    for i in range(a.prompts):
        cmd += ["--prompt", prompts[i % len(prompts)]]
    if a.np > 1:
        cmd = ["mpiexec", "-n", str(a.np)] + cmd
    res = {}
    for name, extra in (("cached", []), ("uncached", ["--no-cache"])):
        # an untrained model's tokens need not decode to UTF-8: read the text leniently
        out = subprocess.run(cmd + extra, check=True, capture_output=True, text=True, errors="replace").stdout
        rate = re.search(r"([0-9.]+) tokens/s", out)
        ids = [l for l in out.splitlines() if l.startswith("ids[")]
        if not rate or len(ids) != a.prompts:
            print(f"{name}: no rate or not {a.prompts} lines of ids in the output:\n{out[-2000:]}")
            return 1
        res[name] = (float(rate.group(1)), ids)
    same = "not compared (--smoke)" if a.smoke else res["cached"][1] == res["uncached"][1]
    lines = ["| path | tokens/s | ratio |", "|---|---|---|",
             f"| key-value cache | {res['cached'][0]:.1f} | {res['cached'][0] / res['uncached'][0]:.2f} |",
             f"| recompute the prefix (--no-cache) | {res['uncached'][0]:.1f} | 1.00 |"]
    text = (f"generate_gpt, {a.prompts} prompts x {a.new_tokens} new tokens, greedy, np {a.np}; "
            f"same tokens on both paths: {same}\n\n" + "\n".join(lines))
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write("# Generation with and without the key-value cache\n\n" + text + "\n")
    return 0 if a.smoke or same else 1


if __name__ == "__main__":
    sys.exit(main())
