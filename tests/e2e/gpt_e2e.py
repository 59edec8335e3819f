#!/usr/bin/env python3
"""End-to-end checks of pretrain_gpt on the sample corpus (run by CTest).

usage: gpt_e2e.py CHECK --app PRETRAIN_GPT --deck DECK --shards GLOB --work DIR [--mpiexec M]

Checks:
  train        20 iterations learn (loss falls), metrics file complete, checkpoint + latest written,
               each save's stall printed and shown apart on the next progress line
  resume       10 iterations straight vs 5 + resume 5: identical losses (bitwise) and final weights
  dp2          np=2 (dp=2) equals np=1 at the same global batch: per-step loss rel. diff <= 1e-5
  eval         evaluation mode prints 'eval loss:' and agrees with the windows' loss recomputed
               by validation/gpt_reference.py (PyTorch) from the same checkpoint
  preempt      time limits and preemption without Slurm: SIGUSR1 sent to ONE of 2 ranks mid-run
               makes both write a checkpoint at the next iteration boundary and exit 3; the same
               command with --checkpoint.load auto resumes and ends with the uninterrupted run's
               losses (bitwise); SIGTERM likewise; auto on an empty save directory starts fresh;
               without checkpoint.save a signal exits 4
  finetune     a model pretrained on the KJV at tp=2 is fine-tuned at tp=1 on another corpus (this
               repository's Markdown documentation, tokenized here by preprocess_data): weights only
               (iteration, optimizer and schedule start afresh; a step at lr 0 leaves every tensor
               equal to the pretrained one), and the loss falls; fine-tuning from a BERT checkpoint, or
               without checkpoint.load, is a clear error
Faults and bad input (the checks that were bad_input, outputs and diverge here) are in
tests/faults/fault_suite.py.
"""
import csv
import glob
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from testlib import check_main, run, single_error_failures  # noqa: E402


def read_metrics(path):
    with open(path) as f:
        return list(csv.DictReader(f))


class Ctx:
    def __init__(self, a):
        self.app, self.deck, self.shards, self.mpiexec = a.app, a.deck, a.shards, a.mpiexec
        self.work = a.work
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)

    def cmd(self, np_, *extra):
        base = [self.app, "--deck", self.deck, "--data.train_shards", self.shards]
        if np_ > 1 or self.mpiexec:
            base = [self.mpiexec or "mpiexec", "-n", str(np_)] + base
        return base + list(extra)

    def path(self, *p):
        return os.path.join(self.work, *p)


def check_train(c):
    m = c.path("m.csv")
    _, out, dt = run(c.cmd(1, "--train.iters", "20", "--log.metrics_file", m, "--checkpoint.save", c.path("ck"),
                           "--eval.interval", "10", "--checkpoint.interval", "5"))
    rows = read_metrics(m)
    assert len(rows) == 20, f"{len(rows)} metric rows"
    cols = "iteration,consumed_samples,loss,lr,grad_norm,loss_scale,skipped,ms_per_iter,tokens_per_s,tflops_per_rank,mfu"
    assert list(rows[0].keys()) == cols.split(","), rows[0].keys()
    first = sum(float(r["loss"]) for r in rows[:3]) / 3
    last = sum(float(r["loss"]) for r in rows[-3:]) / 3
    print(f"loss first3 {first:.4f} last3 {last:.4f} ({dt:.1f} s)")
    assert last < first - 0.3, "loss did not fall"
    assert open(c.path("ck", "latest")).read().strip() == "20"
    assert os.path.exists(c.path("ck", "iter_0000020", "checkpoint.h5"))
    assert "validation at iteration 20" in out, out
    assert os.path.exists(c.path("m.eval.csv"))
    assert "ETA" in out
    # each save reports its stall, and the next progress line shows it apart from ms/it (saves after
    # iterations 5, 10, 15: the lines of iterations 10, 15, 20; log.interval 5)
    import re
    stalls = re.findall(r"saved checkpoint \S+ in ([0-9.]+) s \(training waited; ", out)
    shown = re.findall(r" iter +\d+/20 .*\| checkpoint save ([0-9.]+) s \| ETA", out)
    assert len(stalls) == 4 and shown == stalls[:3], (stalls, shown)


def check_resume(c):
    a, b = c.path("a.csv"), c.path("b.csv")
    run(c.cmd(1, "--train.iters", "10", "--log.metrics_file", a, "--checkpoint.save", c.path("cka")))
    run(c.cmd(1, "--train.iters", "10", "--log.metrics_file", b, "--checkpoint.save", c.path("ckb"),
              "--checkpoint.interval", "5"))
    # simulate an interrupted run: drop iterations after 5, then resume
    shutil.rmtree(c.path("ckb", "iter_0000010"))
    with open(c.path("ckb", "latest"), "w") as f:
        f.write("5\n")
    run(c.cmd(1, "--train.iters", "10", "--log.metrics_file", b, "--checkpoint.save", c.path("ckb"),
              "--checkpoint.load", c.path("ckb")))
    ra, rb = read_metrics(a), read_metrics(b)
    assert [r["iteration"] for r in rb] == [str(i) for i in range(1, 11)], [r["iteration"] for r in rb]
    for x, y in zip(ra, rb):
        assert x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"] and x["consumed_samples"] == y["consumed_samples"], (x, y)
    import h5py
    import numpy as np
    with h5py.File(c.path("cka", "iter_0000010", "checkpoint.h5")) as fa, \
         h5py.File(c.path("ckb", "iter_0000010", "checkpoint.h5")) as fb:
        names = []
        fa.visit(lambda n: names.append(n) if isinstance(fa[n], h5py.Dataset) else None)
        assert len(names) > 10
        for n in names:
            assert np.array_equal(fa[n][()], fb[n][()]), n
    print("resume: losses and final weights identical over", len(ra), "iterations")


def check_dp2(c):
    a, b = c.path("dp1.csv"), c.path("dp2.csv")
    run(c.cmd(1, "--train.iters", "10", "--log.metrics_file", a))
    # without OMP_NUM_THREADS (whatever the caller's environment exports) the ranks share the node's
    # cores among themselves: no oversubscription warning
    default_threads = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    _, out, _ = run(c.cmd(2, "--train.iters", "10", "--log.metrics_file", b), env=default_threads)
    # the distributed optimizer is the default at dp > 1 (docs/DESIGN.md, optim.distributed = auto)
    assert "distributed (ZeRO-1)" in out, "dp=2 did not run the distributed optimizer by default"
    assert "oversubscribe" not in out, out
    # 2 ranks x as many threads as the node has cores: the run says that it oversubscribes the node
    cores = os.sysconf("SC_NPROCESSORS_ONLN")
    _, out, _ = run(c.cmd(2, "--train.iters", "1", "--log.metrics_file", c.path("dp2_threads.csv")),
                    env=dict(os.environ, OMP_NUM_THREADS=str(max(2, cores))))
    assert f"2 ranks x OMP_NUM_THREADS={max(2, cores)} threads on a node of" in out and "oversubscribe" in out, out
    print("dp=2: the distributed optimizer by default; an oversubscribing thread count is warned about")
    worst = 0.0
    for x, y in zip(read_metrics(a), read_metrics(b)):
        la, lb = float(x["loss"]), float(y["loss"])
        rel = abs(la - lb) / abs(la)
        worst = max(worst, rel)
        print(f"iter {x['iteration']:>3}  dp1 {la:.7f}  dp2 {lb:.7f}  rel {rel:.2e}")
    assert worst <= 1e-5, f"dp=2 differs from dp=1 by {worst:.2e}"


def check_eval(c):
    run(c.cmd(1, "--train.iters", "5", "--checkpoint.save", c.path("ck")))
    shard = sorted(glob.glob(c.shards))[-1]
    _, out, _ = run(c.cmd(2, "--checkpoint.load", c.path("ck"), "--eval.only", "true", "--eval.shard", shard,
                          "--eval.windows", "7"))
    line = [l for l in out.splitlines() if l.startswith("eval loss:")]
    assert len(line) == 1, out
    ours = float(line[0].split(":")[1])
    ref_script = os.path.join(ROOT, "validation", "gpt_reference.py")
    _, rout, _ = run(["/usr/bin/python3", ref_script, "eval", "--checkpoint", c.path("ck", "iter_0000005", "checkpoint.h5"),
                      "--shard", shard, "--windows", "7"])
    ref = float([l for l in rout.splitlines() if l.startswith("eval loss:")][0].split(":")[1])
    rel = abs(ours - ref) / abs(ref)
    print(f"eval loss: trident {ours:.7f}  pytorch {ref:.7f}  rel {rel:.2e}")
    assert rel <= 1e-5
    # the same windows scored through a 2-stage pipeline
    _, out, _ = run(c.cmd(2, "--checkpoint.load", c.path("ck"), "--eval.only", "true", "--eval.shard", shard,
                          "--eval.windows", "7", "--parallel.pp", "2"))
    piped = float([l for l in out.splitlines() if l.startswith("eval loss:")][0].split(":")[1])
    print(f"eval loss with pp=2: {piped:.7f}")
    assert abs(piped - ours) <= 1e-6 * abs(ours)


def run_until_signalled(cmd, metrics, sig, rank_marker, after_rows=5, timeout=300):
    """Starts cmd, waits until `metrics` has after_rows rows, sends `sig` to one rank process (the
    one whose command line holds rank_marker, the metrics path: all ranks do, the first found
    gets it) and returns (exit code, output)."""
    import signal
    import subprocess
    import time
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t0 = time.time()
    while time.time() - t0 < timeout:
        if os.path.exists(metrics) and len(read_metrics(metrics)) >= after_rows:
            break
        if p.poll() is not None:
            raise AssertionError("the run ended before the signal:\n" + p.stdout.read())
        time.sleep(0.05)
    pids = subprocess.run(["pgrep", "-f", "--", rank_marker], capture_output=True, text=True).stdout.split()
    apps = [int(x) for x in pids if os.path.basename(os.readlink(f"/proc/{x}/exe")).startswith("pretrain_")]
    assert apps, f"no rank process found for {rank_marker}"
    os.kill(apps[0], sig)
    out, _ = p.communicate(timeout=timeout)
    print(f"sent {signal.Signals(sig).name} to rank process {apps[0]} of {len(apps)}; exit code {p.returncode}")
    return p.returncode, out


def check_preempt(c):
    import signal
    n = 120  # long enough that the signal (after 5 metric rows) arrives well before the end
    iters = ["--train.iters", str(n), "--optim.decay_iters", str(n), "--eval.interval", "0", "--log.interval", "50"]
    ref = c.path("ref.csv")
    run(c.cmd(2, *iters, "--log.metrics_file", ref))
    want = [r["loss"] for r in read_metrics(ref)]
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        name = signal.Signals(sig).name
        m, ck = c.path(f"{name}.csv"), c.path(f"ck_{name}")
        cmd = c.cmd(2, *iters, "--log.metrics_file", m, "--checkpoint.save", ck, "--checkpoint.load", "auto")
        rc, out = run_until_signalled(cmd, m, sig, m)
        assert rc == 3, f"{name}: exit code {rc}, expected 3\n{out}"
        assert f"received {name}: stopped after iteration" in out and "exit code 3" in out, out
        stopped = int(open(os.path.join(ck, "latest")).read())
        assert 5 <= stopped < n, stopped
        _, out2, _ = run(cmd)
        assert f"resumed from" in out2 and f"at iteration {stopped}" in out2, out2
        got = read_metrics(m)
        assert [r["iteration"] for r in got] == [str(i) for i in range(1, n + 1)], "metrics rows not continuous"
        assert [r["loss"] for r in got] == want, f"{name}: resumed losses differ from the uninterrupted run"
        print(f"{name}: stopped after iteration {stopped} with exit code 3, resumed with --checkpoint.load auto; "
              f"all {n} losses equal the uninterrupted run bit for bit")
    # auto with nothing saved yet starts from scratch; a signal without checkpoint.save exits 4
    _, out, _ = run(c.cmd(1, "--train.iters", "2", "--checkpoint.save", c.path("fresh"), "--checkpoint.load", "auto"))
    assert "starting from scratch" in out, out
    m = c.path("nosave.csv")
    rc, out = run_until_signalled(c.cmd(1, *iters, "--log.metrics_file", m), m, signal.SIGUSR1, m)
    assert rc == 4 and "without a checkpoint" in out, (rc, out)
    print("auto on an empty save directory starts fresh; a signal without checkpoint.save exits 4")


def check_finetune(c):
    pre = c.path("pre")
    run(c.cmd(2, "--parallel.tp", "2", "--train.iters", "60", "--eval.interval", "0", "--checkpoint.save", pre))
    docs = [os.path.join(ROOT, p) for p in ("README.md", "data/README.md", "inputs/README.md", "validation/README.md",
                                            "perf/README.md", "jobscripts/README.md")]
    docs += [os.path.join(ROOT, "docs", p) for p in ("training.md", "data.md", "checkpoints.md", "cluster.md",
                                                     "reliability.md", "building.md", "testing.md", "code-map.md")]
    vocab = os.path.join(os.path.dirname(c.shards), "gpt2")
    prep = os.path.join(os.path.dirname(c.app), "preprocess_data")
    run([prep, "--input", *docs, "--output-prefix", c.path("docs"), "--tokenizer-type", "GPT2BPETokenizer",
         "--vocab-file", os.path.join(vocab, "encoder.json"), "--merge-file", os.path.join(vocab, "vocab.bpe"),
         "--append-eod"])
    corpus = c.path("docs_*.h5")
    common = ["--data.train_shards", corpus, "--data.split", "1,0,0", "--train.iters", "40", "--eval.interval", "0",
              "--optim.warmup_iters", "2", "--model.hidden_dropout", "0", "--model.attention_dropout", "0"]
    fresh_m, tuned_m = c.path("fresh.csv"), c.path("tuned.csv")
    run(c.cmd(1, *common, "--log.metrics_file", fresh_m))
    _, out, _ = run(c.cmd(1, *common, "--log.metrics_file", tuned_m, "--checkpoint.load", pre, "--checkpoint.finetune",
                          "true", "--checkpoint.save", c.path("tuned")))
    assert "fine-tuning from" in out and "iteration 60" in out and "weights only" in out, out
    fresh, tuned = read_metrics(fresh_m), read_metrics(tuned_m)
    assert [r["iteration"] for r in tuned] == [str(i) for i in range(1, 41)], "the iterations did not restart at 1"
    assert tuned[0]["consumed_samples"] == "4", tuned[0]
    assert float(tuned[0]["lr"]) < float(tuned[2]["lr"]), "the warm-up did not restart"
    f0, t0 = float(fresh[0]["loss"]), float(tuned[0]["loss"])
    first = sum(float(r["loss"]) for r in tuned[:5]) / 5
    last = sum(float(r["loss"]) for r in tuned[-5:]) / 5
    print(f"fine-tuning on the documentation: first loss {t0:.3f} (a fresh model on the same batch: {f0:.3f}); "
          f"mean of the first 5 "
          f"{first:.3f}, of the last 5 {last:.3f}")
    # the weights are the pretrained ones (saved at tp=2, loaded at tp=1): one step at lr 0 keeps them
    run(c.cmd(1, *common, "--train.iters", "1", "--optim.lr", "0", "--optim.min_lr", "0", "--checkpoint.load", pre,
              "--checkpoint.finetune", "true", "--checkpoint.save", c.path("lr0")))
    import h5py
    import numpy as np
    with h5py.File(c.path("pre", "iter_0000060", "checkpoint.h5")) as a, \
            h5py.File(c.path("lr0", "iter_0000001", "checkpoint.h5")) as b:
        names = []
        a["model"].visit(lambda k: names.append(k) if isinstance(a["model"][k], h5py.Dataset) else None)
        for k in names:
            assert np.array_equal(a["model"][k][()], b["model"][k][()]), f"fine-tuning did not start from {k}"
    print(f"the fine-tuning run starts from the pretrained weights ({len(names)} tensors equal after a step at lr 0)")
    assert last < first - 0.3, "the loss did not fall while fine-tuning"
    assert open(c.path("tuned", "latest")).read().strip() == "40"
    # a resubmitted fine-tuning job continues its own checkpoints instead of starting over
    _, out, _ = run(c.cmd(1, *common, "--train.iters", "42", "--optim.decay_iters", "40",
                          "--log.metrics_file", tuned_m, "--checkpoint.load", pre, "--checkpoint.finetune", "true",
                          "--checkpoint.save", c.path("tuned")))
    assert "holds this run's checkpoints" in out and "at iteration 40" in out, out
    bad = single_error_failures([
        ("fine-tune from BERT", c.cmd(1, *common, "--checkpoint.finetune", "true", "--checkpoint.load",
                                      c.path("bert_ck")), "holds a bert model, not gpt"),
        ("fine-tune without load", c.cmd(1, *common, "--checkpoint.finetune", "true"), "checkpoint.finetune"),
    ], timeout=120) if _make_bert_checkpoint(c) else ["could not make a BERT checkpoint"]
    assert not bad, bad


def _make_bert_checkpoint(c):
    """A tiny BERT checkpoint (pretrain_bert beside pretrain_gpt) for the wrong-kind error."""
    bert = os.path.join(os.path.dirname(c.app), "pretrain_bert")
    sample = os.path.dirname(c.shards)
    run([bert, "--deck", os.path.join(ROOT, "inputs", "bert_tiny_ci.ini"), "--data.train_shards",
         os.path.join(sample, "kjv_bert_*.h5"), "--data.vocab_file", os.path.join(sample, "bert", "vocab.txt"),
         "--train.iters", "1", "--eval.interval", "0", "--checkpoint.save", c.path("bert_ck")])
    return os.path.exists(c.path("bert_ck", "latest"))


def main():
    names = ["train", "resume", "dp2", "eval", "preempt", "finetune"]
    check_main({n: globals()["check_" + n] for n in names}, Ctx, mpiexec_default="")


if __name__ == "__main__":
    main()
