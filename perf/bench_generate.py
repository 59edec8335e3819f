#!/usr/bin/python3
"""Generation throughput with and without the key-value cache, in the same run (issue 10): runs
generate_gpt on the same prompts, greedy, the same number of new tokens, first with the cache and
then with --no-cache (the whole prefix recomputed at every step), and prints tokens/s and their
ratio; checks that both generated the same tokens. Without --checkpoint it first trains the small
deck (inputs/gpt_small.ini, 4 layers, hidden 128, context 128) for 50 iterations.

  /usr/bin/python3 perf/bench_generate.py [--build build] [--checkpoint DIR] [--new-tokens 96] [--prompts 8]
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
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--np", type=int, default=1)
    ap.add_argument("--out", help="write the table (markdown) here too")
    a = ap.parse_args()
    sample = os.path.join(ROOT, "data", "sample")
    ck = a.checkpoint
    if not ck:
        ck = os.path.join(a.build, "perf", "bench_generate_ck")
        subprocess.run([os.path.join(a.build, "apps", "pretrain_gpt"), "--deck", os.path.join(ROOT, "inputs", "gpt_small.ini"),
                        "--data.train_shards", os.path.join(sample, "kjv_gpt2_*.h5"), "--train.iters", "50",
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
        out = subprocess.run(cmd + extra, check=True, capture_output=True, text=True).stdout
        tps = float(re.search(r"([0-9.]+) tokens/s", out).group(1))
        ids = [l for l in out.splitlines() if l.startswith("ids[")]
        res[name] = (tps, ids)
    same = res["cached"][1] == res["uncached"][1]
    lines = ["| path | tokens/s | ratio |", "|---|---|---|",
             f"| key-value cache | {res['cached'][0]:.1f} | {res['cached'][0] / res['uncached'][0]:.2f} |",
             f"| recompute the prefix (--no-cache) | {res['uncached'][0]:.1f} | 1.00 |"]
    text = (f"generate_gpt, {a.prompts} prompts x {a.new_tokens} new tokens, greedy, np {a.np}; "
            f"same tokens on both paths: {same}\n\n" + "\n".join(lines))
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write("# Generation with and without the key-value cache\n\n" + text + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
