#!/usr/bin/env python3
"""Fault-injection suite of the pretraining apps (CTest label `faults`).

(One table of cases per group, each a few lines, over one runner; a case is
read where it is declared.)

usage: fault_suite.py GROUP --build BUILD --deck DECK --shards GLOB --work DIR [--mpiexec M]

Every case runs a tiny job (the CI deck, 1, 2 or 4 ranks), injects a fault or a bad input, and
asserts four things:
  1. the exit code (1: error, 3: checkpointed on a signal, 4: signal during start-up, 5: the
     watchdog; 0 where the run must go on, e.g. a fall-back to an older checkpoint);
  2. a message naming the cause (and, for errors, exactly one line starting with 'error');
  3. every rank process of the job has ended within the case's bound (no hang);
  4. no pre-existing file the case protects has changed (sha256 before and after).
Groups:
  inputs      bad decks, shards, checkpoints and tokenizer files: one error at start-up
  outputs     output paths checked before training; no silent overwrite of checkpoints, metrics
              or shards
  corruption  a corrupted checkpoint (checksums; checkpoint.load auto falls back), a shard
              truncated or replaced under a running job, stale temporary files
  numerics    fp16 divergence; NaN checkpoints refused by training and generation
  signals     kill -9 of a rank mid-step and mid-checkpoint (shown to have landed inside the
              write), SIGSTOP of a rank (the watchdog), SIGTERM during start-up
  async       checkpoint.async_save: kill -9 of a rank and SIGTERM while the background writer
              runs; the last complete checkpoint resumes exactly
  disk_full   a full disk on small tmpfs mounts: at start-up and between two checkpoints at np=2
              and np=4, during a collective dump at np=4, under the TensorBoard files (a warning,
              training goes on), during a background checkpoint write. A tmpfs mount needs root:
              where it is refused the group exits 77 (CTest's skip) with the reason, before any case
The summary line of each group gives its count of cases and outcomes (docs/reliability.md).
"""
import argparse
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from testlib import run, trident_checksum  # noqa: E402

QUICK = ["--eval.interval", "0", "--log.interval", "1"]


def digest(path):
    h = hashlib.sha256()
    if os.path.isfile(path):
        with open(path, "rb") as f:
            h.update(f.read())
        return h.hexdigest()
    for root, dirs, files in sorted(os.walk(path)):
        dirs.sort()
        for f in sorted(files):
            with open(os.path.join(root, f), "rb") as fh:
                h.update(os.path.relpath(os.path.join(root, f), path).encode() + fh.read())
    return h.hexdigest()


def metric_rows(path):
    try:
        with open(path) as f:
            return max(0, sum(1 for _ in f) - 1)
    except OSError:
        return 0


class Job:
    """A running job: its output as it arrives, its rank processes (found by a marker in their
    environment), and waits on both."""

    def __init__(self, cmd, marker):
        self.marker = marker
        env = dict(os.environ, TRIDENT_FAULT_CASE=marker)
        self.t0 = time.time()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     start_new_session=True)
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self):
        return "".join(self.lines)

    def ranks(self):
        """pids of this job's processes that are not mpiexec (the ranks)."""
        out = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if f"TRIDENT_FAULT_CASE={self.marker}".encode() not in f.read().split(b"\0"):
                        continue
                exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
            except OSError:
                continue
            if not exe.startswith(("mpiexec", "hydra", "python", "bash", "sh")):
                out.append(int(pid))
        return sorted(out)

    def rank_pid(self, rank):
        """pid of the job's rank `rank` (by the PMI_RANK that MPICH's launcher gives it)."""
        for pid in self.ranks():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if f"PMI_RANK={rank}".encode() in f.read().split(b"\0"):
                        return pid
            except OSError:
                continue
        raise CaseError(f"no process of rank {rank}")

    def wait_until(self, predicate, timeout, what):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if predicate():
                return
            if self.proc.poll() is not None:
                raise CaseError(f"the job ended before {what}:\n" + self.output()[-3000:])
            time.sleep(0.002)
        raise CaseError(f"timed out waiting for {what}")

    def wait_line(self, needle, timeout=120):
        self.wait_until(lambda: any(needle in l for l in self.lines), timeout, repr(needle))

    def kill_all(self):
        for pid in self.ranks():
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass


class CaseError(Exception):
    pass


class Suite:
    def __init__(self, a):
        self.a = a
        self.work = a.work
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        self.results = []
        self.sample = os.path.dirname(a.shards)
        self.counter = 0

    def app(self, name):
        return os.path.join(self.a.build, "apps", name)

    def cmd(self, np_, *extra, app="pretrain_gpt", deck=True):
        base = [self.app(app)] + (["--deck", self.a.deck, "--data.train_shards", self.a.shards] if deck else [])
        return [self.a.mpiexec, "-n", str(np_)] + base + list(extra)

    def path(self, *p):
        return os.path.join(self.work, *p)

    def case(self, name, cmd, rc, needle, bound=60, protect=(), during=None, after=None, errors=1):
        """Runs one case (see the module's docstring). rc: an int or a tuple of accepted codes, or
        'nonzero'; needle: a string or a tuple of alternatives that the output must hold; errors:
        the number of lines starting with 'error' (None: not counted)."""
        self.counter += 1
        marker = f"{os.getpid()}-{self.counter}"
        before = {p: digest(p) for p in protect}
        problems = []
        job = Job(cmd, marker)
        try:
            if during:
                during(job)
            job.proc.wait(timeout=max(1.0, bound - (time.time() - job.t0)))
        except subprocess.TimeoutExpired:
            problems.append(f"HUNG: still running after {bound} s")
        except CaseError as e:
            problems.append(f"injection failed: {e}")
        dt = time.time() - job.t0
        # every rank must be gone too (mpiexec may return while a rank lingers)
        t_end = time.time()
        while job.ranks() and time.time() - t_end < 3:
            time.sleep(0.05)
        left = job.ranks()
        if left:
            problems.append(f"{len(left)} rank process(es) still alive after the job ended")
        job.kill_all()
        job.reader.join(timeout=5)
        out = job.output()
        code = job.proc.returncode
        if code is None:
            code = "killed"
        elif rc == "nonzero":
            if code == 0:
                problems.append("exit code 0, expected a failure")
        elif code not in (rc if isinstance(rc, tuple) else (rc,)):
            problems.append(f"exit code {code}, expected {rc}")
        needles = needle if isinstance(needle, tuple) else (needle,)
        if needle and not any(n in out for n in needles):
            problems.append(f"no message with {' or '.join(repr(n) for n in needles)}")
        error_lines = [l.strip() for l in out.splitlines() if l.startswith("error")]
        if errors is not None and len(error_lines) != errors:
            problems.append(f"{len(error_lines)} error lines, expected {errors}")
        changed = [p for p in protect if digest(p) != before[p]]
        if changed:
            problems.append(f"pre-existing files changed: {changed}")
        if after and not problems:
            try:
                problems += after(out) or []
            except (CaseError, AssertionError, OSError) as e:
                problems.append(f"after-check: {e}")
        ok = not problems
        shown = error_lines[0] if error_lines else next(
            (l.strip() for l in reversed(out.splitlines()) if any(n in l for n in needles if n)), out.strip()[-160:])
        print(f"{'ok  ' if ok else 'FAIL'} {name:58s} rc={code!s:>6} {dt:5.1f}s  {shown[:230]}")
        if not ok:
            print("     " + "\n     ".join(problems))
            print("     output tail:\n" + "\n".join("       " + l for l in out.splitlines()[-25:]))
        self.results.append((name, ok, code, dt))
        return out

    def summary(self, group):
        n = len(self.results)
        bad = [r[0] for r in self.results if not r[1]]
        slowest = max((r[3] for r in self.results), default=0)
        print(f"fault suite [{group}]: {n} cases, {n - len(bad)} passed, {len(bad)} failed "
              f"(0 hangs, 0 silent corruptions, 0 changed files required); slowest {slowest:.1f} s")
        if bad:
            raise SystemExit("failed: " + ", ".join(bad))


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------

def fill_disk(path):
    """Writes zeros to `path` until its file system is full. Unbuffered: a buffered file would keep
    the bytes that did not fit and raise ENOSPC again when closed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        block = b"\0" * 65536
        while True:
            os.write(fd, block)
    except OSError:
        pass
    finally:
        os.close(fd)


def good_run(s, np_, *extra):
    run(s.cmd(np_, *QUICK, *extra), timeout=300)


def h5_shard(path, tokens, offsets, version=1, **attrs):
    """A token shard written with h5py, as a user's own tool would."""
    import h5py
    import numpy as np
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "trident.tokens"
        f.attrs["tokenizer"] = "GPT2BPETokenizer"
        for k, v in dict(dict(format_version=version, vocab_size=50257, eod_id=50256), **attrs).items():
            f.attrs[k] = np.int64(v)
        if tokens is not None:
            f.create_dataset("tokens", data=tokens)
        f.create_dataset("document_offsets", data=np.array(offsets, dtype=np.int64))


def copy_shards(s, name):
    d = s.path(name)
    os.makedirs(d)
    for f in sorted(glob.glob(s.a.shards)):
        shutil.copy(f, d)
    return sorted(glob.glob(os.path.join(d, "*.h5")))


def resign(path, name):
    """Rewrites the checksum attribute of dataset `name` for its current values (to get past
    the checksum to the check behind it)."""
    import h5py
    with h5py.File(path, "r+") as f:
        f[name].attrs["checksum"] = trident_checksum(f[name][...])


FRESH = QUICK + ["--train.iters", "2"]  # a fresh two-iteration run


def not_started(out):
    """An after-check: the error came before the first training step."""
    return ["training ran before the error"] if any(l.startswith(" iter ") for l in out.splitlines()) else []


# ------------------------------------------------------------------------------------------
# groups
# ------------------------------------------------------------------------------------------

def group_inputs(s):
    import numpy as np
    ck, m = s.path("ck"), s.path("m.csv")
    good_run(s, 1, "--train.iters", "2", "--checkpoint.save", ck, "--log.metrics_file", m)
    keep = (ck, m)
    junk = s.path("junk.h5")
    with open(junk, "w") as f:
        f.write("this is not HDF5\n")
    no_tokens, bad_offsets, big_token, big_max = (s.path(n) for n in ("a.h5", "b.h5", "c.h5", "d.h5"))
    h5_shard(no_tokens, None, [0, 3])
    h5_shard(bad_offsets, np.arange(10, dtype=np.uint16), [0, 7, 5, 10])
    h5_shard(big_token, np.array([5, 6, 60000, 7], dtype=np.uint16), [0, 4])  # version 1: scanned on open
    h5_shard(big_max, np.array([5, 6, 7, 8], dtype=np.uint16), [0, 4], version=2, max_token_id=50257)
    # one tokenizer per run: a shard of another tokenizer ("other", 1000 tokens), and a GPT-2 shard
    # whose files' digest is not that of the deck's vocabulary files
    other_tok, other_files = s.path("other_tok.h5"), s.path("other_files.h5")
    h5_shard(other_tok, np.arange(64, dtype=np.uint16) % 1000, [0, 32, 64], version=2, max_token_id=63,
             vocab_size=1000, eod_id=999)
    h5_shard(other_files, np.arange(64, dtype=np.uint16), [0, 32, 64], version=3, max_token_id=63)
    # packed documents need the end-of-document id, and this shard records none
    no_eod = s.path("no_eod.h5")
    h5_shard(no_eod, np.arange(64, dtype=np.uint16), [0, 32, 64], version=2, max_token_id=63, eod_id=-1)
    # instruction fine-tuning inputs
    good_sft, bad_sft, no_answer = s.path("good_sft.jsonl"), s.path("bad_sft.jsonl"), s.path("no_answer.jsonl")
    record = '{"prompt": "Continue the verse: In the beginning God", "response": "created the heaven and the earth."}\n'
    with open(good_sft, "w") as f:
        f.write(record * 4)
    with open(bad_sft, "w") as f:
        f.write(record * 2 + '{"prompt": "unterminated\n')
    with open(no_answer, "w") as f:
        f.write('{"messages": [{"role": "user", "content": "a question"}]}\n')
    edited = s.path("edited_template")
    os.makedirs(edited, exist_ok=True)
    with open(os.path.join(s.sample, "hf", "llama3", "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["chat_template"] += " "
    with open(os.path.join(edited, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    shutil.copy(os.path.join(s.sample, "hf", "llama3", "tokenizer.json"), edited)

    def sft(path, *extra, shards=False, model=os.path.join(s.sample, "hf", "llama3")):
        return (([] if shards else ["--data.train_shards="]) +
                ["--sft.train_data", path, "--data.tokenizer_type", "HuggingFaceTokenizer",
                 "--data.tokenizer_model", model, "--eval.interval", "0"] + list(extra))
    import h5py
    with h5py.File(other_tok, "r+") as f:
        f.attrs["tokenizer"] = "other"
    with h5py.File(other_files, "r+") as f:
        f.attrs["tokenizer_digest"] = "0" * 64
    gpt2 = ["--data.vocab_file", os.path.join(s.sample, "gpt2", "encoder.json"), "--data.merges_file",
            os.path.join(s.sample, "gpt2", "vocab.bpe")]
    with open(s.a.deck) as f:
        deck = f.readlines()
    def deck_without(key, name):
        p = s.path(name)
        with open(p, "w") as g:
            g.write("".join(l for l in deck if not l.strip().startswith(key)))
        return p
    cases = [
        ("unknown deck key", 1, ["--model.num_layerz", "3"], "model.num_layerz"),
        ("bad deck value", 1, ["--train.iters", "many"], "train.iters"),
        ("bad deck choice", 2, ["--optim.decay_style", "exp"], "optim.decay_style"),
        ("heads do not divide hidden", 2, ["--model.num_heads", "5"], "model.num_heads"),
        ("batch does not divide over dp", 2, ["--train.global_batch_size", "2"], "train.global_batch_size"),
        ("train.iters missing", 1, ["--deck", deck_without("iters", "no_iters.ini")], "train.iters is required"),
        ("model.num_layers missing", 2, ["--deck", deck_without("num_layers", "no_layers.ini")],
         "model.num_layers is required"),
        ("deck is a directory", 1, ["--deck", s.work], "is a directory"),
        ("missing shard", 2, ["--data.train_shards", s.path("nothing_*.h5")], "matches no file"),
        ("shard is not HDF5", 2, ["--data.train_shards", junk], "junk.h5"),
        ("shard without /tokens", 2, ["--data.train_shards", no_tokens], "/tokens"),
        ("shard with decreasing offsets", 2, ["--data.train_shards", bad_offsets], "document_offsets decreases"),
        ("token id beyond the vocabulary (found on open)", 2, ["--data.train_shards", big_token],
         "holds token id 60000, outside its vocabulary"),
        ("max_token_id beyond the vocabulary", 2, ["--data.train_shards", big_max],
         "holds token id 50257, outside its vocabulary"),
        ("vocab_size mismatch", 2, ["--model.vocab_size", "1000"], "vocab_size"),
        ("shard of another tokenizer than the deck's", 2, ["--data.train_shards", other_tok] + gpt2,
         "was tokenized with other (vocabulary 1000), but the deck names data.vocab_file and data.merges_file"),
        ("shard of other tokenizer files than the deck's", 2, ["--data.train_shards", other_files] + gpt2,
         "one tokenizer per run"),
        ("packed documents without an end-of-document id", 2,
         ["--data.train_shards", no_eod, "--data.reset_attention_mask", "true"],
         "need the corpus's end-of-document token, and the shards record none"),
        # instruction fine-tuning data (sft.train_data): each problem named with its file and line
        ("sft records and shards both given", 2, sft(good_sft, shards=True), "sft.train_data and data.train_shards"),
        ("sft file missing", 2, sft(s.path("no_such.jsonl")), "no_such.jsonl' (no such file)"),
        ("sft record that is not JSON", 2, sft(bad_sft), "bad_sft.jsonl line 3: invalid JSON"),
        ("sft record without an assistant turn", 2, sft(no_answer), "line 1: the conversation has no assistant turn"),
        ("sft conversation longer than the sequence", 2, sft(good_sft, "--model.seq_length", "16"),
         "line 1: the conversation has"),
        ("sft with a tokenizer without a chat template", 2, sft(good_sft, model=os.path.join(s.sample, "hf", "llama2")),
         "has no chat_template string"),
        ("sft with an unknown chat template", 2, sft(good_sft, model=edited), "unknown chat template (sha256 "),
        ("sft evaluations without held-out records", 2, sft(good_sft, "--eval.interval", "5"),
         "eval.interval > 0 but sft.valid_data names no held-out records"),
        # mixture of experts ([moe]): each bad key named with its value
        ("MoE top-k above the experts", 2, ["--moe.num_experts", "2", "--moe.router_topk", "3"],
         "moe.router_topk = 3 must be in [1, moe.num_experts = 2]"),
        ("MoE layer list of another length", 2, ["--moe.num_experts", "4", "--moe.layer_freq", "[1,0,1]"],
         "moe.layer_freq = '[1,0,1]': the list has 3 entries for model.num_layers"),
        ("MoE unknown score function", 2, ["--moe.num_experts", "4", "--moe.router_score_function", "relu"],
         "moe.router_score_function = 'relu' is not one of sigmoid softmax"),
        ("dense checkpoint loaded as MoE", 2, ["--moe.num_experts", "4", "--checkpoint.load", ck, "--train.iters", "4"],
         "moe.num_experts"),
        ("checkpoint of another shape", 2, ["--model.hidden_size", "32", "--checkpoint.load", ck], "model.hidden_size"),
        ("checkpoint with more layers", 2, ["--model.num_layers", "1", "--checkpoint.load", ck, "--train.iters", "4"],
         "holds another model"),
        ("checkpoint with other heads", 2, ["--model.num_heads", "2", "--checkpoint.load", ck, "--train.iters", "4"],
         "model.num_heads"),
        ("checkpoint of another normalisation", 2,
         ["--model.normalization", "RMSNorm", "--checkpoint.load", ck, "--train.iters", "4"], "model.normalization"),
        ("checkpoint of another norm epsilon", 2,
         ["--model.norm_epsilon", "1e-6", "--checkpoint.load", ck, "--train.iters", "4"], "model.norm_epsilon"),
        ("checkpoint of another position encoding", 2,
         ["--model.position_embedding_type", "rope", "--checkpoint.load", ck, "--train.iters", "4"],
         "model.position_embedding_type"),
        ("unknown normalisation", 2, ["--model.normalization", "BatchNorm"],
         "model.normalization = 'BatchNorm' is not one of the layer's modules (LayerNorm, RMSNorm)"),
        ("evaluation of a checkpoint with other heads", 2,
         ["--model.num_heads", "2", "--checkpoint.load", ck, "--eval.only", "true",
          "--eval.shard", sorted(glob.glob(s.a.shards))[0], "--eval.windows", "4"], "model.num_heads"),
        ("missing checkpoint", 2, ["--checkpoint.load", s.path("nope")], "does not exist"),
        ("parameter dump at iteration 0", 2, ["--debug.dump_params", s.path("pd"), "--debug.dump_params_iters", "1,0"],
         "debug.dump_params_iters: '0' is not an iteration number"),
        ("dropout tape of a two-rank run", 2, ["--debug.dump_dropout", s.path("tape.h5")],
         "debug.dump_dropout records the masks of a one-rank run"),
    ]
    for name, np_, extra, needle in cases:
        s.case(name, s.cmd(np_, *QUICK, *extra), 1, needle, bound=60, protect=keep)
    s.case("no deck", [s.a.mpiexec, "-n", "1", s.app("pretrain_gpt")], 1, "--deck", protect=keep)
    s.case("finished run says so and exits 0", s.cmd(2, *QUICK, "--train.iters", "2", "--checkpoint.load", ck), 0,
           "nothing left to train", protect=keep, errors=0)
    # a merges file cut at a line boundary: it parses, but tokenizes differently
    bpe = os.path.join(s.sample, "gpt2", "vocab.bpe")
    cut = s.path("cut.bpe")
    with open(bpe, encoding="utf-8") as f, open(cut, "w", encoding="utf-8") as g:
        g.write("".join(f.readlines()[:30001]))
    text = s.path("t.jsonl")
    with open(text, "w") as f:
        f.write('{"text": "In the beginning"}\n')
    s.case("merges file cut at a line boundary", s.cmd(
        2, "--input", text, "--output-prefix", s.path("pp", "x"), "--tokenizer-type", "GPT2BPETokenizer",
        "--vocab-file", os.path.join(s.sample, "gpt2", "encoder.json"), "--merge-file", cut, app="preprocess_data",
        deck=False), 1, "the merges file is truncated", protect=(bpe,))


def group_outputs(s):
    ck, m = s.path("ck"), s.path("m.csv")
    good_run(s, 2, "--train.iters", "2", "--checkpoint.save", ck, "--log.metrics_file", m)
    keep = (ck, m)
    blocker = s.path("a_file")
    with open(blocker, "w") as f:
        f.write("not a directory\n")
    fresh = FRESH
    cases = [
        ("fresh run into a save directory with checkpoints", 2, ["--checkpoint.save", ck], "already holds checkpoints"),
        ("fresh run onto a metrics file with rows", 2, ["--log.metrics_file", m], "holds output of an earlier run"),
        ("save directory cannot be made", 2, ["--checkpoint.save", os.path.join(blocker, "ck")],
         "cannot create the directory"),
        ("timeline file cannot be made", 2, ["--log.timeline_file", os.path.join(blocker, "t.json")],
         "log.timeline_file"),
        ("memory file cannot be made", 2, ["--log.memory_file", os.path.join(blocker, "m.json")],
         "log.memory_file"),
        ("metrics file is a directory", 2, ["--log.metrics_file", ck], "is a directory"),
        ("TensorBoard directory cannot be made", 2, ["--log.tensorboard_dir", os.path.join(blocker, "tb")],
         "log.tensorboard_dir"),
    ]
    for name, np_, extra, needle in cases:
        s.case(name, s.cmd(np_, *fresh, *extra), 1, needle, protect=keep, after=not_started)
    # met by rank 0 alone (only rank 0 writes metrics): the job still ends within seconds
    s.case("metrics file unwritable, met by rank 0 alone", s.cmd(2, *fresh, "--log.metrics_file",
                                                              os.path.join(blocker, "m.csv")),
           1, "log.metrics_file", bound=30, protect=keep)
    # overwrite: replaced only when asked; missing directories are made
    def replaced(out):
        got = open(os.path.join(ck, "latest")).read().strip()
        return [] if got == "3" and metric_rows(m) == 3 else [f"latest {got}, {metric_rows(m)} metric rows"]
    s.case("checkpoint.overwrite true replaces an earlier run", s.cmd(
        2, *QUICK, "--train.iters", "3", "--checkpoint.save", ck, "--log.metrics_file", m, "--checkpoint.overwrite",
        "true", "--log.timeline_file", s.path("t", "timeline.json")), 0, "saved checkpoint", errors=0, after=replaced)
    deep = s.path("new", "dir", "m.csv")
    s.case("missing output directories are created", s.cmd(1, *QUICK, "--train.iters", "1", "--log.metrics_file", deep),
           0, " iter ", errors=0, after=lambda out: [] if metric_rows(deep) == 1 else ["no metrics row"])
    # resuming from an earlier checkpoint: later metric rows move aside, none is lost
    run(s.cmd(2, *QUICK, "--train.iters", "4", "--checkpoint.save", ck, "--checkpoint.load", "auto",
              "--log.metrics_file", m))
    def superseded(out):
        side = s.path("m.superseded.csv")
        return [] if metric_rows(m) == 4 and metric_rows(side) == 1 else [f"{metric_rows(m)} rows, side file {metric_rows(side)}"]
    s.case("resume from an earlier checkpoint keeps the later metric rows", s.cmd(
        2, *QUICK, "--train.iters", "4", "--checkpoint.load", os.path.join(ck, "iter_0000003"), "--log.metrics_file", m),
        0, "resumed from", errors=0, protect=(os.path.join(ck, "iter_0000003"),), after=superseded)
    # preprocess_data never replaces or deletes shards unless asked to (--overwrite)
    shards = copy_shards(s, "pp")
    prefix = shards[0][:-len("_00000.h5")]
    kjv = os.path.join(s.sample, "kjv.jsonl")
    gpt2 = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", os.path.join(s.sample, "gpt2", "encoder.json"),
            "--merge-file", os.path.join(s.sample, "gpt2", "vocab.bpe"), "--append-eod"]
    s.case("preprocess_data onto existing shards without --overwrite", s.cmd(
        2, "--input", kjv, "--output-prefix", prefix, *gpt2, app="preprocess_data", deck=False), 1,
        "pass --overwrite", protect=tuple(shards))
    empty = s.path("empty.jsonl")
    open(empty, "w").close()
    s.case("preprocess_data --overwrite of an empty input deletes nothing", s.cmd(
        2, "--input", empty, "--output-prefix", prefix, "--overwrite", *gpt2, app="preprocess_data", deck=False), 0,
        "no shard written", protect=tuple(shards), errors=0)


def group_corruption(s):
    import h5py
    import numpy as np
    ck = s.path("ck")
    good_run(s, 2, "--train.iters", "4", "--checkpoint.interval", "2", "--checkpoint.save", ck)
    it2, it4 = (os.path.join(ck, f"iter_000000{i}", "checkpoint.h5") for i in (2, 4))
    # the checksums Trident wrote equal an independent computation (testlib.trident_checksum)
    with h5py.File(it4, "r") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        stored = {n: f[n].attrs["checksum"] for n in names}
        stored = {n: v.decode() if isinstance(v, bytes) else str(v) for n, v in stored.items()}
        bad = [n for n in names if stored[n] != trident_checksum(f[n][...])]
        assert not bad and len(names) > 10, f"checksums differ from the reference for {bad}"
    print(f"checksums of all {len(names)} datasets equal the Python reference")
    # 8 MB overwritten by zeros in the middle of the newest checkpoint
    corrupt = s.path("corrupt")
    shutil.copytree(ck, corrupt)
    with open(os.path.join(corrupt, "iter_0000004", "checkpoint.h5"), "r+b") as f:
        f.seek(12 << 20)
        f.write(b"\0" * (8 << 20))
    keep = (corrupt,)
    s.case("checkpoint with 8 MB of zeros, explicit load", s.cmd(
        2, *QUICK, "--train.iters", "6", "--checkpoint.load", os.path.join(corrupt, "iter_0000004")), 1,
        "corrupt", protect=keep)
    s.case("checkpoint with 8 MB of zeros, generate_gpt", s.cmd(
        1, "--checkpoint", os.path.join(corrupt, "iter_0000004"), "--vocab-file",
        os.path.join(s.sample, "gpt2", "encoder.json"), "--merge-file", os.path.join(s.sample, "gpt2", "vocab.bpe"),
        "--prompt", "In the", "--max-new-tokens", "2", app="generate_gpt", deck=False), 1, "corrupt", protect=keep)
    # a few bytes of one tensor's data zeroed: the structure reads, the checksum names the tensor
    flipped = s.path("flipped.h5")
    shutil.copy(it4, flipped)
    tensor = "optimizer/exp_avg_sq/model/embedding/word_embeddings"
    with h5py.File(flipped, "r") as f:
        offset = f[tensor].id.get_offset()
    with open(flipped, "r+b") as f:
        f.seek(offset + 4096)
        f.write(b"\0" * 64)
    s.case("checkpoint with 64 bytes of one tensor zeroed", s.cmd(
        2, *QUICK, "--train.iters", "6", "--checkpoint.load", flipped), 1,
        f"is corrupt: tensor '{tensor}' fails its checksum", protect=(flipped,))
    def fell_back(out):
        latest = open(os.path.join(corrupt, "latest")).read().strip()
        return [] if latest == "6" else [f"latest is {latest}"]
    s.case("checkpoint.load auto falls back to the newest that verifies", s.cmd(
        2, *QUICK, "--train.iters", "6", "--checkpoint.save", corrupt, "--checkpoint.load", "auto"), 0,
        "falling back to " + os.path.join(corrupt, "iter_0000002"), errors=0,
        protect=(os.path.join(corrupt, "iter_0000002"),), after=fell_back)
    # latest naming a checkpoint that is gone
    gone = s.path("gone")
    shutil.copytree(ck, gone)
    shutil.rmtree(os.path.join(gone, "iter_0000004"))
    s.case("latest names a missing checkpoint: auto uses the newest present", s.cmd(
        2, *QUICK, "--train.iters", "5", "--checkpoint.save", gone, "--checkpoint.load", "auto"), 0,
        "resumed from " + os.path.join(gone, "iter_0000002"), errors=0, protect=(os.path.join(gone, "iter_0000002"),))
    # leftovers of killed saves are removed by the next successful one (the save itself replaces
    # latest.tmp first; then 2 checkpoint.h5.tmp and the directory left empty)
    stale = s.path("stale")
    shutil.copytree(ck, stale)
    os.makedirs(os.path.join(stale, "iter_0000009"))
    for p in (os.path.join(stale, "iter_0000009", "checkpoint.h5.tmp"), os.path.join(stale, "iter_0000002", "checkpoint.h5.tmp"),
              os.path.join(stale, "latest.tmp")):
        with open(p, "w") as f:
            f.write("partial")
    def cleaned(out):
        left = glob.glob(os.path.join(stale, "**", "*.tmp"), recursive=True) + glob.glob(os.path.join(stale, "*.tmp"))
        return [f"left: {left}"] if left or os.path.exists(os.path.join(stale, "iter_0000009")) else []
    s.case("stale temporary files are removed at the next save", s.cmd(
        2, *QUICK, "--train.iters", "5", "--checkpoint.save", stale, "--checkpoint.load", "auto"), 0,
        "removed 3 temporary file(s)", errors=0, protect=(os.path.join(stale, "iter_0000004", "checkpoint.h5"),),
        after=cleaned)
    # shards changed under a running job: truncated, replaced; the job stops before the step
    long_run = QUICK + ["--train.iters", "100000", "--optim.decay_iters", "100000"]
    detected = ("changed while the job reads it", "fails its checksum", "outside the vocabulary")
    for how in ("truncated", "replaced"):
        shards = copy_shards(s, f"shards_{how}")
        m = s.path(f"{how}.csv")
        def inject(job, shards=shards, m=m, how=how):
            job.wait_until(lambda: metric_rows(m) >= 3, 120, "3 iterations")
            f = shards[0]  # one shard of four
            if how == "truncated":
                os.truncate(f, 4096)
            else:
                shutil.copy(shards[-1], f + ".new")
                os.replace(f + ".new", f)
        # a read error met by one rank is agreed at the iteration's shard check: every rank
        # leaves together, rather than one rank aborting the job after the error grace
        s.case(f"shards {how} under a running job", s.cmd(
            2, *long_run, "--data.train_shards", os.path.join(s.path(f"shards_{how}"), "*.h5"), "--log.metrics_file", m),
            1, detected, bound=60, during=inject,
            after=lambda out: ["the job was aborted, not ended together"] if "aborting the job" in out else [])


def group_numerics(s):
    import h5py
    import numpy as np
    ck = s.path("ck")
    def finite_checkpoints(out):
        bad = []
        for f in sorted(glob.glob(os.path.join(ck, "iter_*", "checkpoint.h5"))):
            with h5py.File(f, "r") as h:
                h.visititems(lambda n, o: bad.append(f"{f}:{n}") if isinstance(o, h5py.Dataset) and
                             not np.isfinite(o[...]).all() else None)
        return [f"non-finite tensors: {bad[:3]}"] if bad else []
    s.case("fp16 divergence (lr 1e6) stops as diverged", s.cmd(
        2, *QUICK, "--precision.dtype", "fp16", "--optim.lr", "1e6", "--train.iters", "80", "--checkpoint.save", ck,
        "--checkpoint.interval", "5", "--model.hidden_dropout", "0", "--model.attention_dropout", "0"),
        1, "diverged", bound=300, after=finite_checkpoints)
    s.case("fp32 divergence (lr 1e12) stops as diverged", s.cmd(
        2, *QUICK, "--optim.lr", "1e12", "--train.iters", "80"), 1,
        ("diverged", "not finite"), bound=300)
    # a NaN put into a saved tensor (its checksum rewritten to match): refused, naming the tensor
    good = s.path("good")
    good_run(s, 1, "--train.iters", "2", "--checkpoint.save", good)
    bad = s.path("bad.h5")
    shutil.copy(os.path.join(good, "iter_0000002", "checkpoint.h5"), bad)
    name = "model/layers/0/mlp/fc1/weight"
    with h5py.File(bad, "r+") as f:
        w = f[name][...]
        w.flat[7] = np.nan
        f[name][...] = w
    resign(bad, name)
    s.case("resume from a checkpoint holding a NaN", s.cmd(2, *QUICK, "--train.iters", "4", "--checkpoint.load", bad), 1,
           f"tensor '{name}' holds non-finite values", protect=(bad,))
    s.case("generate from a checkpoint holding a NaN", s.cmd(
        1, "--checkpoint", bad, "--vocab-file", os.path.join(s.sample, "gpt2", "encoder.json"), "--merge-file",
        os.path.join(s.sample, "gpt2", "vocab.bpe"), "--prompt", "In the", "--max-new-tokens", "4", app="generate_gpt",
        deck=False), 1, f"tensor '{name}' holds non-finite values", protect=(bad,))


def group_signals(s):
    long_run = QUICK + ["--train.iters", "100000", "--optim.decay_iters", "100000"]
    # kill -9 of one rank mid-step: the job ends; the last checkpoint resumes
    ck, m = s.path("ck_step"), s.path("step.csv")
    def kill_mid_step(job):
        job.wait_until(lambda: metric_rows(m) >= 12, 120, "12 iterations")
        os.kill(job.ranks()[-1], signal.SIGKILL)
    def resumes(ck):
        def check(out):
            latest = int(open(os.path.join(ck, "latest")).read())
            _, o, _ = run(s.cmd(2, *QUICK, "--train.iters", str(latest + 2), "--checkpoint.save", ck,
                                "--checkpoint.load", "auto"))
            left = glob.glob(os.path.join(ck, "**", "*.tmp"), recursive=True)
            return ([] if f"at iteration {latest}" in o else ["did not resume from latest"]) + \
                   ([f"temporary files left after the next save: {left}"] if left else [])
        return check
    s.case("kill -9 of a rank mid-step", s.cmd(2, *long_run, "--checkpoint.save", ck, "--checkpoint.interval", "5",
                                               "--log.metrics_file", m),
           "nonzero", "", bound=30, errors=None, during=kill_mid_step, after=resumes(ck))
    # kill -9 while a checkpoint is being written: `latest` stays on the previous one. The writes
    # pause half-way (debug.checkpoint_write_pause_s) so that the kill has a window; the case then
    # shows that it landed inside the write (that checkpoint's .tmp file still there just after the
    # kill, never renamed to checkpoint.h5, `latest` not moved to it), so that it cannot pass by
    # killing a job whose save had already finished. A kill that missed is retried (a new save
    # directory, a longer pause); a miss on the last attempt fails the case.
    for attempt, pause in enumerate(("2", "4", "8")):
        ck2, m2 = s.path(f"ck_save{attempt}"), s.path(f"save{attempt}.csv")
        target = {}
        def kill_mid_save(job, ck2=ck2, target=target):
            # a later checkpoint's write, once `latest` names an earlier one
            def writing():
                if not os.path.exists(os.path.join(ck2, "latest")):
                    return False
                tmp = [t for t in glob.glob(os.path.join(ck2, "iter_*", "checkpoint.h5.tmp"))
                       if int(t.split("iter_")[1][:7]) > 3]
                if tmp:
                    target["tmp"] = tmp[0]
                return bool(tmp)
            job.wait_until(writing, 120, "a checkpoint write")
            ranks = job.ranks()
            os.kill(ranks[0], signal.SIGKILL)
            target["at_kill"] = os.path.exists(target["tmp"])
        def landed_mid_write(out, ck2=ck2, target=target):
            tmp = target.get("tmp", "")
            it = int(tmp.split("iter_")[1][:7]) if tmp else -1
            latest = int(open(os.path.join(ck2, "latest")).read())
            missed = []
            if not target.get("at_kill"):
                missed.append(f"{tmp} was gone when the kill landed (the save had ended)")
            if os.path.exists(tmp[:-len(".tmp")]):
                missed.append(f"iteration {it}'s checkpoint was completed")
            if latest >= it:
                missed.append(f"latest moved to {latest}")
            target["missed"] = missed
            return missed or resumes(ck2)(out)
        name = "kill -9 of a rank mid-checkpoint" + (f" (retry {attempt}: pause {pause} s)" if attempt else "")
        before = len(s.results)
        s.case(name, s.cmd(2, *long_run, "--checkpoint.save", ck2, "--checkpoint.interval", "3",
                           "--log.metrics_file", m2, "--debug.checkpoint_write_pause_s", pause),
               "nonzero", "", bound=40, errors=None, during=kill_mid_save, after=landed_mid_write)
        if not target.get("missed"):
            break
        print(f"     the kill missed the write: {'; '.join(target['missed'])}"
              + ("; retried (this attempt does not count)" if attempt < 2 else ""))
        if attempt < 2:
            del s.results[before:]  # retried; the last attempt's outcome counts
    else:
        print("     FAIL: no attempt killed the rank inside a checkpoint write")
    # SIGSTOP of one rank (a stuck node): the watchdog of the other ends the job, exit 5
    ck3, m3 = s.path("ck_stop"), s.path("stop.csv")
    good_run(s, 2, "--train.iters", "2", "--checkpoint.save", ck3)
    def stop_rank(job):
        job.wait_until(lambda: metric_rows(m3) >= 8, 120, "8 iterations")
        os.kill(job.ranks()[-1], signal.SIGSTOP)
    s.case("SIGSTOP of a rank: the watchdog ends the job", s.cmd(
        2, *long_run, "--checkpoint.save", ck3, "--checkpoint.load", "auto", "--log.metrics_file", m3,
        "--watchdog.min_s", "3", "--watchdog.warmup_iters", "3", "--watchdog.startup_s", "60"),
        5, "past its deadline", bound=40, errors=None, during=stop_rank,
        protect=(os.path.join(ck3, "iter_0000002"),))
    # SIGTERM during start-up (here: while the data index of a long run is built), sent to every
    # rank as Slurm signals a job step's tasks: rank 0's message, exit 4. Then sent to rank 1 only,
    # without checkpoint.save: after its grace of up to 2 s it names itself and exits 4 (and the
    # launcher kills the other: MPICH's mpiexec then reports whichever status it collects, 4 or the
    # peer's SIGKILL 9), or, where the training loop started meanwhile, the loop stops every rank
    # at its next iteration boundary with its own message; either way one message and a failure.
    ck4 = s.path("ck_start")
    good_run(s, 2, "--train.iters", "2", "--checkpoint.save", ck4)
    def term_at_start(job):
        job.wait_line("Topology: world", 60)
        for pid in job.ranks():
            os.kill(pid, signal.SIGTERM)
    s.case("SIGTERM during start-up", s.cmd(2, *QUICK, "--train.iters", "2000000", "--optim.decay_iters", "2000000",
                                            "--checkpoint.save", ck4, "--checkpoint.load", "auto"),
           4, "during start-up", bound=30, errors=0, during=term_at_start, protect=(ck4,),
           after=lambda out: ["training ran"] if any(l.startswith(" iter ") for l in out.splitlines()) else [])
    def term_one_at_start(job):
        job.wait_line("Topology: world", 60)
        os.kill(job.rank_pid(1), signal.SIGTERM)
    def one_message(out):
        n = sum("received SIGTERM" in l for l in out.splitlines())
        return [] if n == 1 else [f"{n} messages about the signal, expected 1"]
    s.case("SIGTERM of one rank during start-up", s.cmd(2, *QUICK, "--train.iters", "2000000", "--optim.decay_iters",
                                                        "2000000"),
           "nonzero", ("rank 1 received SIGTERM outside the training loop", "received SIGTERM: stopping after"),
           bound=30, errors=0, during=term_one_at_start, after=one_message)


# checkpoint.async_save's cases (group async; its disk-full case in group disk_full): the background
# writer paused half-way for a few seconds (debug.checkpoint_write_pause_s), the window the
# injections aim at; one learning-rate schedule and one data order (the dataset's index follows the
# samples that train.iters asks for) for every run: 12 iterations, however far each run gets
ASYNC_PAUSE = ["--debug.checkpoint_write_pause_s", "3"]
ASYNC_SCHED = ["--optim.decay_iters", "12"]


def async_reference(s):
    """iteration -> loss of 12 iterations straight through (synchronous saves)"""
    ref_m = s.path("async_ref.csv")
    good_run(s, 2, *ASYNC_SCHED, "--train.iters", "12", "--log.metrics_file", ref_m)
    return losses(ref_m)


def resumes_exactly(s, ref, ck, at):
    """An after-check: `latest` is `at`; a resumed run from it to 12 gives the reference's losses bit
    for bit and leaves no temporary file."""
    def check(out):
        latest = int(open(os.path.join(ck, "latest")).read())
        if latest != at:
            return [f"latest is {latest}, not {at}"]
        m = s.path(f"resumed_{os.path.basename(ck)}.csv")
        _, o, _ = run(s.cmd(2, *QUICK, *ASYNC_SCHED, "--train.iters", "12", "--checkpoint.save", ck,
                            "--checkpoint.load", "auto", "--checkpoint.async_save", "true", "--log.metrics_file", m))
        got = losses(m)
        want = {it: v for it, v in ref.items() if it > at}
        problems = [] if f"at iteration {at}" in o else [f"did not resume from iteration {at}"]
        if got != want:
            problems.append(f"resumed losses differ from the uninterrupted run: {got} vs {want}")
        left = glob.glob(os.path.join(ck, "**", "*.tmp"), recursive=True)
        return problems + ([f"temporary files left after the next save: {left}"] if left else [])
    return check


def async_writing(ck, it):
    """the background write of iteration it's checkpoint has begun"""
    return lambda: os.path.exists(os.path.join(ck, f"iter_{it:07d}", "checkpoint.h5.tmp"))


def async_start(s, ck):
    """a synchronous checkpoint of iteration 3 to resume from; returns what must stay unchanged"""
    good_run(s, 2, *ASYNC_SCHED, "--train.iters", "3", "--checkpoint.save", ck)
    return (os.path.join(ck, "iter_0000003"), os.path.join(ck, "latest"))


def group_async(s):
    """checkpoint.async_save: faults while the background writer runs. The previous checkpoint and
    `latest` must stay as they were and resume exactly."""
    pause, sched = ASYNC_PAUSE, ASYNC_SCHED
    ref = async_reference(s)
    # an asynchronous checkpoint holds the tensors of a synchronous one of the same step, bit for bit
    # (dp 2, ZeRO-1: every rank writes its shard)
    import h5py
    import numpy as np
    files = {}
    for mode in ("false", "true"):
        ck = s.path(f"ck_async_same_{mode}")
        good_run(s, 2, *sched, "--train.iters", "6", "--checkpoint.save", ck, "--checkpoint.interval", "3",
                 "--checkpoint.async_save", mode)
        files[mode] = os.path.join(ck, "iter_0000006", "checkpoint.h5")
    with h5py.File(files["false"], "r") as a, h5py.File(files["true"], "r") as b:
        names = []
        a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        differ = [n for n in names if n not in b or not np.array_equal(a[n][()], b[n][()])
                  or a[n].attrs["checksum"] != b[n].attrs["checksum"]]
    print(f"{'ok  ' if names and not differ else 'FAIL'} asynchronous and synchronous checkpoints of iteration 6: "
          f"{len(names)} tensors, {len(differ)} differ {differ[:3]}")
    s.results.append(("asynchronous checkpoint = synchronous one", bool(names) and not differ, 0, 0.0))

    # kill -9 of one rank (a rank failure) while the background writer writes iteration 6's file
    ck = s.path("ck_async_kill")
    keep = async_start(s, ck)
    def kill_mid_write(job):
        job.wait_until(async_writing(ck, 6), 120, "the background write of iteration 6")
        job.wait_line("writing it in the background", 30)
        os.kill(job.ranks()[-1], signal.SIGKILL)
    s.case("kill -9 of a rank during a background checkpoint write", s.cmd(
        2, *QUICK, *pause, "--train.iters", "12", *sched, "--checkpoint.save", ck,
        "--checkpoint.load", "auto", "--checkpoint.interval", "3", "--checkpoint.async_save", "true"),
        "nonzero", "", bound=30, errors=None, protect=keep, during=kill_mid_write, after=resumes_exactly(s, ref, ck, 3))

    # SIGTERM (Slurm's time limit, to every rank) while iteration 6's file is written: the signal's
    # checkpoint waits for it, then writes its own; exit 3 and both are complete (`latest` moves
    # on; iteration 3's checkpoint stays as it was)
    ck = s.path("ck_async_term")
    keep = async_start(s, ck)
    def term_mid_write(job):
        job.wait_until(async_writing(ck, 6), 120, "the background write of iteration 6")
        for pid in job.ranks():
            os.kill(pid, signal.SIGTERM)
    def term_checks(out):
        latest = int(open(os.path.join(ck, "latest")).read())
        if latest < 6 or not os.path.exists(os.path.join(ck, "iter_0000006", "checkpoint.h5")):
            return [f"latest is {latest}; iteration 6's checkpoint complete: "
                    f"{os.path.exists(os.path.join(ck, 'iter_0000006', 'checkpoint.h5'))}"]
        return resumes_exactly(s, ref, ck, latest)(out) if latest < 12 else [f"the run was not stopped early (latest {latest})"]
    s.case("SIGTERM during a background checkpoint write", s.cmd(
        2, *QUICK, *pause, "--train.iters", "12", *sched, "--checkpoint.save", ck,
        "--checkpoint.load", "auto", "--checkpoint.interval", "3", "--checkpoint.async_save", "true"),
        3, "with a checkpoint in", bound=40, errors=0, protect=keep[:1], during=term_mid_write, after=term_checks)


def tmpfs_refused(where):
    """Why a tmpfs cannot be mounted here (None when it can): the disk-full cases need one."""
    os.makedirs(where, exist_ok=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", where], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        return (f"mount -t tmpfs exited {p.returncode} ({p.stdout.strip() or 'no message'}); a tmpfs mount needs "
                f"root (CAP_SYS_ADMIN)")
    subprocess.run(["umount", where])
    return None


def group_disk_full(s):
    """A full disk, on tmpfs mounts of a few MiB (root): at start-up and between two checkpoints at
    np=2 and 4, during a collective dump at np=4, under the TensorBoard files (a warning, training
    goes on), and during a background checkpoint write. Exit 77 with the reason, before any case,
    where a tmpfs cannot be mounted."""
    refused = tmpfs_refused(s.path("probe"))
    if refused:
        print(f"SKIPPED (77): the disk-full cases need a tmpfs mount: {refused}")
        raise SystemExit(77)
    ck, m = s.path("ck"), s.path("m.csv")
    good_run(s, 2, "--train.iters", "2", "--checkpoint.save", ck, "--log.metrics_file", m)
    keep = (ck, m)
    fresh = FRESH
    # a tmpfs of 2 MiB (no room for one 38 MiB checkpoint) and of 60 MiB (room for one)
    tmpfs = s.path("small_disk")
    os.makedirs(tmpfs)
    def mount(size):
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", tmpfs],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0:  # a tmpfs mounted a moment ago (tmpfs_refused): a failure now
            raise SystemExit(f"FAILED: mount -t tmpfs -o size={size}: {p.stdout.strip()}")
    mount("2m")
    try:
        for np_ in (2, 4):
            s.case(f"disk full at start-up, np={np_}", s.cmd(np_, *fresh, "--train.global_batch_size", str(2 * np_),
                                                             "--checkpoint.save",
                                                             os.path.join(tmpfs, f"ck{np_}")),
                   1, "disk full", protect=keep, after=not_started)
        # the TensorBoard directory's disk fills during the run: reported once, training goes on
        filler = os.path.join(tmpfs, "filler")
        fill_disk(filler)
        os.truncate(filler, max(0, os.path.getsize(filler) - 8192))  # 8 KiB left: the deck and a few steps
        m_tb = s.path("m_tb.csv")
        def trained_on(out):
            rows = metric_rows(m_tb)
            return [] if rows == 20 else [f"the metrics file has {rows} rows, not 20"]
        s.case("TensorBoard disk fills mid-run: a warning, training goes on", s.cmd(
            1, *QUICK, "--train.iters", "20", "--log.tensorboard_dir", os.path.join(tmpfs, "tb"),
            "--log.histogram_interval", "1", "--log.metrics_file", m_tb),
            0, "warning: log.tensorboard_dir: writing", errors=0, protect=keep, after=trained_on)
        subprocess.run(["umount", tmpfs])
        mount("60m")
        for np_ in (2, 4):
            ck2 = os.path.join(tmpfs, f"ck{np_}")
            def loadable(out, ck2=ck2):
                latest = open(os.path.join(ck2, "latest")).read().strip()
                if latest != "2":
                    return [f"after the disk filled, latest is {latest!r}, not 2"]
                run(s.cmd(1, *QUICK, "--train.iters", "2", "--checkpoint.load", ck2))
                return []
            s.case(f"disk fills between two checkpoints, np={np_}", s.cmd(
                np_, *QUICK, "--train.iters", "6", "--checkpoint.interval", "2", "--checkpoint.save", ck2,
                "--train.global_batch_size", str(2 * np_)),
                1, "disk full", protect=keep, after=loadable)
            shutil.rmtree(ck2, ignore_errors=True)
        # the disk fills while the ranks write a file together (the step-1 gradients, parallel
        # HDF5, pp 2 x dp 2): the ranks whose writes fail must end the job, not wait in the
        # file's collective close for ranks already in the next dataset (a hang before)
        subprocess.run(["umount", tmpfs])
        mount("45m")
        ck3 = os.path.join(tmpfs, "ck_dump")
        def initial_kept(out):
            if open(os.path.join(ck3, "latest")).read().strip() != "0":
                return ["the initial checkpoint is not the latest one"]
            run(s.cmd(1, *QUICK, "--train.iters", "1", "--checkpoint.load", ck3))
            return []
        s.case("disk fills during a collective dump, np=4 (pp 2)", s.cmd(
            4, *QUICK, "--train.iters", "2", "--parallel.pp", "2", "--checkpoint.save", ck3,
            "--checkpoint.save_initial", "true", "--debug.dump_grads", os.path.join(tmpfs, "grads.h5"),
            "--train.global_batch_size", "4"),
            1, "disk full", bound=30, protect=keep, after=initial_kept)
        # the same with experts (moe_tiny, pp 2 x ep 2): there the ranks' flushes of the open
        # file part on a full disk, so the job must not close it at MPI_Finalize either
        subprocess.run(["umount", tmpfs])
        mount("90m")
        moe_deck = os.path.join(os.path.dirname(os.path.dirname(HERE)), "validation", "moe_tiny", "deck.ini")
        s.case("disk fills during a collective dump, np=4 (pp 2, ep 2)", s.cmd(
            4, "--deck", moe_deck, "--data.train_shards", s.a.shards, *QUICK, "--train.iters", "2",
            "--parallel.pp", "2", "--parallel.ep", "2", "--checkpoint.save", os.path.join(tmpfs, "ck_moe"),
            "--checkpoint.save_initial", "true", "--debug.dump_grads", os.path.join(tmpfs, "grads_moe.h5"),
            deck=False), 1, "disk full", bound=30, protect=keep)
    finally:
        subprocess.run(["umount", tmpfs])

    # the disk fills during the background write of checkpoint.async_save: one error naming it,
    # the job ends, its .tmp file is gone and the previous checkpoint resumes exactly
    ref = async_reference(s)
    tmpfs = s.path("async_disk")
    os.makedirs(tmpfs)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=90m", "tmpfs", tmpfs], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise SystemExit(f"FAILED: mount -t tmpfs -o size=90m: {p.stdout.strip()}")
    try:
        ck = os.path.join(tmpfs, "ck")
        keep = async_start(s, ck)
        filler = os.path.join(tmpfs, "filler")
        def fill_mid_write(job):
            job.wait_until(async_writing(ck, 6), 120, "the background write of iteration 6")
            fill_disk(filler)
        def full_checks(out):
            left = glob.glob(os.path.join(ck, "**", "*.tmp"), recursive=True)
            os.remove(filler)
            return ([f"temporary files left: {left}"] if left else []) + resumes_exactly(s, ref, ck, 3)(out)
        s.case("disk full during a background checkpoint write", s.cmd(
            2, *QUICK, *ASYNC_PAUSE, "--train.iters", "12", *ASYNC_SCHED, "--checkpoint.save", ck,
            "--checkpoint.load", "auto", "--checkpoint.interval", "3", "--checkpoint.async_save", "true"),
            1, "disk full", bound=40, protect=keep, during=fill_mid_write, after=full_checks)
    finally:
        subprocess.run(["umount", tmpfs])


def losses(path):
    """iteration -> the loss column's text, from a metrics file"""
    with open(path) as f:
        head = f.readline().strip().split(",")
        it, lo = head.index("iteration"), head.index("loss")
        return {int(r[it]): r[lo] for r in (l.strip().split(",") for l in f) if r and r[0]}


GROUPS = {"inputs": group_inputs, "outputs": group_outputs, "corruption": group_corruption,
          "numerics": group_numerics, "signals": group_signals, "async": group_async,
          "disk_full": group_disk_full}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("group", choices=sorted(GROUPS) + ["all"])
    p.add_argument("--build", required=True)
    p.add_argument("--deck", required=True)
    p.add_argument("--shards", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--mpiexec", default="mpiexec")
    a = p.parse_args()
    s = Suite(a)
    for g in (sorted(GROUPS) if a.group == "all" else [a.group]):
        GROUPS[g](s)
    s.summary(a.group)


if __name__ == "__main__":
    main()
